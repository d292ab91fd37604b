"""Transactions: a read-modify-write of the state under the lock, committed as one journal record.

:func:`transaction` (behind :meth:`StateStore.transaction <cni_dra.state.store.StateStore.transaction>`)
yields a :class:`Txn`: the state to read, and the only way to change it. Each change is an
explicit, typed operation (:mod:`cni_dra.state.ops`): the transaction applies it at once
to its own copy of the state (made at the first change; the state it started from, which
other threads may be reading, is never changed), so later reads in the block see it, and
keeps it. When the block exits
normally the kept operations are committed as one journal record (or a new snapshot);
nothing is written when it made none, or when the block raises. Once the block is over the
handle is closed: any read or change through it raises :class:`TxnClosedError` (a change
made then would be lost). A transaction opened inside another on the same state in the
same thread raises :class:`~cni_dra.state.lock.NestedLockError` at once.

Everything the state holds is immutable (frozen models, read-only containers), so a
change made any other way, in place, raises instead of reaching the process's cached
state but not the files. ``CNI_DRA_STATE_VERIFY=1`` (the test suites set it) re-reads the
files after every commit and fails if they differ from memory. Any failure drops the
process's cached state.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from cni_dra.errors import StateError
from cni_dra.state import journal, ops
from cni_dra.state.cache import CACHE
from cni_dra.state.files import StateFiles
from cni_dra.state.frozen import deep_freeze
from cni_dra.state.lock import Hold
from cni_dra.state.reading import read_current, read_fresh
from cni_dra.state.schema import Attachment, Attachments, NodeState

__all__ = ["VERIFY_ENV", "Txn", "TxnClosedError", "transaction"]

VERIFY_ENV = "CNI_DRA_STATE_VERIFY"

_log = logging.getLogger("cni_dra.state.store")


class TxnClosedError(RuntimeError):
    """A transaction's handle used after its ``with`` block: a bug in the caller."""


class Txn:
    """One transaction (by convention named ``txn``): reads of the state as changed so far,
    and its changes as operations. Closed at the end of its ``with`` block (module docstring).

    Reads: :attr:`state` (the whole :class:`NodeState`), :meth:`find`, :attr:`attachments`,
    :attr:`claims`, :attr:`statusUpdates`, :attr:`bootID` (what the devices hold:
    :func:`cni_dra.state.ledger.node_usage` of :attr:`state`).
    Changes: :meth:`put`, :meth:`update`, :meth:`remove`, :meth:`set_claims`,
    :meth:`set_status_updates`, :meth:`add_status_update`, :meth:`set_boot_id`.
    ``where`` names the state in the error a closed handle raises.
    """

    __slots__ = ("base", "_state", "ops", "_where")

    def __init__(self, state: NodeState, where: str = "") -> None:
        self.base = state  # what the transaction started from: never changed (copy on write)
        self._state: NodeState | None = state  # None: closed
        self.ops: list[ops.Op] = []
        self._where = where

    def close(self) -> None:
        """End the transaction: from now on every read or change raises TxnClosedError."""
        self._state = None

    @property
    def state(self) -> NodeState:
        """The state as changed so far (read-only). Raises TxnClosedError once closed."""
        state = self._state
        if state is None:
            where = f" of {self._where}" if self._where else ""
            raise TxnClosedError(
                f"the state transaction{where} is over: its handle is usable only inside its with-block "
                "(a change made after it would be lost)"
            )
        return state

    def _do(self, op: ops.Op) -> None:
        state = self.state
        if state is self.base:  # the first change: from here on, the transaction's own copy
            state = self._state = self.base.changeable_copy()
        ops.apply(state, op)
        self.ops.append(op)

    # -- reads ---------------------------------------------------------------------------
    @property
    def attachments(self) -> Attachments:
        return self.state.attachments

    @property
    def claims(self) -> Mapping[str, Sequence[Mapping[str, Any]]]:
        return self.state.claims

    @property
    def statusUpdates(self) -> Sequence[Mapping[str, Any]]:  # noqa: N802 - named as the NodeState field
        return self.state.statusUpdates

    @property
    def bootID(self) -> str | None:  # noqa: N802 - named as the NodeState field
        return self.state.bootID

    def find(self, network: str, container_id: str, ifname: str) -> Attachment | None:
        """The attachment with that key, or None."""
        return self.state.find(network, container_id, ifname)

    # -- changes -------------------------------------------------------------------------
    def put(self, att: Attachment) -> Attachment:
        """Record ``att``: it replaces the attachment with its key (in its place) or goes last.
        Returns what is recorded: ``att`` validated again, since a copy made with
        ``model_copy(update=...)`` skips validation and could hold mutable or mistyped values."""
        recorded = Attachment.model_validate(dict(att.__dict__))
        self._do(ops.Put(recorded))
        return recorded

    def update(self, att: Attachment | tuple[str, str, str], **changes: Any) -> Attachment:
        """Record a copy of the attachment (``att``, or the one with that key) with ``changes``
        (field name → value, validated as the model's fields are); returns the copy.
        Raises KeyError when no attachment has that key."""
        key = att if isinstance(att, tuple) else att.key
        cur = self.state.attachments.get(key)
        if cur is None:
            raise KeyError(key)
        unknown = changes.keys() - Attachment.model_fields.keys()
        if unknown:
            raise TypeError(f"an attachment has no field {', '.join(sorted(unknown))}")
        new = Attachment.model_validate({**cur.__dict__, **changes})
        if new.key != key:
            raise ValueError(f"an update must not change an attachment's key {key}")
        self._do(ops.Put(new))
        return new

    def put_all(self, atts: Iterable[Attachment]) -> None:
        """:meth:`put` each of ``atts``, in order."""
        for att in atts:
            self.put(att)

    def remove(self, network: str, container_id: str, ifname: str) -> Attachment | None:
        """Unlist the attachment with that key and return it (None: there was none, no change)."""
        att = self.state.find(network, container_id, ifname)
        if att is not None:
            self._do(ops.Delete(att.key))
        return att

    def set_claims(self, pod_uid: str, claims: Sequence[Mapping[str, Any]] | None) -> None:
        """Set the prepared claims of pod ``pod_uid`` (empty or None: it holds none)."""
        value = deep_freeze(list(claims)) if claims else None
        if value is None and pod_uid not in self.state.claims:
            return
        self._do(ops.SetClaims(pod_uid, value))

    def set_status_updates(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Set the pending ResourceClaim status records."""
        self._do(ops.SetStatusUpdates(deep_freeze(list(records))))

    def add_status_update(self, record: Mapping[str, Any]) -> None:
        """Add one pending ResourceClaim status record after the others."""
        self.set_status_updates([*self.state.statusUpdates, record])

    def set_boot_id(self, boot: str | None) -> None:
        """Set the boot id the state was last reconciled in."""
        if boot != self.state.bootID:
            self._do(ops.SetBootID(boot))


@contextlib.contextmanager
def transaction(files: StateFiles, durable: bool) -> Iterator[Txn]:
    """See :meth:`cni_dra.state.store.StateStore.transaction`."""
    key = str(files.path)
    with files.locked() as hold:
        txn = Txn(read_current(files), where=str(files.dir))
        try:
            yield txn  # a block that raises leaves the cached state as it was: nothing to undo
            try:
                _commit(files, txn, durable, hold)
            except BaseException:
                CACHE.pop(key, None)
                raise
        finally:
            txn.close()
    # leaving the lock: a record that waits for its sync (group commit) is synced by now,
    # or cut off with the error raised here (and the cached view dropped)


def _commit(files: StateFiles, txn: Txn, durable: bool, hold: Hold) -> None:
    """Commit ``txn``'s operations: one journal record, or a new snapshot. A durable record
    (and any record after one that waits for its sync) joins the lock's group commit: it is
    committed once the chain's one sync succeeds (:mod:`cni_dra.state.lock`)."""
    if not txn.ops:
        return
    state = txn.state
    entry = CACHE.get(str(files.path))
    if (
        entry is None
        or entry.state is not txn.base
        or entry.jid is None
        or entry.snap_ident is None
        or files.journal_limit_bytes <= 0
    ):
        hold.flush()  # the snapshot replaces the journal: the records waiting for a sync first
        journal.write_snapshot(files, state)
    else:
        start, synced = journal.append(files, entry, [ops.encode(op) for op in txn.ops], durable=False)
        entry.state = state  # readers from now on; those holding the old state keep it whole
        if (durable and not synced) or hold.pending:
            j_ident = entry.j_ident
            hold.join(
                sync=lambda: journal.sync(files, j_ident),
                cut=lambda: journal.cut(files, j_ident, start),
            )
        if entry.j_end > max(files.journal_limit_bytes, entry.snap_size):
            hold.flush()  # this record is committed (or cut off, and this commit fails) first
            try:  # compaction: the record above is committed whatever happens here
                journal.write_snapshot(files, state, folded=entry)
            except StateError as exc:
                _log.warning("state compaction postponed: %s", exc)
    if os.environ.get(VERIFY_ENV) == "1":
        _verify(files, state)


def _verify(files: StateFiles, state: NodeState) -> None:
    """``CNI_DRA_STATE_VERIFY=1``: the files, read from scratch, must equal ``state``."""
    if read_fresh(files).model_dump(mode="json") != state.model_dump(mode="json"):
        raise StateError(
            f"failed to write state {files.path}: the journal does not reproduce the state in memory"
        )
