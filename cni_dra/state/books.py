"""The node's books, kept as the state changes: what each device holds, without a recount.

A :class:`Books` is a derived index of a :class:`~cni_dra.state.schema.NodeState`'s
attachments and prepared claims' results, updated by :func:`cni_dra.state.ops.apply` with
each ``Put`` and ``Delete`` (O(log n) each) and ``SetClaims`` (O(that pod's results)), so
that :func:`cni_dra.state.ledger.node_usage` reads a pool's sums in O(devices) instead of
adding up every record (10,000 on a large node) at each ADD; a pool is kept twice, with
and without the prepared results (``prepared=False``).

It counts exactly as :meth:`NodeUsage.plus <cni_dra.allocator.usage.NodeUsage.plus>` does
over the charges in their order (:func:`cni_dra.state.ledger.node_charges`: attachments,
then prepared results by pod):
one charge per share, the first record naming it; a sum takes the format of its first
nonzero amount (of its last amount when all are zero). :meth:`Books.usage` answers None
for a pool it cannot count that way, and the ledger then adds the charges up: a pool with
a record that names no amount (it holds its device whole, an inventory question) or a
negative amount (a sum that returns to zero changes format), or a state with a prepared
claim that does not decode (the ledger raises why).

One :class:`Books` follows one line of states: a state made by
:meth:`~cni_dra.state.schema.NodeState.changeable_copy` shares its parent's, and the
first change of the copy moves the books on, so the parent's view is then stale
(it is counted afresh when asked). A state read from the files has none: the first
question in its line is answered by adding up (cheaper once: a plugin run in-process asks
once), the second counts the books (:func:`kept_usage`); in a serving process (the
agent's, :func:`serving`) the first counts them.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cni_dra.allocator.usage import NodeUsage
from cni_dra.quantity import Quantity

if TYPE_CHECKING:
    from cni_dra.dra.objects import Device
    from cni_dra.state.schema import Attachment, NodeState

__all__ = ["Books", "kept_usage", "put", "drop", "serving", "set_claims"]

_Rec = tuple[str, str, str, Mapping[str, Quantity], bool, Hashable | None, bool]
"""(driver, pool, device, consumed, shareID is None, share, a prepared result's) of one
attachment or prepared claim result."""

_PREPARED = 1 << 50
"""Positions of prepared results: after every attachment's, by pod (in ``claims`` order),
then by result (:func:`cni_dra.state.ledger.node_charges` order)."""
_PER_POD = 1 << 16


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
        self._pod_pos: dict[str, int] = {}  # pod UID -> its place in claims order
        self._pod_recs: dict[str, list[int]] = {}  # pod UID -> positions of its results
        self._pod_next = 0
        self._broken = False  # a prepared claim did not decode: the ledger counts (and says why)
        # (driver, pool, with the prepared results) -> what is counted there
        self._pools: dict[tuple[str, str, bool], _Pool] = {}

    @classmethod
    def of(cls, state: NodeState) -> Books:
        """The books of ``state``, counted once (O(attachments + prepared results))."""
        books = cls()
        for att in state.attachments:
            books._put(att)
        for pod in state.claims:
            books._set_claims(state, pod)
        return books

    def _set_claims(self, state: NodeState, pod: str) -> None:
        for pos in self._pod_recs.pop(pod, ()):
            self._remove(pos)
        if pod not in state.claims:
            self._pod_pos.pop(pod, None)
            return
        place = self._pod_pos.get(pod)
        if place is None:
            place = self._pod_pos[pod] = self._pod_next
            self._pod_next += 1
        try:
            claims = state.prepared(pod)
        except ValueError:  # pydantic's ValidationError too: node_charges raises it
            self._broken = True
            return
        results = [(c, r) for c in claims for r in c.results]
        if len(results) >= _PER_POD:
            self._broken = True
            return
        positions = self._pod_recs[pod] = []
        for i, (claim, res) in enumerate(results):
            if res.adminAccess:
                continue
            pos = _PREPARED + place * _PER_POD + i
            consumed = {k: _as_quantity(v) for k, v in res.consumedCapacity.items()}
            rec: _Rec = (
                res.driver,
                res.pool,
                res.device,
                consumed,
                res.shareID is None,
                (res.device, claim.uid, res.shareID),
                True,
            )
            self._add(pos, rec)
            positions.append(pos)

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
        self._add(pos, (att.driver, att.pool, att.device, consumed, att.shareID is None, share, False))

    def _views(self, rec: _Rec) -> list[_Pool]:
        """The pools ``rec`` is counted in: with the prepared results, and (an attachment's)
        without."""
        out = []
        for view in (True, False) if not rec[6] else (True,):
            pool = self._pools.get((rec[0], rec[1], view))
            if pool is None:
                pool = self._pools[(rec[0], rec[1], view)] = _Pool()
            out.append(pool)
        return out

    def _add(self, pos: int, rec: _Rec) -> None:
        self._recs[pos] = rec
        consumed, share = rec[3], rec[5]
        odd = not consumed or any(q.nanos < 0 for q in consumed.values())
        for pool in self._views(rec):
            if odd:
                pool.odd += 1
            if share is None:
                self._count(pool, pos, rec, +1)
                continue
            members = pool.shares.setdefault(share, [])
            insort(members, pos)
            if members[0] == pos:  # the share's first record now: it holds the share
                if len(members) > 1:
                    self._count(pool, members[1], self._recs[members[1]], -1)
                self._count(pool, pos, rec, +1)

    def _remove(self, pos: int) -> None:
        rec = self._recs.pop(pos)
        consumed, share = rec[3], rec[5]
        odd = not consumed or any(q.nanos < 0 for q in consumed.values())
        for pool in self._views(rec):
            if odd:
                pool.odd -= 1
            if share is None:
                self._count(pool, pos, rec, -1)
                continue
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
    def _usage(
        self, driver: str, pool: str, devices: Mapping[str, Device], prepared: bool
    ) -> NodeUsage | None:
        if self._broken:
            return None
        books = self._pools.get((driver, pool, prepared))
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


def kept_usage(
    state: NodeState, driver: str, pool: str, devices: Mapping[str, Device], *, prepared: bool = True
) -> NodeUsage | None:
    """What ``state``'s attachments (and, with ``prepared``, its prepared claims' results) on
    (``driver``, ``pool``) hold, as ``NodeUsage().plus`` of their charges in order gives it,
    from the books (counted first when ``state`` has none current: O(records), once per
    line of states); None when the pool must be counted charge by charge (module docstring)."""
    private = _private(state)
    got = private.get("_books")
    if isinstance(got, tuple):
        books, version = got
        with books.lock:
            if books.version == version:
                return books._usage(driver, pool, devices, prepared)  # type: ignore[no-any-return]  # noqa: SLF001
    elif got is None and not _serving:  # the first question in this line of states: adding
        private["_books"] = _ASKED  # up once is cheaper than counting the books (a plugin run
        return None  # in-process asks once; a serving process counts them at once: serving())
    books = Books.of(state)
    _private(state)["_books"] = (books, books.version)
    with books.lock:
        return books._usage(driver, pool, devices, prepared)  # noqa: SLF001 - this module's own


_ASKED = "asked"
"""``NodeState._books`` of a line of states asked once: the next question counts the books."""

_serving = False


def serving() -> None:
    """This process serves many requests (the agent's): the first question of a line of
    states counts its books at once instead of adding up first, since the next ADD asks
    again (at 10,000 attachments: adding up ≈ 5 ms, then counting ≈ 24 ms, in each
    process, during the first two ADDs it serves after reading the state)."""
    global _serving  # one switch per process, set once before serving
    _serving = True


def _change(state: NodeState, change: Callable[[Books], None]) -> None:
    private = _private(state)
    got = private.get("_books")
    if not isinstance(got, tuple):
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


def set_claims(state: NodeState, pod: str) -> None:
    """Keep ``state``'s books (if any) as pod ``pod``'s prepared claims are set (already
    in ``state.claims``)."""
    _change(state, lambda books: books._set_claims(state, pod))  # noqa: SLF001 - this module's own


def drop(state: NodeState, key: tuple[str, str, str]) -> None:
    """Keep ``state``'s books (if any) as the attachment with ``key`` is unlisted."""
    _change(state, lambda books: books._drop(key))  # noqa: SLF001 - this module's own
