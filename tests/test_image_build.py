"""The pieces of `make image` and of the plugin tree that need no root and no network
(scripts/image/): the OCI archive writer is reproducible and writes the layout containerd and
CRI-O import; the ELF reader sees what the loader would need; the tree leaves out what the
product never loads.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

IMAGE_DIR = Path(__file__).resolve().parents[1] / "scripts" / "image"
EPOCH = 1_700_000_000


def _load(name: str) -> ModuleType:
    """A module of scripts/image (not a package: loaded from its file, siblings importable)."""
    spec = importlib.util.spec_from_file_location(f"cni_dra_image_{name}", IMAGE_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(IMAGE_DIR))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(IMAGE_DIR))
    return module


oci = _load("oci")
elf = _load("elf")
pysource = _load("pysource")


def _archive(tmp: Path, name: str, files: dict[str, bytes], tag: str = "1.0") -> tuple[Path, str]:
    """An archive of one layer holding ``files`` under opt/x plus a link; (path, digest)."""
    src = tmp / f"src-{name}"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    (src / "run").chmod(0o755)
    work = tmp / f"work-{name}"
    work.mkdir()
    entries = [
        *oci.tree_entries(src, "opt/x"),
        oci.Entry("usr/bin/x", "symlink", target="../../opt/x/run"),
        oci.Entry("usr", "dir"),
        oci.Entry("usr/bin", "dir"),
        oci.Entry("tmp", "dir", 0o1777),
    ]
    layer = oci.write_layer(entries, EPOCH, work)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": oci.rfc3339(EPOCH),
        "config": {"Labels": {"v": tag}},
    }
    out = tmp / f"{name}.tar"
    return out, oci.write_archive(out, [layer], config, "example.org/x", tag, EPOCH)


FILES = {
    "run": b"#!/bin/sh\necho hi\n",
    "lib/b.txt": b"b" * 5000,
    "lib/a.txt": b"a",
    "z/" + "n" * 120: b"long name",
}


def test_the_same_input_gives_the_same_archive(tmp_path):
    first, digest1 = _archive(tmp_path, "one", FILES)
    second, digest2 = _archive(tmp_path, "two", dict(reversed(FILES.items())))
    assert digest1 == digest2 and first.read_bytes() == second.read_bytes()
    third, digest3 = _archive(tmp_path, "three", {**FILES, "lib/a.txt": b"A"})
    assert digest3 != digest1


def test_the_archive_is_an_oci_layout_named_for_containerd_and_cri_o(tmp_path):
    path, digest = _archive(tmp_path, "one", FILES, tag="2.0")
    with tarfile.open(path) as tar:
        names = tar.getnames()
        read = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
        assert all(
            (m.mtime, m.uid, m.gid, m.uname, m.gname) == (EPOCH, 0, 0, "", "") for m in tar.getmembers()
        )
    assert names == sorted(names[:-2]) + ["index.json", "oci-layout"]
    assert json.loads(read["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = json.loads(read["index.json"])["manifests"]
    assert entry["digest"] == digest and entry["platform"] == {"architecture": "amd64", "os": "linux"}
    assert entry["annotations"] == {
        "io.containerd.image.name": "example.org/x:2.0",
        "org.opencontainers.image.ref.name": "2.0",
    }

    def blob(digest: str) -> bytes:
        return read["blobs/sha256/" + digest.removeprefix("sha256:")]

    assert "sha256:" + hashlib.sha256(blob(digest)).hexdigest() == digest
    manifest = json.loads(blob(digest))
    config = json.loads(blob(manifest["config"]["digest"]))
    assert config["created"] == "2023-11-14T22:13:20Z" and config["config"]["Labels"] == {"v": "2.0"}
    (layer,) = manifest["layers"]
    gz = blob(layer["digest"])
    assert gz[4:8] == b"\0\0\0\0" and gz[3] & 0x08 == 0  # gzip: no mtime, no file name
    layer_tar = gzip.decompress(gz)
    assert config["rootfs"] == {
        "type": "layers",
        "diff_ids": ["sha256:" + hashlib.sha256(layer_tar).hexdigest()],
    }
    with tarfile.open(fileobj=io.BytesIO(layer_tar)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert list(members) == sorted(members)
    assert {n: (m.type, m.mode) for n, m in members.items() if not n.startswith("opt/x/")} == {
        "opt": (tarfile.DIRTYPE, 0o755),
        "opt/x": (tarfile.DIRTYPE, 0o755),
        "tmp": (tarfile.DIRTYPE, 0o1777),
        "usr": (tarfile.DIRTYPE, 0o755),
        "usr/bin": (tarfile.DIRTYPE, 0o755),
        "usr/bin/x": (tarfile.SYMTYPE, 0o777),
    }
    assert (members["opt/x/run"].mode, members["opt/x/lib/a.txt"].mode) == (0o755, 0o644)
    assert members["usr/bin/x"].linkname == "../../opt/x/run" and "opt/x/z/" + "n" * 120 in members


def test_a_layer_refuses_links_it_was_not_told_of(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "link").symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match="only directories and regular files"):
        oci.tree_entries(tmp_path / "src", "opt/x")


def test_the_elf_reader_sees_what_the_interpreter_needs():
    python = Path("/usr/bin/python3.11")
    if not python.exists():
        pytest.skip("no Debian python3.11 here")
    dyn = elf.read_dynamic(python)
    assert "libc.so.6" in dyn.needed and "libexpat.so.1" in dyn.needed and dyn.search == ()
    assert not elf.is_elf(Path(__file__))


@pytest.mark.parametrize(
    "rel,kept",
    [
        ("cni_dra/main.py", True),
        ("kubernetes/client/models/v1_pod.py", True),
        ("kubernetes/aio/client/api_client.py", False),  # the asyncio client, never imported
        ("kubernetes/config/kube_config_test.py", False),
        ("pyroute2/test/x.py", False),
        ("pkg/tests/test_a.py", False),
        ("yaml/__pycache__/x.cpython-311.pyc", False),
        ("cel/cel.pyi", False),
        ("../../../bin/cni-dra", False),  # console scripts: the tree has its own entry
        ("cni_dra-0.1.0.dist-info/METADATA", True),
        ("cni_dra-0.1.0.dist-info/RECORD", False),  # lists files left out
        ("cni_dra-0.1.0.dist-info/direct_url.json", False),  # names the temporary build directory
    ],
)
def test_the_tree_keeps_what_the_product_loads(rel, kept):
    assert pysource.keep(rel) is kept
