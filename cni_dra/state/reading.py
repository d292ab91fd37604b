"""Reading the state: the snapshot plus the journal's records, through the process cache.

:func:`read_current` is what a transaction, a read and a repair start from (the caller
holds the lock, or the in-process lock for a peek); :func:`read_fresh` reads the files as
a new process would, for tools, tests and ``CNI_DRA_STATE_VERIFY``.
"""

from __future__ import annotations

import os

from cni_dra.errors import StateError
from cni_dra.state import journal
from cni_dra.state.cache import CACHE, Cached, Reload, decoded, ident
from cni_dra.state.files import StateFiles
from cni_dra.state.schema import NodeState

__all__ = ["read_current", "read_fresh"]


def read_current(files: StateFiles) -> NodeState:
    """The current state (snapshot + journal), through this process's cache; the caller
    holds the lock. May be the cached object: read-only. Raises StateError (5)."""
    key = str(files.path)
    entry = CACHE.get(key)
    try:
        entry = _refresh(files, entry)
    except Reload:
        CACHE.pop(key, None)
        entry = _refresh(files, None)
    except BaseException:
        CACHE.pop(key, None)
        raise
    CACHE[key] = entry
    return entry.state


def read_fresh(files: StateFiles) -> NodeState:
    """The state as a new process reads it from the files, bypassing and not touching this
    process's cache. Raises StateError (5)."""
    return _refresh(files, None).state


def _refresh(files: StateFiles, entry: Cached | None) -> Cached:
    """``entry`` brought up to date with the files (None: read them whole). Raises Reload
    when it cannot be continued, StateError (5)."""
    try:
        st = os.stat(files.path)
    except FileNotFoundError:
        if files.backup_path.exists():
            raise StateError(
                f"failed to read state {files.path}: the file is missing but {files.backup_path.name} "
                "exists; it is not treated as empty. Run `cni-dra state repair`"
            ) from None
        if entry is not None and entry.snap_ident is None:
            return entry
        return Cached(None, 0, None, 0, NodeState())
    except OSError as exc:
        raise StateError(f"failed to read state {files.path}: {exc.strerror}") from exc
    snap = ident(st)
    if entry is None or entry.snap_ident != snap:
        try:
            data = files.path.read_bytes()
        except OSError as exc:
            raise StateError(f"failed to read state {files.path}: {exc.strerror}") from exc
        entry = decoded(data, str(files.path), snap)
    if entry.jid is not None:
        journal.replay(files, entry)
    return entry
