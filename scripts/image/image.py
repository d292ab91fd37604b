#!/usr/bin/env python3
"""`make image`: cni-dra's image as an OCI archive, built on this machine from Debian's
packages and PyPI (through the venv) only, no registry, reproducibly (README "Image").

usage: image.py --venv VENV --out-dir DIR --name NAME --tag TAG --version VERSION [--cache DIR]

  /opt/cni/bin/cni-dra       the compiled client (scripts/cni-dra-client.c, static)
  /opt/cni/bin/cni-dra.d/    the plugin tree (scripts/image/tree.py)
  /usr/local/bin/cni-dra     a link to the client: the agent and the CLI by name
  /bin/busybox, /bin/sh ...  Debian's busybox-static: the shell and file tools the
                             DaemonSet's init container runs to copy the plugin onto the node
  /tmp                       (1777)

Two layers: first busybox, /tmp and the part of the tree that does not change with
cni-dra's code (interpreter, libraries, standard library, dependencies), with mtime 0 and
kept in the cache; then cni-dra's own package, the entry, the client and the link. Every
other timestamp is SOURCE_DATE_EPOCH (default: the commit time of HEAD). Prints the
archive's path, the image's name:tag and its manifest digest.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import oci
import tree

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent
BUSYBOX_APPLETS = ("sh", "cat", "chmod", "cp", "ln", "ls", "mkdir", "mv", "rm", "test", "[")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", required=True, type=Path)
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--name", required=True, help="repository, e.g. ghcr.io/cni-dra/cni-dra")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--version", required=True, help="the org.opencontainers.image.version label")
    parser.add_argument("--cache", type=Path, default=tree.DEFAULT_CACHE)
    args = parser.parse_args()
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or _git("log", "-1", "--format=%ct"))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"cni-dra-{args.tag}.oci.tar"
    with tempfile.TemporaryDirectory(prefix="cni-dra-image-", dir=args.out_dir) as tmpdir:
        work = Path(tmpdir)
        layers = _layers(args.venv, args.cache, work, epoch)
        digest = oci.write_archive(
            out, layers, _config(args.version, epoch, layers), args.name, args.tag, epoch
        )
    size_mb = out.stat().st_size / 1e6
    print(f"archive: {out} ({size_mb:.1f} MB)\nimage: {args.name}:{args.tag}\ndigest: {digest}")
    return 0


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(SRC), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def _layers(venv: Path, cache: Path, work: Path, epoch: int) -> list[oci.Layer]:
    """(1) busybox, /tmp, the cached part of the tree; (2) the rest of the tree, the client, the link."""
    plugin_tree = work / tree.TREE_NAME
    base = tree.build(venv, plugin_tree, cache)
    client = work / "cni-dra"
    subprocess.run(
        [
            "cc",
            "-O2",
            "-static",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(client),
            str(SRC / "scripts" / "cni-dra-client.c"),
        ],
        check=True,
    )
    under = f"opt/cni/bin/{tree.TREE_NAME}"
    base_files = {p.relative_to(base).as_posix() for p in base.rglob("*")}
    own = {p.relative_to(plugin_tree).as_posix() for p in plugin_tree.rglob("*") if p.is_file()} - base_files
    app = [
        *oci.tree_entries(plugin_tree, under, only=own),
        oci.Entry("opt/cni/bin/cni-dra", "file", 0o755, client),
        oci.Entry("usr", "dir"),
        oci.Entry("usr/local", "dir"),
        oci.Entry("usr/local/bin", "dir"),
        oci.Entry("usr/local/bin/cni-dra", "symlink", target="../../../opt/cni/bin/cni-dra"),
    ]
    return [_system_layer(base, cache, work), oci.write_layer(app, epoch, work)]


def _system_layer(base: Path, cache: Path, work: Path) -> oci.Layer:
    """Layer 1, with mtime 0 rather than SOURCE_DATE_EPOCH: the same blob for every commit
    with the same interpreter, libraries and dependencies (so a new cni-dra pulls only layer
    2); kept in the cache by its inputs, since compressing it is most of a build's time."""
    (deb,) = tree.fetch_debs(cache / "debs", ["busybox-static"])
    key = hashlib.sha256(
        f"{base.name} {deb.name}".encode() + (HERE / "oci.py").read_bytes() + (HERE / "image.py").read_bytes()
    ).hexdigest()[:16]
    kept = cache / "layers" / key
    if not (kept / "layer.tar.gz").is_file():
        root = work / "busybox-root"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        entries = [
            oci.Entry("bin", "dir"),
            oci.Entry("bin/busybox", "file", 0o755, root / "bin" / "busybox"),
            *(oci.Entry(f"bin/{applet}", "symlink", target="busybox") for applet in BUSYBOX_APPLETS),
            oci.Entry("tmp", "dir", 0o1777),
            *oci.tree_entries(base, f"opt/cni/bin/{tree.TREE_NAME}"),
        ]
        layer = oci.write_layer(entries, 0, work)
        tree.prune(kept.parent, keep=2)
        staged = kept.with_name(key + ".tmp")
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        shutil.move(layer.path, staged / "layer.tar.gz")
        (staged / "diff_id").write_text(layer.diff_id)
        shutil.rmtree(kept, ignore_errors=True)
        staged.rename(kept)
    return oci.read_layer(kept / "layer.tar.gz", (kept / "diff_id").read_text())


def _config(version: str, epoch: int, layers: list[oci.Layer]) -> dict[str, object]:
    created = oci.rfc3339(epoch)
    revision = _git("rev-parse", "HEAD") + (
        "-dirty" if _git("status", "--porcelain", "--untracked-files=no") else ""
    )
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "Env": [f"PATH={PATH}"],
            "Cmd": ["cni-dra", "agent"],
            "WorkingDir": "/",
            "User": "0:0",
            "Labels": {
                "org.opencontainers.image.title": "cni-dra",
                "org.opencontainers.image.description": "CNI plugin and DRA driver: pods share node NICs by bandwidth",
                "org.opencontainers.image.version": version,
                "org.opencontainers.image.revision": revision,
                "org.opencontainers.image.created": created,
                "org.opencontainers.image.licenses": "Apache-2.0",
            },
        },
        "history": [
            {
                "created": created,
                "created_by": "scripts/image/image.py: busybox, the interpreter, libraries and "
                "dependencies (scripts/image/tree.py)",
            },
            {
                "created": created,
                "created_by": "scripts/image/image.py: cni-dra, its entry and the compiled client",
            },
        ][: len(layers)],
    }


if __name__ == "__main__":
    sys.exit(main())
