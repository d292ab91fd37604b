"""The attachments' books, kept as the state changes: what each device holds, without a recount.

A :class:`Books` is a derived index of a :class:`~cni_dra.state.schema.NodeState`'s
attachments, updated by :func:`cni_dra.state.ops.apply` with each ``Put`` and ``Delete``
(O(log n) each), so that :func:`cni_dra.state.ledger.node_usage` reads a pool's sums in
O(devices) instead of adding up every attachment (10,000 on a large node) at each ADD.

It counts exactly as :meth:`NodeUsage.plus <cni_dra.allocator.usage.NodeUsage.plus>` does
over the attachments' charges in their order (:func:`cni_dra.state.ledger.node_charges`):
one charge per share, the first record naming it; a sum takes the format of its first
nonzero amount (of its last amount when all are zero). :meth:`Books.usage` answers None
for a pool it cannot count that way, and the ledger then adds the charges up: a pool with
an attachment that records no amount (it holds its device whole, an inventory question)
or a negative amount (a sum that returns to zero changes format).

One :class:`Books` follows one line of states: a state made by
:meth:`~cni_dra.state.schema.NodeState.changeable_copy` shares its parent's, and the
first change of the copy moves the books on, so the parent's view is then stale
(it is counted afresh when asked). A state read from the files has none until it is
first asked (:func:`attachment_usage`).
"""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cni_dra.allocator.usage import NodeUsage
from cni_dra.dra.objects import Device
from cni_dra.quantity import Quantity

if TYPE_CHECKING:
    from cni_dra.state.schema import Attachment, NodeState

__all__ = ["Books", "attachment_usage", "put", "drop"]

_Rec = tuple[str, str, str, Mapping[str, Quantity], bool, Hashable | None]
"""(driver, pool, device, consumed, shareID is None, share) of one attachment."""


@dataclass
class _Slot:
    """One device's counted charges: how many, how many without a shareID, and per
    capacity the nano-unit sum and the positions of its nonzero and zero amounts (sorted)."""

    counted: int = 0
    unshared: int = 0
    sums: dict[str, int] = field(default_factory=dict)
    nonzero: dict[str, list[int]] = field(default_factory=dict)
    zero: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class _Pool:
    slots: dict[str, _Slot] = field(default_factory=dict)
    shares: dict[Hashable, list[int]] = field(default_factory=dict)  # share -> members' positions, sorted
    odd: int = 0  # attachments this index cannot count (module docstring): recount while any


def _as_quantity(v: object) -> Quantity:
    return v if type(v) is Quantity else Quantity.parse(v)  # type: ignore[arg-type]


class Books:
    """The index (module docstring). Every method takes :attr:`lock`'s protection itself."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 0
        self._pos: dict[tuple[str, str, str], int] = {}  # attachment key -> position (its order)
        self._recs: dict[int, _Rec] = {}
        self._next = 0
        self._pools: dict[tuple[str, str], _Pool] = {}

    @classmethod
    def of(cls, state: NodeState) -> Books:
        """The books of ``state``'s attachments, counted once (O(attachments))."""
        books = cls()
        for att in state.attachments:
            books._put(att)
        return books

    # -- changes (under the lock, by put/drop) -----------------------------------------------
    def _put(self, att: Attachment) -> None:
        key = att.key
        pos = self._pos.get(key)
        if pos is None:
            pos = self._pos[key] = self._next
            self._next += 1
        else:
            self._remove(pos)
        claim = att.claim
        consumed = {k: _as_quantity(v) for k, v in att.consumedCapacity.items()}
        share = None if claim is None else (att.device, claim.uid, att.shareID)
        rec: _Rec = (att.driver, att.pool, att.device, consumed, att.shareID is None, share)
        self._recs[pos] = rec
        pool = self._pools.get((att.driver, att.pool))
        if pool is None:
            pool = self._pools[(att.driver, att.pool)] = _Pool()
        if not consumed or any(q.nanos < 0 for q in consumed.values()):
            pool.odd += 1
        if share is None:
            self._count(pool, pos, rec, +1)
            return
        members = pool.shares.setdefault(share, [])
        insort(members, pos)
        if members[0] == pos:  # the share's first record now: it holds the share
            if len(members) > 1:
                self._count(pool, members[1], self._recs[members[1]], -1)
            self._count(pool, pos, rec, +1)

    def _remove(self, pos: int) -> None:
        rec = self._recs.pop(pos)
        driver, pool_name, _device, consumed, _unshared, share = rec
        pool = self._pools[(driver, pool_name)]
        if not consumed or any(q.nanos < 0 for q in consumed.values()):
            pool.odd -= 1
        if share is None:
            self._count(pool, pos, rec, -1)
            return
        members = pool.shares[share]
        first = members[0] == pos
        del members[bisect_left(members, pos)]
        if first:
            self._count(pool, pos, rec, -1)
            if members:
                self._count(pool, members[0], self._recs[members[0]], +1)
        if not members:
            del pool.shares[share]

    def _drop(self, key: tuple[str, str, str]) -> None:
        pos = self._pos.pop(key, None)
        if pos is not None:
            self._remove(pos)

    @staticmethod
    def _count(pool: _Pool, pos: int, rec: _Rec, sign: int) -> None:
        device, consumed, unshared = rec[2], rec[3], rec[4]
        slot = pool.slots.get(device)
        if slot is None:
            slot = pool.slots[device] = _Slot()
        slot.counted += sign
        slot.unshared += sign if unshared else 0
        for name, q in consumed.items():
            n = q.nanos
            where = (slot.nonzero if n else slot.zero).setdefault(name, [])
            if sign > 0:
                insort(where, pos)
                slot.sums[name] = slot.sums.get(name, 0) + n
            else:
                del where[bisect_left(where, pos)]
                slot.sums[name] -= n
                if not where:
                    del (slot.nonzero if n else slot.zero)[name]
                if name not in slot.nonzero and name not in slot.zero:
                    del slot.sums[name]
        if slot.counted == 0:
            del pool.slots[device]

    # -- reading -------------------------------------------------------------------------------
    def _usage(self, driver: str, pool: str, devices: Mapping[str, Device]) -> NodeUsage | None:
        books = self._pools.get((driver, pool))
        if books is None:
            return NodeUsage()
        if books.odd:
            return None
        consumed: dict[str, dict[str, Quantity]] = {}
        dedicated: set[str] = set()
        shared: set[str] = set()
        for name, slot in books.slots.items():
            dev = devices.get(name)
            if dev is not None:
                (shared if dev.shared else dedicated).add(name)
            else:  # judged by each record's shareID, as the ledger does
                if slot.unshared:
                    dedicated.add(name)
                if slot.unshared < slot.counted:
                    shared.add(name)
            caps: dict[str, Quantity] = {}
            for cap, n in slot.sums.items():
                nz = slot.nonzero.get(cap)
                first = nz[0] if nz else slot.zero[cap][-1]
                caps[cap] = Quantity.from_nanos(n, self._recs[first][3][cap].format)
            consumed[name] = caps
        return NodeUsage(consumed, frozenset(dedicated), frozenset(shared), frozenset(books.shares))


def _private(state: NodeState) -> dict[str, Any]:
    private = state.__pydantic_private__
    assert private is not None  # NodeState has private attributes
    return private


def attachment_usage(
    state: NodeState, driver: str, pool: str, devices: Mapping[str, Device]
) -> NodeUsage | None:
    """What the attachments of ``state`` on (``driver``, ``pool``) hold, as ``NodeUsage().plus``
    of their charges in order gives it, from the books (counted first when ``state`` has
    none current: O(attachments), once per line of states); None when the pool must be
    counted charge by charge (module docstring)."""
    got = _private(state).get("_books")
    if got is not None:
        books, version = got
        with books.lock:
            if books.version == version:
                return books._usage(driver, pool, devices)  # type: ignore[no-any-return]  # noqa: SLF001
    books = Books.of(state)
    _private(state)["_books"] = (books, books.version)
    with books.lock:
        return books._usage(driver, pool, devices)  # noqa: SLF001 - this module's own


def _change(state: NodeState, change: Callable[[Books], None]) -> None:
    private = _private(state)
    got = private.get("_books")
    if got is None:
        return
    books, version = got
    with books.lock:
        if books.version != version:  # another line moved on: this state counts afresh when asked
            private["_books"] = None
            return
        change(books)
        books.version += 1
        private["_books"] = (books, books.version)


def put(state: NodeState, att: Attachment) -> None:
    """Keep ``state``'s books (if any) as ``att`` is recorded (:func:`cni_dra.state.ops.apply`)."""
    _change(state, lambda books: books._put(att))  # noqa: SLF001 - this module's own


def drop(state: NodeState, key: tuple[str, str, str]) -> None:
    """Keep ``state``'s books (if any) as the attachment with ``key`` is unlisted."""
    _change(state, lambda books: books._drop(key))  # noqa: SLF001 - this module's own
