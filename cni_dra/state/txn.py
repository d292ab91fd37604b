"""Transactions: a read-modify-write of the state under the lock, committed as one journal record.

:func:`transaction` (behind :meth:`StateStore.transaction <cni_dra.state.store.StateStore.transaction>`)
yields the state; when the block exits normally and the state changed it commits one
journal record (or a new snapshot), and writes nothing when the block raises. What a
transaction changed is read off the state (:class:`Before`): the attachment list's own log
(:class:`~cni_dra.state.models.AttachmentList`), the attachments whose fields were assigned
(:data:`~cni_dra.state.models.TOUCHED`), the identities of the prepared claim lists and
status records, and ``bootID``; a change it cannot express as ops (attachments reordered)
is written as a new snapshot. ``CNI_DRA_STATE_VERIFY=1`` (the test suites set it) re-reads
the files after every commit and fails if they differ from memory. Any failure drops the
process's cached state.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from cni_dra.errors import StateError
from cni_dra.state import journal
from cni_dra.state.cache import CACHE
from cni_dra.state.codec import boot_op, claims_op, del_op, put_op, status_op
from cni_dra.state.models import TOUCHED, NodeState

if TYPE_CHECKING:
    from cni_dra.state.store import StateStore

__all__ = ["VERIFY_ENV", "Before", "transaction"]

VERIFY_ENV = "CNI_DRA_STATE_VERIFY"

_log = logging.getLogger("cni_dra.state.store")


def _ids(items: list[Any]) -> tuple[int, ...]:
    return tuple(map(id, items))


class Before:
    """What a transaction started from, to tell what it changed (module docstring): the
    attachment list's own log (:class:`~cni_dra.state.models.AttachmentList`), the
    attachments whose fields were assigned (:data:`~cni_dra.state.models.TOUCHED`), the
    identities of the prepared-claim lists and status records, and ``bootID``. O(change)
    except for the claims (O(pods with claims))."""

    def __init__(self, state: NodeState) -> None:
        self.list = state.attachments
        index = self.list.by_key()
        self.touched_outside = any(index.get(a.key) is a for a in TOUCHED.values())
        TOUCHED.clear()
        self.list.begin()
        self.claims = {uid: (id(lst), _ids(lst)) for uid, lst in state.claims.items()}
        self.status = (id(state.statusUpdates), _ids(state.statusUpdates))
        self.boot = state.bootID
        self.schema = state.schemaVersion

    def ops(self, state: NodeState) -> list[bytes] | None:
        """The encoded journal ops from this start to ``state``; None when they cannot say it
        (the list replaced or reordered, or another schema): write a snapshot then."""
        atts = state.attachments
        if atts is not self.list or atts.reordered or state.schemaVersion != self.schema:
            return None
        ops: list[bytes] = []
        added: set[int] = set()
        for is_add, att in atts.events:
            if is_add:
                added.add(id(att))
                ops.append(put_op(att))
            else:
                ops.append(del_op(att.key))
        index = atts.by_key()  # added ones were serialised just now, with their later changes
        for att in list(TOUCHED.values()):
            if id(att) not in added and index.get(att.key) is att:
                ops.append(put_op(att))
        for uid in self.claims.keys() | state.claims.keys():
            lst = state.claims.get(uid)
            now = (id(lst), _ids(lst)) if lst is not None else None
            if now != self.claims.get(uid):
                ops.append(claims_op(uid, lst))
        if (id(state.statusUpdates), _ids(state.statusUpdates)) != self.status:
            ops.append(status_op(state.statusUpdates))
        if state.bootID != self.boot:
            ops.append(boot_op(state.bootID))
        return ops



@contextlib.contextmanager
def transaction(store: StateStore, durable: bool) -> Iterator[NodeState]:
    """See :meth:`cni_dra.state.store.StateStore.transaction`."""
    key = str(store.path)
    with store.locked():
        state = store._read_unlocked()
        before = Before(state)
        if before.touched_outside:  # changed outside a transaction: the cache is not the disk
            CACHE.pop(key, None)
            state = store._read_unlocked()
            before = Before(state)
        ok = False
        try:
            yield state
            ok = True
        finally:
            if not ok:
                CACHE.pop(key, None)
                TOUCHED.clear()
        try:
            _commit(store, state, before, durable)
        except BaseException:
            CACHE.pop(key, None)
            raise
        finally:
            TOUCHED.clear()


def _commit(store: StateStore, state: NodeState, before: Before, durable: bool = True) -> None:
    key = str(store.path)
    entry = CACHE.get(key)
    ops = before.ops(state)
    if ops is not None and not ops:
        return
    if (
        ops is None
        or entry is None
        or entry.state is not state
        or entry.jid is None
        or entry.snap_ident is None
        or store.journal_limit_bytes <= 0
    ):
        journal.write_snapshot(store, state)
    else:
        journal.append(store, entry, ops, durable)
        if entry.j_end > max(store.journal_limit_bytes, entry.snap_size):
            try:  # compaction: the record above is committed whatever happens here
                journal.write_snapshot(store, state)
            except StateError as exc:
                _log.warning("state compaction postponed: %s", exc)
    if os.environ.get(VERIFY_ENV) == "1":
        _verify(store, state)


def _verify(store: StateStore, state: NodeState) -> None:
    """``CNI_DRA_STATE_VERIFY=1``: the files, read from scratch, must equal ``state``."""
    if store.read_files().model_dump(mode="json") != state.model_dump(mode="json"):
        raise StateError(
            f"failed to write state {store.path}: the journal does not reproduce the state in memory "
            "(a change made without assigning a field?)"
        )

