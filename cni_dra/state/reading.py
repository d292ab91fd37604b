"""Reading the state: the snapshot plus the journal's records, through the process cache.

:func:`read_current` is what a transaction, a read and a repair start from (the caller
holds the lock, or the in-process lock for a peek); :func:`read_fresh` reads the files as
a new process would, for tools, tests and ``CNI_DRA_STATE_VERIFY``.
"""

from __future__ import annotations

import gc
import os

from pydantic import ValidationError

from cni_dra.errors import StateError
from cni_dra.state import journal
from cni_dra.state.cache import CACHE, Cached, Reload, decoded, ident
from cni_dra.state.codec import apply_records, folded_from
from cni_dra.state.files import StateFiles
from cni_dra.state.schema import NodeState

__all__ = ["read_current", "read_unlocked", "read_fresh", "FREEZE_ATTACHMENTS"]

FREEZE_ATTACHMENTS = 1000
"""A snapshot of at least this many attachments decoded into the process cache is moved out
of the cyclic garbage collector's sight (:func:`gc.freeze`, with whatever else the process
holds then). Its objects hold no reference cycle, so reference counting frees them when
the state is replaced; but each full collection would otherwise walk all of them (about
300,000 objects and 0.3 s at 10,000 attachments, every few dozen transactions of a warm
agent). The cost: a reference cycle that is garbage at that moment is never collected,
once per such decode (the agent's first read, or a snapshot it could not take up)."""


def read_current(files: StateFiles) -> NodeState:
    """The current state (snapshot + journal), through this process's cache; the caller
    holds the lock. May be the cached object: read-only. Raises StateError (5)."""
    key = str(files.path)
    entry = CACHE.get(key)
    try:
        entry = _refresh(files, entry, kept=True)
    except Reload:
        CACHE.pop(key, None)
        entry = _refresh(files, None, kept=True)
    except BaseException:
        CACHE.pop(key, None)
        raise
    CACHE[key] = entry
    return entry.state


def read_unlocked(files: StateFiles) -> NodeState | None:
    """:func:`read_current` without the file lock (the caller holds the in-process lock),
    or None when it may be torn: the snapshot was replaced while it was read. A compaction
    elsewhere renames its snapshot over the one read, then removes the journal that one
    names; read in between, the old snapshot without its journal is older than commits
    that returned before the read began. The journal is opened before the snapshot is
    looked at again, so an unchanged snapshot means that journal was the one it names.
    Raises StateError (5)."""
    state = read_current(files)
    entry = CACHE.get(str(files.path))
    try:
        now = ident(os.stat(files.path))
    except FileNotFoundError:
        now = None
    except OSError as exc:
        raise StateError(f"failed to read state {files.path}: {exc.strerror}") from exc
    return state if entry is not None and entry.snap_ident == now else None


def read_fresh(files: StateFiles) -> NodeState:
    """The state as a new process reads it from the files, bypassing and not touching this
    process's cache. Raises StateError (5)."""
    return _refresh(files, None).state


def _refresh(files: StateFiles, entry: Cached | None, kept: bool = False) -> Cached:
    """``entry`` brought up to date with the files (None: read them whole); ``kept``: the
    result goes into the process cache. Raises Reload when it cannot be continued,
    StateError (5)."""
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
        if entry is None or not _take_up(entry, data, snap):
            entry = decoded(data, str(files.path), snap)
            if kept and len(entry.state.attachments) >= FREEZE_ATTACHMENTS:
                gc.freeze()  # see FREEZE_ATTACHMENTS
    if entry.jid is not None:
        journal.replay(files, entry)
    return entry


def _take_up(entry: Cached, data: bytes, snap: tuple[int, int, int, int]) -> bool:
    """Continue ``entry`` onto the new snapshot ``data`` without decoding it, when it folds
    the journal ``entry`` read and holds the ops of every record ``entry`` has not applied
    (a compaction by another process, :func:`cni_dra.state.journal.write_snapshot`): the
    state is then what that process wrote. False when it cannot (then decode ``data``).

    The checksum is verified all the same (:func:`~cni_dra.state.codec.folded_from`): an
    edited snapshot is noticed, as it is when decoded."""
    got = folded_from(data)
    if got is None or got[0] != entry.jid:
        return False
    _fid, fseq, tail, jid, seq = got
    first = fseq - len(tail) + 1  # the seq of tail[0]
    if not first - 1 <= entry.seq <= fseq:
        return False
    todo = tail[entry.seq - first + 1 :]
    state = entry.state
    if todo:
        state = state.changeable_copy()  # a state another thread reads is never changed under it
        try:
            apply_records(state, todo)
        except (ValidationError, ValueError, TypeError, KeyError):
            return False
    entry.state, entry.snap_ident, entry.snap_size, entry.jid, entry.seq = state, snap, len(data), jid, seq
    entry.j_ident, entry.j_end, entry.j_stale, entry.j_size, entry.j_times = None, 0, False, 0, (0, 0)
    entry.recent = []
    return True
