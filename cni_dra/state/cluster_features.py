"""The cluster's allocation semantics as the agent found them, kept beside the node state.

The scheduler's arithmetic for a stepped ``validRange`` depends on the control plane's
``DRAFractionalCapacityRange`` feature gate (:mod:`cni_dra.allocator.capacity`). The
plugin never talks to the API server, so the agent finds the gate out and records it in
``<stateDir>/`` :data:`FEATURES_FILE`::

    {"fractionalCapacityRange": true, "source": "kube-apiserver metric kubernetes_feature_enabled"}

Readers: the plugin's standalone allocation and ``cni-dra allocate --state-dir``. No file
means nothing was found out: Kubernetes 1.37's default applies (off).

Why a file of its own and not a record in ``state.json``: it is a fact about the cluster,
not the node's books; one writer (the agent) and readers that need no ordering with the
books (the scheduler, too, reads its gate once, at start); the state's schema and journal
stay as they are, so a cni-dra that predates this file reads the state unchanged. Written
whole, 0600, through a temporary file renamed over it, in the state directory (checked as
the state's own files are: :meth:`~cni_dra.state.store.StateStore.private_dir`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from cni_dra.errors import StateError
from cni_dra.state import fsio
from cni_dra.state.store import StateStore

__all__ = ["FEATURES_FILE", "ClusterFeatures", "read_features", "write_features"]

FEATURES_FILE = "cluster-features.json"
"""The record's name in the state directory."""


@dataclass(frozen=True)
class ClusterFeatures:
    """The control plane's allocation semantics: ``fractional_capacity_range`` is its
    ``DRAFractionalCapacityRange`` gate; ``source`` says how the agent found it out."""

    fractional_capacity_range: bool
    source: str = ""

    def to_json(self) -> dict[str, object]:
        return {"fractionalCapacityRange": self.fractional_capacity_range, "source": self.source}


def read_features(store: StateStore) -> ClusterFeatures | None:
    """The record in ``store``'s directory, or None when there is none (or no directory).

    Raises StateError (5) when the directory fails the state's checks or the file cannot
    be read or is not a record (a bad record is never read as "off").
    """
    path = store.dir / FEATURES_FILE
    try:
        if not store.dir_exists():
            return None
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"failed to read {path}: {exc.strerror}") from exc
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise StateError(f"failed to read {path}: not JSON: {exc}") from exc
    value = doc.get("fractionalCapacityRange") if isinstance(doc, dict) else None
    source = doc.get("source", "") if isinstance(doc, dict) else ""
    if not isinstance(value, bool) or not isinstance(source, str):
        raise StateError(
            f"failed to read {path}: fractionalCapacityRange must be true or false, source a string"
        )
    return ClusterFeatures(value, source)


def write_features(store: StateStore, features: ClusterFeatures) -> None:
    """Write ``features`` to ``store``'s directory (created 0700 if missing): a temporary
    file, synced, renamed over the record, the directory synced. Raises StateError (5)."""
    directory = store.private_dir()
    path = directory / FEATURES_FILE
    tmp = directory / f".{FEATURES_FILE}.{os.getpid()}.tmp"
    data = (json.dumps(features.to_json(), sort_keys=True) + "\n").encode()
    try:
        fd = fsio.open_write(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fsio.write_all(fd, data)
            fsio.fsync(fd)
        finally:
            os.close(fd)
        fsio.rename(tmp, path)
        fsio.fsync_dir(directory)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StateError(f"failed to write {path}: {exc.strerror}") from exc
