"""The node-local state store: a checksummed snapshot, a journal, a backup and a file lock.

Files in ``stateDir`` (created 0700, files 0600; an existing directory that is a symlink, is
not owned by the process's euid or is writable by group or others is refused with code 5):

* ``state.json``: the snapshot (schema in :mod:`cni_dra.state.schema`, bytes in
  :mod:`cni_dra.state.codec`): plain JSON for an operator, ending in the journal that
  continues it and a SHA-256 checksum, so a torn, truncated or edited file is detected;
* ``state.journal``: the changes made since the snapshot, one checksummed record per
  transaction and per line (ops ``put``, ``del``, ``claims``, ``statusUpdates``, ``bootID``);
* ``state.json.bak``: the previous snapshot; ``state.lock``: the lock.

Why a journal: a transaction costs what it changes, not what the node holds. Rewriting the
whole file made an ADD+DEL 46 times slower at 10,000 attachments than at 10 (README
"Performance"). A commit appends one record and ``fdatasync``s it; a journal grown past the
snapshot's size is folded into a new snapshot.

The store is split by job; this module is its public face (:class:`StateStore`), and
re-exports the names callers use. Each module below imports only those after it in this
list (``.importlinter`` checks it), so none of them imports this one:

* :mod:`cni_dra.state.txn` and :mod:`cni_dra.state.salvage`: a transaction, whose typed
  operations (:mod:`cni_dra.state.ops`) are the only way the state changes; reading a
  damaged state, the view ``state repair`` writes through;
* :mod:`cni_dra.state.reading`: the current state, snapshot plus journal, through the cache;
* :mod:`cni_dra.state.journal`: replay, append, snapshot writes and compaction, every
  write through the :mod:`cni_dra.state.fsio` seam;
* :mod:`cni_dra.state.files`: the state directory (its files, its checks, its lock);
  :mod:`cni_dra.state.cache`: what a process keeps of the state it last read or wrote;
* :mod:`cni_dra.state.codec`: file names, the checksum seal, snapshot and record encoding,
  the op decoder, schema migration on decode; :mod:`cni_dra.state.lock`: the in-process
  lock and ``flock(2)`` on ``state.lock``; :mod:`cni_dra.state.owner`: boot id and process
  identity for intent records; :mod:`cni_dra.state.fsio`: the I/O seam;
* then the state itself: :mod:`cni_dra.state.ops`, :mod:`cni_dra.state.books` (what the
  attachments hold per device, kept by each operation), :mod:`cni_dra.state.schema`
  (its index of attachments a :mod:`cni_dra.state.cowmap`, whose copy costs what changed),
  :mod:`cni_dra.state.prepared` (the typed view of a prepared claim, its results each with
  its device profile, decoded once from the stored object), :mod:`cni_dra.state.frozen`
  (the read-only containers the state's values are kept in).

Snapshot writes are atomic: a temporary file in the same directory is written and fsync'ed;
the current (verified) file is hard-linked to ``state.json.bak``; the temporary file is
renamed over ``state.json``; the directory is fsync'ed; then the old journal is removed. A
crash leaves either the old or the new state, never a mix, and never no file.

Caching: a process keeps the state it last read or wrote, keyed by the snapshot's identity
(inode, size, mtime, ctime) and the journal's (inode, end of the last record read), so the
resident agent parses the snapshot once and then only the records other processes appended.
A snapshot another process folded from that journal (a compaction) names the journal and
seq it folds and carries its last records' ops: a process that had read up to one of them
applies the rest and takes the snapshot up after verifying its checksum, without parsing it
(:mod:`cni_dra.state.reading`). What each device holds is kept as the attachments change
(:mod:`cni_dra.state.books`), and so are the link types per device and the intents
(:class:`~cni_dra.state.schema.Attachments`): an ADD does not walk every attachment.
A transaction applies its operations to its own copy of the cached state (copy on write,
O(changes) rather than O(attachments): :mod:`cni_dra.state.cowmap`), which its commit makes
the cached state: a state once handed out is never changed, so a thread may read it while
others commit.
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
5): it is never read as empty. ``cni-dra state repair`` (:mod:`cni_dra.attach.rebuild`)
rebuilds it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from cni_dra.state import reading
from cni_dra.state import salvage as repair
from cni_dra.state.cache import ident
from cni_dra.state.codec import BACKUP_FILE, JOURNAL_FILE, LOCK_FILE, STATE_FILE, decode_state, encode_state
from cni_dra.state.files import DEFAULT_JOURNAL_LIMIT_BYTES, StateFiles
from cni_dra.state.owner import BOOT_ID_PATH, boot_id, current_owner, owner_alive
from cni_dra.state.salvage import RepairView
from cni_dra.state.schema import NodeState
from cni_dra.state.txn import VERIFY_ENV, Txn, transaction

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


_PEEK_TRIES = 3
"""Reads :meth:`StateStore.peek` tries without the file lock before it takes it."""


class StateStore(StateFiles):
    """Read and update ``<state_dir>/state.json`` under ``<state_dir>/state.lock``.

    ``lock_timeout_s``: longest wait for the lock, seconds (code 11 past it);
    ``journal_limit_bytes``: journal size past which it is folded into a new snapshot
    (never below the snapshot's own size; 0: every commit writes a snapshot). The
    directory's checks and the lock: :class:`~cni_dra.state.files.StateFiles`.
    """

    # -- reading -------------------------------------------------------------------------
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
        return reading.read_fresh(self)

    def peek(self) -> NodeState:
        """The state read without the file lock: safe because snapshots replace the file
        atomically, a half-appended journal record is ignored and a read that a snapshot
        replaced meanwhile is read again (:func:`~cni_dra.state.reading.read_unlocked`), but
        stale at once; for fast "anything to do?" checks only. May be this process's cached
        object: read-only. Raises StateError (5, also for an unsafe state directory, see
        :meth:`dir_exists`), TryAgainLaterError (11) when snapshots keep replacing it."""
        self.dir_exists()
        for _ in range(_PEEK_TRIES):
            with self.thread_locked():
                state = reading.read_unlocked(self)
            if state is not None:
                return state
        return self.read()  # compactions elsewhere keep outpacing the read: under the lock

    def read(self) -> NodeState:
        """The state, read under the lock (a missing state directory reads as empty and is
        not created). May be this process's cached object: treat it as read-only.
        Raises StateError (5, also for a state directory that is unsafe to use, see
        :meth:`dir_exists`), TryAgainLaterError (11)."""
        if not self.dir_exists():
            return NodeState()
        with self.locked():
            return reading.read_current(self)

    # -- writing -------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[Txn]:
        """Read-modify-write under the lock: yields a :class:`~cni_dra.state.txn.Txn` (the
        state to read, and its change operations; named ``txn`` by convention), closed when
        the block ends; commits its operations when the block exits normally (one journal
        record, or a new snapshot); writes nothing when it made none or when it raises.
        Raises StateError (5) for a corrupt file or a failed write, TryAgainLaterError (11)
        on lock timeout, :class:`~cni_dra.state.lock.NestedLockError` at once inside
        another transaction, read or repair of this state in the same thread.

        ``durable=False``: a journal record is appended but not ``fdatasync``'ed (the next
        durable commit flushes it). It survives the death of the process (the kernel holds
        it), not a kernel crash; for records that recovery can do without after a reboot
        (DEL's intent and removal: :mod:`cni_dra.attach.intent`)."""
        with transaction(self, durable) as txn:
            yield txn

    # -- repair --------------------------------------------------------------------------
    def read_backup(self) -> NodeState | None:
        """The backup (the second copy of the snapshot, plus its journal's good records),
        verified; None when there is none. Raises StateError (5) when the backup is corrupt too."""
        return repair.read_backup(self)

    @contextlib.contextmanager
    def replace(self) -> Iterator[RepairView]:
        """Hold the lock for ``cni-dra state repair``; yields a :class:`RepairView` (see
        :func:`cni_dra.state.salvage.replace`). Write the result with :meth:`RepairView.write`."""
        with repair.replace(self) as view:
            yield view
