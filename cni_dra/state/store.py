"""The node-local state store: a checksummed snapshot, a journal, a backup and a file lock.

Files in ``stateDir`` (created 0700, files 0600; an existing directory that is a symlink, is
not owned by the process's euid or is writable by group or others is refused with code 5):

* ``state.json``: the snapshot (schema in :mod:`cni_dra.state.models`, bytes in
  :mod:`cni_dra.state.codec`): plain JSON for an operator, ending in the journal that
  continues it and a SHA-256 checksum, so a torn, truncated or edited file is detected;
* ``state.journal``: the changes made since the snapshot, one checksummed record per
  transaction and per line (ops ``put``, ``del``, ``claims``, ``statusUpdates``, ``bootID``);
* ``state.json.bak``: the previous snapshot; ``state.lock``: the lock.

Why a journal: a transaction costs what it changes, not what the node holds. Rewriting the
whole file made an ADD+DEL 46 times slower at 10,000 attachments than at 10 (README
"Performance"). A commit appends one record and ``fdatasync``s it; a journal grown past the
snapshot's size is folded into a new snapshot.

The store is split by job; this module is its public face (:class:`StateStore`) and the
state directory's checks, and re-exports the names callers use:

* :mod:`cni_dra.state.codec`: file names, the checksum seal, snapshot and record encoding,
  the op decoder, schema migration on decode;
* :mod:`cni_dra.state.journal`: replay, append, snapshot writes and compaction, every
  write through the :mod:`cni_dra.state.fsio` seam;
* :mod:`cni_dra.state.txn`: a transaction, whose typed operations (:mod:`cni_dra.state.ops`)
  are the only way the state changes;
* :mod:`cni_dra.state.frozen`: the read-only containers the state's values are kept in;
* :mod:`cni_dra.state.prepared`: the typed view of a prepared claim (its results, each
  with its device profile), decoded once from the stored object;
* :mod:`cni_dra.state.lock`: the in-process lock and ``flock(2)`` on ``state.lock``;
* :mod:`cni_dra.state.cache`: what a process keeps of the state it last read or wrote;
* :mod:`cni_dra.state.repair`: reading a damaged state, the view ``state repair`` writes;
* :mod:`cni_dra.state.owner`: boot id and process identity for intent records.

Snapshot writes are atomic: a temporary file in the same directory is written and fsync'ed;
the current (verified) file is hard-linked to ``state.json.bak``; the temporary file is
renamed over ``state.json``; the directory is fsync'ed; then the old journal is removed. A
crash leaves either the old or the new state, never a mix, and never no file.

Caching: a process keeps the state it last read or wrote, keyed by the snapshot's identity
(inode, size, mtime, ctime) and the journal's (inode, end of the last record read), so the
resident agent parses the snapshot once and then only the records other processes appended.
A transaction applies its operations to its own copy of the cached state (copy on write),
which its commit makes the cached state: a state once handed out is never changed, so a
thread may read it while others commit.
A journal of the same size with another mtime or ctime was edited in place and is read
again whole; an edit of records already read, followed by appends of others, is found
by any fresh reader (the CLI, an in-process plugin, a restarted agent), not by this cache.
:meth:`StateStore.read` and :meth:`StateStore.peek` may return that shared object: treat it
as read-only.

The lock is held only around a read-modify-write (:meth:`StateStore.transaction`), never
while an IPAM plugin or netlink call runs. The kernel releases it when its holder dies;
waiters block in the kernel (no polling), so none starves when hundreds of plugins start
at once. A wait longer than the timeout raises :class:`~cni_dra.errors.TryAgainLaterError`
(CNI code 11) with nothing written.

A snapshot or journal that cannot be decoded or fails its checksum, or a snapshot missing
while a backup or journal records exist, raises :class:`~cni_dra.errors.StateError` (code
5): it is never read as empty. ``cni-dra state repair`` (:mod:`cni_dra.verbs.repair`)
rebuilds it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cni_dra.errors import StateError
from cni_dra.state import journal, lock, repair, txn
from cni_dra.state.cache import CACHE, Cached, Reload, decoded, ident
from cni_dra.state.codec import (
    BACKUP_FILE,
    JOURNAL_FILE,
    LOCK_FILE,
    STATE_FILE,
    decode_state,
    encode_state,
)
from cni_dra.state.models import NodeState
from cni_dra.state.owner import BOOT_ID_PATH, boot_id, current_owner, owner_alive
from cni_dra.state.repair import RepairView
from cni_dra.state.txn import VERIFY_ENV

__all__ = [
    "StateStore",
    "RepairView",
    "STATE_FILE",
    "BACKUP_FILE",
    "JOURNAL_FILE",
    "DEFAULT_JOURNAL_LIMIT_BYTES",
    "LOCK_FILE",
    "BOOT_ID_PATH",
    "VERIFY_ENV",
    "encode_state",
    "decode_state",
    "boot_id",
    "current_owner",
    "owner_alive",
]

DEFAULT_JOURNAL_LIMIT_BYTES = 256 << 10
"""Smallest journal (bytes) that is folded into a new snapshot; a bigger snapshot raises
the threshold to its own size (the amortised cost of compaction per commit stays flat)."""


class StateStore:
    """Read and update ``<state_dir>/state.json`` under ``<state_dir>/state.lock``.

    ``lock_timeout_s``: longest wait for the lock, seconds (code 11 past it);
    ``journal_limit_bytes``: journal size past which it is folded into a new snapshot
    (never below the snapshot's own size; 0: every commit writes a snapshot).
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        lock_timeout_s: float = 10.0,
        journal_limit_bytes: int = DEFAULT_JOURNAL_LIMIT_BYTES,
    ) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        self.backup_path = self.dir / BACKUP_FILE
        self.journal_path = self.dir / JOURNAL_FILE
        self.lock_path = self.dir / LOCK_FILE
        self.lock_timeout_s = lock_timeout_s
        self.journal_limit_bytes = journal_limit_bytes
        self._dir_ok = False  # stateDir checked (see _dir_exists)

    # -- the directory -------------------------------------------------------------------
    def _dir_exists(self) -> bool:
        """Whether ``stateDir`` exists, checked once per store (one ``lstat(2)``): it must be
        a real directory (not a symlink, not a file), owned by our euid and not writable by
        group or others, since whoever can write it can replace the state. False when it
        does not exist. Raises StateError (5) naming the problem."""
        if self._dir_ok:
            return True
        try:
            st = os.lstat(self.dir)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StateError(f"failed to use state directory {self.dir}: {exc.strerror}") from exc
        problem = ""
        if stat.S_ISLNK(st.st_mode):
            problem = "it is a symlink (refused; set stateDir to the directory itself)"
        elif not stat.S_ISDIR(st.st_mode):
            kind = "a regular file" if stat.S_ISREG(st.st_mode) else "not a directory"
            problem = f"it is {kind}, not a directory"
        elif st.st_uid != os.geteuid():
            problem = f"it is owned by uid {st.st_uid}, not by uid {os.geteuid()} that runs cni-dra"
        elif st.st_mode & 0o022:
            problem = (
                f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"`chmod 0700 {self.dir}` makes it private"
            )
        if problem:
            raise StateError(f"failed to use state directory {self.dir}: {problem}")
        self._dir_ok = True
        return True

    def _ensure_dir(self) -> None:
        """Create ``stateDir`` (0700; missing parents with the default mode) unless it exists,
        then check it (:meth:`_dir_exists`). Raises StateError (5)."""
        if self._dir_exists():
            return
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"failed to create state directory {self.dir}: {exc.strerror}") from exc
        if not self._dir_exists():  # removed again at once
            raise StateError(f"failed to create state directory {self.dir}: it vanished")

    def private_dir(self) -> Path:
        """``stateDir``, created (0700) if missing and checked as the state's own files are
        (a real directory of ours, not writable by group or others), for a small file of
        another job kept beside the state. Raises StateError (5) naming the problem."""
        self._ensure_dir()
        return self.dir

    # -- locking -------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the state lock (bounded wait). Raises TryAgainLaterError (11), StateError (5).

        Threads of one process (the agent) first queue on an in-process lock per lock file,
        blocking instead of polling the file lock, then take the file lock as processes do."""
        with self._thread_lock(), self._file_locked():
            yield

    @contextlib.contextmanager
    def _thread_lock(self) -> Iterator[None]:
        """The in-process lock of this state directory (threads of the agent; the cache)."""
        with lock.thread_lock(self.lock_path, self.lock_timeout_s):
            yield

    @contextlib.contextmanager
    def _file_locked(self) -> Iterator[None]:
        """``flock(2)`` on ``state.lock`` (:mod:`cni_dra.state.lock`), the directory made first."""
        self._ensure_dir()
        with lock.file_locked(self.lock_path, self.lock_timeout_s):
            yield

    # -- reading -------------------------------------------------------------------------
    def _read_unlocked(self) -> NodeState:
        """The current state (snapshot + journal), through this process's cache."""
        key = str(self.path)
        entry = CACHE.get(key)
        try:
            entry = self._refresh(entry)
        except Reload:
            CACHE.pop(key, None)
            entry = self._refresh(None)
        except BaseException:
            CACHE.pop(key, None)
            raise
        CACHE[key] = entry
        return entry.state

    def _refresh(self, entry: Cached | None) -> Cached:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self.backup_path.exists():
                raise StateError(
                    f"failed to read state {self.path}: the file is missing but {self.backup_path.name} "
                    "exists; it is not treated as empty. Run `cni-dra state repair`"
                ) from None
            if entry is not None and entry.snap_ident is None:
                return entry
            return Cached(None, 0, None, 0, NodeState())
        except OSError as exc:
            raise StateError(f"failed to read state {self.path}: {exc.strerror}") from exc
        snap = ident(st)
        if entry is None or entry.snap_ident != snap:
            try:
                data = self.path.read_bytes()
            except OSError as exc:
                raise StateError(f"failed to read state {self.path}: {exc.strerror}") from exc
            entry = decoded(data, str(self.path), snap)
        if entry.jid is not None:
            journal.replay(self, entry)
        return entry

    def change_stamp(self) -> tuple[Any, ...] | None:
        """A value that changes whenever the state may have (a new snapshot or a journal
        record); None when there is no state file. Costs two ``stat(2)``s, no read."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        try:
            jstat: tuple[int, int, int, int] | None = ident(os.stat(self.journal_path))
        except OSError:
            jstat = None
        return (ident(st), jstat)

    def read_files(self) -> NodeState:
        """The state as a new process reads it from the files (snapshot + journal), bypassing
        and not touching this process's cache; no lock (hold :meth:`locked` for a consistent
        view). For tools and tests. Raises StateError (5)."""
        return self._refresh(None).state

    def peek(self) -> NodeState:
        """The state read without the file lock: safe because snapshots replace the file
        atomically and a half-appended journal record is ignored, but stale at once; for
        fast "anything to do?" checks only. May be this process's cached object: read-only.
        Raises StateError (5, also for an unsafe state directory, see :meth:`_dir_exists`)."""
        self._dir_exists()
        with self._thread_lock():
            return self._read_unlocked()

    def read(self) -> NodeState:
        """The state, read under the lock (a missing state directory reads as empty and is
        not created). May be this process's cached object: treat it as read-only.
        Raises StateError (5, also for a state directory that is unsafe to use, see
        :meth:`_dir_exists`), TryAgainLaterError (11)."""
        if not self._dir_exists():
            return NodeState()
        with self.locked():
            return self._read_unlocked()

    # -- writing -------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[txn.Txn]:
        """Read-modify-write under the lock: yields a :class:`~cni_dra.state.txn.Txn` (the
        state to read, and its change operations); commits its operations when the block exits
        normally (one journal record, or a new snapshot); writes nothing when it made none or
        when it raises. Raises StateError (5) for a corrupt file or a failed write,
        TryAgainLaterError (11) on lock timeout.

        ``durable=False``: a journal record is appended but not ``fdatasync``'ed (the next
        durable commit flushes it). It survives the death of the process (the kernel holds
        it), not a kernel crash; for records that recovery can do without after a reboot
        (DEL's intent and removal: :mod:`cni_dra.verbs.intent`)."""
        with txn.transaction(self, durable) as state:
            yield state

    # -- repair --------------------------------------------------------------------------
    def read_backup(self) -> NodeState | None:
        """The backup (the second copy of the snapshot, plus its journal's good records),
        verified; None when there is none. Raises StateError (5) when the backup is corrupt too."""
        return repair.read_backup(self)

    @contextlib.contextmanager
    def replace(self) -> Iterator[RepairView]:
        """Hold the lock for ``cni-dra state repair``; yields a :class:`RepairView` (see
        :func:`cni_dra.state.repair.replace`). Write the result with :meth:`RepairView.write`."""
        with repair.replace(self) as view:
            yield view
