"""Write an OCI image archive: an OCI image layout (``oci-layout``, ``index.json``,
``blobs/sha256/...``) in one tar, the form ``ctr images import``, ``skopeo copy
oci-archive:...`` and ``podman load`` read.

Reproducible: the same entries give the same bytes. Every tar (each layer and the archive)
lists its entries sorted by path, with one mtime (the caller's, SOURCE_DATE_EPOCH), uid
and gid 0 without names, and modes 0755/0644 (or what the entry says); gzip writes no
name and no timestamp; JSON is written with sorted keys and no spaces.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["Entry", "Layer", "tree_entries", "write_layer", "read_layer", "write_archive", "rfc3339"]

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Entry:
    """One path of a layer (relative, no leading slash): a directory, a regular file whose
    bytes are read from ``source``, or a symbolic link to ``target``."""

    path: str
    kind: str  # "dir", "file" or "symlink"
    mode: int = 0o755
    source: Path | None = None
    target: str = ""


@dataclass(frozen=True)
class Layer:
    """A written layer: the gzip blob's file, digest and size, and the digest of the tar (diff_id)."""

    path: Path
    digest: str
    size: int
    diff_id: str


def tree_entries(root: Path, under: str, only: set[str] | None = None) -> list[Entry]:
    """Entries for the regular files and directories below ``root``, placed under the image
    path ``under``; ``only``: the relative paths to take (their parent directories come
    along). Modes: 0755 for directories and files with an executable bit, 0644 else.
    Raises ValueError on a symbolic link or any other kind of file."""
    out = [Entry(p, "dir") for p in _parents(under)]
    out.append(Entry(under, "dir"))
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            st = os.lstat(full)
            if only is not None and rel not in only and not any(o.startswith(rel + "/") for o in only):
                continue
            if full.is_symlink() or not (full.is_dir() or full.is_file()):
                raise ValueError(f"{full}: only directories and regular files go into a layer")
            if full.is_dir():
                out.append(Entry(f"{under}/{rel}", "dir"))
            else:
                out.append(Entry(f"{under}/{rel}", "file", 0o755 if st.st_mode & 0o111 else 0o644, full))
    return out


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def write_layer(entries: Iterable[Entry], mtime: int, workdir: Path) -> Layer:
    """Write the entries (deduplicated by path, sorted) as a gzip-compressed tar in
    ``workdir``; returns the blob. Raises ValueError when one path has two kinds."""
    by_path: dict[str, Entry] = {}
    for entry in entries:
        seen = by_path.get(entry.path)
        if seen is not None and (seen.kind, seen.mode, seen.target) != (entry.kind, entry.mode, entry.target):
            raise ValueError(f"{entry.path}: two different entries")
        if seen is None or entry.kind != "dir":
            by_path[entry.path] = entry
    fd, tar_name = tempfile.mkstemp(dir=workdir, suffix=".tar")
    os.close(fd)
    with tarfile.open(tar_name, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(by_path):
            _add_entry(tar, by_path[path], mtime)
    diff_id = _sha256_file(Path(tar_name))
    gz_name = tar_name + ".gz"
    with open(tar_name, "rb") as src, open(gz_name, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
            shutil.copyfileobj(src, gz, _CHUNK)
    os.unlink(tar_name)
    digest = _sha256_file(Path(gz_name))
    return Layer(Path(gz_name), digest, os.path.getsize(gz_name), diff_id)


def read_layer(path: Path, diff_id: str) -> Layer:
    """A layer written earlier by :func:`write_layer` (its blob at ``path``, the tar's digest ``diff_id``)."""
    return Layer(path, _sha256_file(path), os.path.getsize(path), diff_id)


def _add_entry(tar: tarfile.TarFile, entry: Entry, mtime: int) -> None:
    info = tarfile.TarInfo(entry.path)
    info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
    info.mode = entry.mode
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif entry.kind == "symlink":
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.target, 0o777
        tar.addfile(info)
    elif entry.kind == "file" and entry.source is not None:
        info.size = os.path.getsize(entry.source)
        with open(entry.source, "rb") as f:
            tar.addfile(info, f)
    else:
        raise ValueError(f"{entry.path}: unknown kind {entry.kind!r}")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def rfc3339(epoch: int) -> str:
    """``epoch`` (seconds, UTC) as the OCI ``created`` fields write it."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_archive(
    out: Path, layers: list[Layer], config: dict[str, Any], name: str, tag: str, mtime: int
) -> str:
    """Write the archive to ``out`` (through a temporary file, then renamed): ``config`` (the
    image config without ``rootfs``, which is filled from ``layers``), one manifest, an index
    naming it ``name:tag`` (``io.containerd.image.name``) and ``tag``
    (``org.opencontainers.image.ref.name``). Returns the manifest digest."""
    config = {**config, "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]}}
    config_blob = _json(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": _digest(config_blob), "size": len(config_blob)},
        "layers": [
            {"mediaType": MEDIA_LAYER, "digest": layer.digest, "size": layer.size} for layer in layers
        ],
    }
    manifest_blob = _json(manifest)
    platform = {"architecture": config["architecture"], "os": config["os"]}
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": _digest(manifest_blob),
                "size": len(manifest_blob),
                "platform": platform,
                "annotations": {
                    "io.containerd.image.name": f"{name}:{tag}",
                    "org.opencontainers.image.ref.name": tag,
                },
            }
        ],
    }
    blobs: dict[str, Path | bytes] = {
        _digest(config_blob): config_blob,
        _digest(manifest_blob): manifest_blob,
    }
    for layer in layers:
        blobs[layer.digest] = layer.path
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in ("blobs", "blobs/sha256"):
            _add_entry(tar, Entry(path, "dir"), mtime)
        for digest in sorted(blobs):
            _add_blob(tar, "blobs/sha256/" + digest.removeprefix("sha256:"), blobs[digest], mtime)
        _add_blob(tar, "index.json", _json(index), mtime)
        _add_blob(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}), mtime)
    tmp.rename(out)
    return _digest(manifest_blob)


def _add_blob(tar: tarfile.TarFile, path: str, data: Path | bytes, mtime: int) -> None:
    if isinstance(data, Path):
        _add_entry(tar, Entry(path, "file", 0o644, data), mtime)
        return
    info = tarfile.TarInfo(path)
    info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode, info.size = (
        mtime,
        0,
        0,
        "",
        "",
        0o644,
        len(data),
    )
    tar.addfile(info, io.BytesIO(data))


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
