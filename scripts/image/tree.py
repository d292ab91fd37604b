#!/usr/bin/env python3
"""Build the plugin tree: cni-dra, a Python to run it and every library that Python loads,
under one directory that runs wherever it is copied, on a host with no Python and any glibc
(README "Install layout").

usage: tree.py --venv VENV --out DIR [--cache DIR]

  bin/python3                  Debian's python3.11 (package python3.11-minimal)
  lib/ld-linux-x86-64.so.2     glibc's dynamic loader: the interpreter is started through it,
                               `lib/ld-linux-x86-64.so.2 --library-path lib bin/python3 -IS ...`
  lib/*.so.*                   glibc and every library the tree's ELF files need, by soname
  lib/python3.11/              the standard library, lib-dynload included (minus STDLIB_EXCLUDE)
  lib/python3/dist-packages/   cni_dra and its runtime dependencies, from VENV
  libexec/cni-dra              the entry (scripts/cni-dra-entry.py)
  share/cni-dra/packages.txt   the Debian packages and Python distributions inside, with versions
  share/doc/<package>/copyright  the Debian packages' licences

Every .py has its .pyc next to it (__pycache__), compiled with --invalidation-mode
unchecked-hash: the same bytes for the same sources, never checked against the source's
mtime and never rewritten. No symlinks: the tree is a plain directory copy.

The part that does not depend on cni-dra's own code (interpreter, libraries, standard
library, third-party packages, compiled) is built once per set of inputs and kept under the
cache (default /var/cache/cni-dra-tree, CNI_DRA_TREE_CACHE), with the .deb files it came
from; a build after a change to cni_dra copies it and adds the package (a few seconds).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import elf
import pysource

__all__ = [
    "PACKAGES",
    "TREE_NAME",
    "LOADER",
    "PYTHON",
    "ENTRY",
    "build",
    "interpreter",
    "fetch_debs",
    "prune",
]

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent
DEFAULT_CACHE = Path(os.environ.get("CNI_DRA_TREE_CACHE", "/var/cache/cni-dra-tree"))
PY_VERSION = "3.11"
PACKAGES = (
    "python3.11-minimal",  # the interpreter
    "libpython3.11-minimal",
    "libpython3.11-stdlib",  # the standard library
    "libc6",  # glibc and its loader
    "libgcc-s1",
    "libstdc++6",  # the C++ runtime of grpc and protobuf's extension modules
    "zlib1g",
    "libexpat1",
    "libffi8",
    "libssl3",
    "libbz2-1.0",
    "liblzma5",
    "libuuid1",
    "libsqlite3-0",
)
TREE_NAME = "cni-dra.d"  # the tree's directory, beside the compiled client (scripts/cni-dra-client.c)
LOADER = "lib/ld-linux-x86-64.so.2"
PYTHON = "bin/python3"
ENTRY = "libexec/cni-dra"
SITE = "lib/python3/dist-packages"  # one of Debian's site directories of a prefix (site.py)
STDLIB = f"lib/python{PY_VERSION}"
# Never imported by cni-dra or its dependencies: tests, GUIs, REPL helpers, installers.
STDLIB_EXCLUDE = {
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "turtle.py",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "__phello__",
    "sitecustomize.py",
}  # sitecustomize: a link to Debian's /etc/python3.11
# lib-dynload modules left out (module name prefixes): test modules, and those that need
# libraries nothing else needs (curses, readline, gdbm/Berkeley DB, NIS, crypt).
DYNLOAD_EXCLUDE = (
    "_test",
    "_ctypes_test",
    "_xxtestfuzz",
    "xxlimited",
    "_curses",
    "readline",
    "_dbm",
    "_gdbm",
    "nis",
    "_crypt",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--venv", required=True, type=Path, help="the venv cni-dra is installed in (non-editable)"
    )
    parser.add_argument("--out", required=True, type=Path, help="the tree to write (must not exist)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()
    build(args.venv, args.out, args.cache)
    return 0


def build(venv: Path, out: Path, cache: Path) -> Path:
    """Write the tree at ``out`` (which must not exist) from the venv's cni-dra; returns the
    cached part it was copied from (everything but cni-dra's own package and the entry)."""
    out = out.absolute()
    if out.exists():
        raise SystemExit(f"tree: {out} exists")
    site = pysource.site_packages(venv)
    dists = pysource.runtime_closure(venv)
    debs = fetch_debs(cache / "debs", PACKAGES)
    key = _base_key(debs, dists)
    base = cache / "bases" / key
    if not base.is_dir():
        _build_base(base, debs, site, [d for d in dists if d.name != "cni-dra"], venv)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp, symlinks=True)
    app = [d for d in dists if d.name == "cni-dra"]
    pysource.copy_distributions(site, app, tmp / SITE)
    copy_file(SRC / "scripts" / "cni-dra-entry.py", tmp / ENTRY, 0o644)
    compile_pyc(tmp, [tmp / SITE / "cni_dra"])
    smoke_test(tmp)
    tmp.rename(out)
    return base


def interpreter(tree: Path) -> list[str]:
    """The command that starts the tree's Python (append its arguments)."""
    return [str(tree / LOADER), "--library-path", str(tree / "lib"), str(tree / PYTHON)]


# -- Debian packages ---------------------------------------------------------------------------
def fetch_debs(cache: Path, packages: Iterable[str]) -> list[Path]:
    """The .deb of each package (the version apt would install), downloaded into ``cache``
    unless a file with apt's checksum is there already. Refreshes stale package lists once."""
    cache.mkdir(parents=True, exist_ok=True)
    for attempt in (1, 2):
        wanted = _print_uris(packages)
        missing = [
            name for name, (fname, _) in wanted.items() if not _has_file(cache / fname, wanted[name][1])
        ]
        if missing:
            proc = subprocess.run(
                ["apt-get", "-q", "-o", "APT::Sandbox::User=root", "download", *missing],
                cwd=cache,
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                if attempt == 2:
                    raise SystemExit(f"tree: apt-get download failed: {proc.stderr.strip()}")
                subprocess.run(["apt-get", "update", "-qq"], check=True)
                continue
        bad = [fname for fname, sha in wanted.values() if not _has_file(cache / fname, sha)]
        if not bad:
            return [cache / fname for fname, _ in wanted.values()]
        if attempt == 2:
            raise SystemExit(f"tree: downloaded files do not match apt's checksums: {bad}")
    raise AssertionError("unreachable")


def _print_uris(packages: Iterable[str]) -> dict[str, tuple[str, str]]:
    """package -> (.deb file name, sha256) as apt resolves it now."""
    proc = subprocess.run(
        ["apt-get", "download", "--print-uris", *packages], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"tree: apt-get cannot resolve {list(packages)}: {proc.stderr.strip()}")
    found = {}
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[3].startswith("SHA256:"):
            found[fields[1].split("_", 1)[0]] = (fields[1], fields[3].removeprefix("SHA256:"))
    if set(found) != set(packages):
        raise SystemExit(f"tree: apt-get resolved {sorted(found)} for {sorted(packages)}")
    return found


def _has_file(path: Path, sha256: str) -> bool:
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == sha256


def _base_key(debs: list[Path], dists: list[pysource.Dist]) -> str:
    h = hashlib.sha256()
    for deb in sorted(debs):
        h.update(f"deb {deb.name}\n".encode())
    for dist in dists:
        if dist.name != "cni-dra":
            h.update(f"dist {dist.name}=={dist.version}\n".encode())
    for source in (HERE / "tree.py", HERE / "pysource.py", HERE / "elf.py"):
        h.update(source.name.encode() + hashlib.sha256(source.read_bytes()).digest())
    return h.hexdigest()[:16]


# -- the part without cni-dra ------------------------------------------------------------------
def _build_base(base: Path, debs: list[Path], site: Path, dists: list[pysource.Dist], venv: Path) -> None:
    print(
        f"tree: building the interpreter, libraries and dependencies ({base.name}); cached for next time",
        file=sys.stderr,
    )
    base.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cni-dra-tree-") as tmpdir:
        root, tree = Path(tmpdir) / "root", Path(tmpdir) / "tree"
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        copy_file(root / "usr/bin" / f"python{PY_VERSION}", tree / PYTHON, 0o755)
        _copy_stdlib(root / "usr/lib" / f"python{PY_VERSION}", tree / STDLIB)
        pysource.copy_distributions(site, dists, tree / SITE)
        bring_libraries(tree, [root / "lib/x86_64-linux-gnu", root / "usr/lib/x86_64-linux-gnu"])
        _write_manifest(tree, debs, dists, root)
        compile_pyc(tree, [tree / STDLIB, tree / SITE])
        prune(base.parent, keep=2)
        staged = base.with_name(base.name + ".tmp")
        shutil.rmtree(staged, ignore_errors=True)
        shutil.copytree(tree, staged, symlinks=True)
        staged.rename(base)


def _copy_stdlib(src: Path, dst: Path) -> None:
    for path in _walk(src):
        rel = path.relative_to(src)
        if rel.parts[0] in STDLIB_EXCLUDE or "__pycache__" in rel.parts:
            continue
        if rel.parts[0] == "lib-dynload" and path.name.startswith(DYNLOAD_EXCLUDE):
            continue
        if path.is_symlink() and os.path.isabs(os.readlink(path)):
            raise SystemExit(f"tree: {path} links out of the standard library")
        copy_file(path, dst / rel)


def bring_libraries(tree: Path, lib_dirs: list[Path]) -> None:
    """Copy into ``tree/lib`` every library (by soname, links resolved) that an ELF file of
    the tree needs and the tree lacks, found in ``lib_dirs``, until nothing is missing.
    Raises SystemExit naming what no directory has."""
    while True:
        missing = sorted(set(missing_libraries(tree)))
        if not missing:
            return
        for soname in missing:
            found = next((d / soname for d in lib_dirs if (d / soname).exists()), None)
            if found is None:
                raise SystemExit(f"tree: {soname} is needed but no package in PACKAGES has it")
            copy_file(
                found.resolve(), tree / "lib" / soname, 0o755 if soname == "ld-linux-x86-64.so.2" else 0o644
            )


def missing_libraries(tree: Path) -> Iterator[str]:
    """The sonames that some ELF file of ``tree`` needs and neither ``tree/lib`` nor the
    file's own RUNPATH (inside the tree) holds. Also the loader, which nothing names."""
    if not (tree / LOADER).exists():
        yield Path(LOADER).name
    for path in _walk(tree):
        if path.is_symlink() or not path.is_file() or not elf.is_elf(path):
            continue
        dyn = elf.read_dynamic(path)
        dirs = [tree / "lib"] + [Path(p.replace("$ORIGIN", str(path.parent))) for p in dyn.search]
        for soname in dyn.needed:
            if not any((d / soname).exists() and tree in (d / soname).resolve().parents for d in dirs):
                yield soname


def _write_manifest(tree: Path, debs: list[Path], dists: list[pysource.Dist], root: Path) -> None:
    lines = ["# Debian packages (name version)"]
    for deb in sorted(debs):
        name, version, _ = deb.name.split("_")
        lines.append(f"{name} {version.replace('%3a', ':')}")
        copyright_file = root / "usr/share/doc" / name / "copyright"
        if copyright_file.is_file():
            copy_file(copyright_file, tree / "share/doc" / name / "copyright", 0o644)
    lines.append("# Python distributions (name version), from PyPI")
    lines += [f"{d.name} {d.version}" for d in dists]
    (tree / "share/cni-dra").mkdir(parents=True, exist_ok=True)
    (tree / "share/cni-dra/packages.txt").write_text("\n".join(lines) + "\n")


def prune(cache_dir: Path, keep: int) -> None:
    """Remove all but the ``keep - 1`` newest entries of ``cache_dir`` (one is about to be added)."""
    if not cache_dir.is_dir():
        return
    old = sorted((p for p in cache_dir.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    for path in old[: max(0, len(old) - keep + 1)]:
        shutil.rmtree(path, ignore_errors=True)


# -- shared steps ------------------------------------------------------------------------------
def compile_pyc(tree: Path, dirs: list[Path]) -> None:
    """Compile every .py under ``dirs`` with the tree's own interpreter: unchecked-hash .pyc
    files, the source path recorded relative to the tree. The same bytes every time: ``-f``
    rewrites what is there and ``-B`` keeps the compiling interpreter from writing
    timestamped .pyc files of the modules it imports itself (compileall would keep those);
    hash randomisation off (``PYTHONHASHSEED=0``, so no ``-I``; ``-S`` and an empty
    environment instead)."""
    cmd = [
        *interpreter(tree),
        "-S",
        "-B",
        "-m",
        "compileall",
        "-q",
        "-f",
        "-j",
        "2",
        "--invalidation-mode",
        "unchecked-hash",
        "-s",
        str(tree),
        "-p",
        TREE_NAME,
        *map(str, dirs),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, check=False, cwd="/", env={"PYTHONHASHSEED": "0"}
    )
    if proc.returncode != 0:
        raise SystemExit(f"tree: compileall failed:\n{proc.stdout}{proc.stderr}")
    stale = [p for d in dirs for p in d.rglob("*.pyc") if p.read_bytes()[4:8] != b"\1\0\0\0"]
    if stale:
        raise SystemExit(f"tree: .pyc files without an unchecked hash: {stale[:5]}")


SMOKE = """
import importlib, pkgutil, sys
tree = sys.argv[1]
import cni_dra
for mod in pkgutil.walk_packages(cni_dra.__path__, "cni_dra."):
    importlib.import_module(mod.name)
import cel, grpc, kubernetes, pyroute2, yaml  # imported lazily by cni_dra
from cni_dra.k8s import protos
for name in protos.PROTOS:
    assert protos.load(name)[0].__file__.startswith(tree), name  # generated at build time, not compiled now
outside = sorted({m.__file__ for m in list(sys.modules.values())
                  if getattr(m, "__file__", None) and not m.__file__.startswith(tree)})
assert not outside, outside
"""


def smoke_test(tree: Path) -> None:
    """Start the tree's interpreter: every cni_dra module and the libraries it imports lazily
    load from inside the tree, and the entry answers ``--version``."""
    for cmd in (
        [*interpreter(tree), "-I", "-B", "-c", SMOKE, str(tree)],
        [*interpreter(tree), "-IS", str(tree / ENTRY), "--version"],
    ):
        proc = subprocess.run(
            cmd, capture_output=True, text=True, check=False, cwd="/", env={"PATH": "/usr/bin:/bin"}
        )
        if proc.returncode != 0:
            raise SystemExit(f"tree: smoke test failed: {cmd[4:7]}\n{proc.stdout}{proc.stderr}")


def copy_file(src: Path, dst: Path, mode: int | None = None) -> None:
    """Copy the bytes of ``src`` (links followed) to ``dst``; mode 0755 or 0644 after the
    source's executable bit unless given."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    if mode is None:
        mode = 0o755 if os.stat(src).st_mode & 0o111 else 0o644
    os.chmod(dst, mode)


def _walk(top: Path) -> Iterator[Path]:
    """Files and links under ``top``, sorted, not following links to directories."""
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(filenames):
            yield Path(dirpath) / name
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)):
                yield Path(dirpath) / name


if __name__ == "__main__":
    sys.exit(main())
