"""cni-dra's runtime dependencies as the venv holds them (installed by pip from PyPI), and
copying them into the plugin tree without what the product never loads.

Left out, each with its reason (:data:`DIST_EXCLUDE`, :data:`PATH_EXCLUDE`): the build-time
protoc (the .proto modules were generated when cni-dra was built), the kubernetes client's
asyncio variant and the HTTP stack only it imports, tests, type stubs, bytecode (the tree
compiles its own) and pip's install records (they list files left out and temporary paths).
"""

from __future__ import annotations

import importlib.metadata as md
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

__all__ = ["Dist", "DIST_EXCLUDE", "PATH_EXCLUDE", "site_packages", "runtime_closure", "copy_distributions"]

DIST_EXCLUDE = {
    "grpcio-tools": "protoc: setup.py ran it when cni-dra was built; grpc imports it only when present",
    "setuptools": "a build backend (grpcio-tools depends on it)",
    "aiohttp": "only kubernetes.aio imports it, and kubernetes.aio is left out",
    "aiohttp-retry": "only kubernetes.aio imports it, and kubernetes.aio is left out",
}
PATH_EXCLUDE = (
    "kubernetes/aio/",  # the asyncio client (41 MB): cni-dra uses the threaded one
)
_DIST_INFO_DROP = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
_TEST_DIRS = {"test", "tests"}


@dataclass(frozen=True)
class Dist:
    """One installed distribution: normalised name, version, its files relative to site-packages."""

    name: str
    version: str
    files: tuple[str, ...]


def site_packages(venv: Path) -> Path:
    """The venv's site-packages directory (raises SystemExit when there is none)."""
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if len(found) != 1:
        raise SystemExit(f"tree: no single site-packages under {venv}: {found}")
    return found[0]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure(venv: Path) -> list[Dist]:
    """cni-dra and every distribution its requirements reach (no extras, markers evaluated),
    except :data:`DIST_EXCLUDE` and what only they reach; sorted by name."""
    site = site_packages(venv)
    installed = {_norm(d.metadata["Name"]): d for d in md.distributions(path=[str(site)])}
    seen: dict[str, md.Distribution] = {}
    todo = ["cni-dra"]
    while todo:
        name = _norm(todo.pop())
        if name in seen or name in DIST_EXCLUDE:
            continue
        if name not in installed:
            raise SystemExit(f"tree: {name} is required but not installed in {venv}")
        seen[name] = dist = installed[name]
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [Dist(name, d.version, tuple(str(f) for f in d.files or ())) for name, d in sorted(seen.items())]


def keep(rel: str) -> bool:
    """Whether a file of a distribution (path relative to site-packages) goes into the tree."""
    parts = rel.split("/")
    if rel.startswith("../") or rel.startswith(PATH_EXCLUDE) or "__pycache__" in parts:
        return False
    if any(p in _TEST_DIRS for p in parts[:-1]) or parts[-1] == "conftest.py":
        return False
    name = parts[-1]
    if name.endswith((".pyc", ".pyi")) or name.startswith("test_") or name.endswith("_test.py"):
        return False
    return not (parts[0].endswith(".dist-info") and name in _DIST_INFO_DROP)


def copy_distributions(site: Path, dists: list[Dist], dst: Path) -> None:
    """Copy what :func:`keep` keeps of each distribution from ``site`` to ``dst`` (mode 0644)."""
    for dist in dists:
        if not dist.files:
            raise SystemExit(f"tree: {dist.name} has no record of its files (RECORD)")
        for rel in sorted(dist.files):
            if not keep(rel):
                continue
            src, out = site / rel, dst / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out)
            out.chmod(0o644)
