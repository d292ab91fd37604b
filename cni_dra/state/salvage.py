"""Repair support: reading what is left of a damaged state, and the view ``state repair`` writes through.

:func:`replace` holds the lock, moves an unreadable snapshot and its journal aside (as
``state.json.corrupt-<unix s>`` and ``state.journal.corrupt-<unix s>``) and yields a
:class:`RepairView` of what it found; :func:`read_backup` reads the second copy of the
snapshot. ``cni-dra state repair`` (:mod:`cni_dra.attach.rebuild`) decides what to write.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from cni_dra.errors import StateError
from cni_dra.state import fsio, journal
from cni_dra.state.cache import CACHE, decoded
from cni_dra.state.codec import JOURNAL_FILE, STATE_FILE
from cni_dra.state.files import StateFiles
from cni_dra.state.reading import read_current
from cni_dra.state.schema import NodeState

__all__ = ["RepairView", "replace", "read_backup"]


def _with_good_records(store: StateFiles, data: bytes, source: str) -> NodeState:
    """Snapshot bytes (``state.json`` or its copy) plus the journal's records before a bad
    one (a bad one is reported by the main read). Raises StateError (5) for a bad snapshot."""
    entry = decoded(data, source)
    if entry.jid is not None:
        journal.replay(store, entry, strict=False)
    return entry.state


def _read_snapshot_with_good_records(store: StateFiles) -> NodeState | None:
    """The snapshot plus the journal's records before a bad one; None if the snapshot is bad."""
    try:
        return _with_good_records(store, store.path.read_bytes(), str(store.path))
    except (OSError, StateError):
        return None


def read_backup_unlocked(store: StateFiles) -> NodeState | None:
    try:
        data = store.backup_path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"failed to read state backup {store.backup_path}: {exc.strerror}") from exc
    return _with_good_records(store, data, str(store.backup_path))


def read_backup(store: StateFiles) -> NodeState | None:
    """The backup (the second copy of the snapshot, plus its journal's good records),
    verified; None when there is none. Raises StateError (5) when the backup is corrupt too."""
    with store.locked():
        return read_backup_unlocked(store)


@contextlib.contextmanager
def replace(store: StateFiles) -> Iterator[RepairView]:
    """Hold the lock for ``cni-dra state repair``; yields a :class:`RepairView`.

    An unreadable ``state.json`` is moved aside first as ``state.json.corrupt-<unix s>``
    (so it never overwrites the backup), and its journal as ``state.journal.corrupt-<unix s>``.
    Write the result with :meth:`RepairView.write`.
    """
    with store.locked() as hold:
        hold.flush()  # this process's records that wait for their sync: synced (or cut off) first
        CACHE.pop(str(store.path), None)  # repair reads the files, not what this process remembers
        view = RepairView(store)
        stamp = int(time.time())  # of the files moved aside
        try:
            view.current = read_current(store)
        except StateError as exc:
            view.error = exc
            view.current = _read_snapshot_with_good_records(store)
            if view.current is None and store.path.exists():
                view.aside = store.dir / f"{STATE_FILE}.corrupt-{stamp}"
                fsio.rename(store.path, view.aside)
        try:
            view.backup = read_backup_unlocked(store)
        except StateError as exc:
            view.backup_error = exc
        if view.error is not None and store.journal_path.exists():
            # kept for the operator (the backup took its good records first); the repaired
            # snapshot starts a new journal
            view.journal_aside = store.dir / f"{JOURNAL_FILE}.corrupt-{stamp}"
            fsio.rename(store.journal_path, view.journal_aside)
        yield view


class RepairView:
    """What :func:`replace` found (under the lock): ``current`` state (None when
    the snapshot is unreadable or absent; with a bad journal, the snapshot plus the records
    before the bad one), its ``error``, where the unreadable snapshot went (``aside``) and the
    journal (``journal_aside``), the verified ``backup`` (None when absent or unreadable) and
    ``backup_error``."""

    def __init__(self, store: StateFiles) -> None:
        self.store = store
        self.current: NodeState | None = None
        self.error: StateError | None = None
        self.aside: Path | None = None
        self.journal_aside: Path | None = None
        self.backup: NodeState | None = None
        self.backup_error: StateError | None = None

    def write(self, state: NodeState) -> None:
        """Write the repaired state as a new snapshot (and its backup copy)."""
        journal.write_snapshot(self.store, state)
