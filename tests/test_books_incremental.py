"""The books kept as the state changes equal a recount after any sequence of changes.

:func:`cni_dra.state.ledger.node_usage` reads what the devices hold from the books that
:func:`cni_dra.state.ops.apply` keeps (:mod:`cni_dra.state.books`). The property drives
random sequences of ADDs (new attachments), updates, releases, prepared claims, abandoned
transactions and reads of older states, and compares every answer with totals this test
keeps itself: its own list of records in order, summed by its own rules (one holding per
share, the first record naming it; a sum takes the format of the amount added while it
was zero), amounts and formats both.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_dra.dra.objects import Device
from cni_dra.quantity import Quantity
from cni_dra.state import Attachment, NodeState, Txn
from cni_dra.state.books import kept_usage
from cni_dra.state.ledger import node_usage
from tests import builders

DRIVER, POOL = "d", "p"
INVENTORY = {
    "a": Device.model_validate(
        {"name": "a", "allowMultipleAllocations": True, "capacity": {"bandwidth": {"value": "10Gi"}}}
    ),
    "x": Device.model_validate({"name": "x", "capacity": {"bandwidth": {"value": "1G"}}}),
}

amounts = st.sampled_from(
    [
        {"bandwidth": "1G"},
        {"bandwidth": "1Gi"},
        {"bandwidth": "1e9"},
        {"bandwidth": "0"},
        {"bandwidth": "0Ki"},
        {"bandwidth": "500M", "pps": "2k"},
        {"pps": "1Ki"},
    ]
)
odd_amounts = st.sampled_from([{}, {"bandwidth": "-1G"}])  # whole device; negative: counted charge by charge
record = st.tuples(
    st.integers(min_value=0, max_value=7),  # which container
    st.sampled_from(["a", "b", "x"]),  # device ("b": not in the inventory)
    st.sampled_from([(DRIVER, POOL), (DRIVER, "q")]),
    st.one_of(*[amounts] * 9, odd_amounts),
    st.sampled_from([None, "s1", "s2"]),  # shareID
    st.sampled_from([None, "u1", "u2"]),  # claim UID
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("put"), record),
        st.tuples(st.just("del"), st.integers(min_value=0, max_value=7)),
        st.tuples(st.just("claims"), st.sampled_from(["p1", "p2"]), st.lists(amounts, max_size=2)),
        st.tuples(st.just("commit")),
        st.tuples(st.just("abandon")),
        st.tuples(st.just("old")),
    ),
    max_size=40,
)


def _attachment(rec: tuple[Any, ...]) -> Attachment:
    cid, device, (driver, pool), consumed, share_id, uid = rec
    return builders.attachment(
        f"c{cid}",
        device,
        network="n",
        driver=driver,
        pool=pool,
        parent=device,
        phase="adding",
        consumedCapacity=consumed,
        shareID=share_id,
        claim=None if uid is None else {"uid": uid, "name": uid, "namespace": "ns", "request": "r"},
    )


def _claim(uid: str, results: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "ns"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": f"r{i}",
                            "driver": DRIVER,
                            "pool": POOL,
                            "device": "a",
                            "shareID": f"s{i}",
                            "consumedCapacity": amount,
                        }
                        for i, amount in enumerate(results)
                    ]
                }
            }
        },
    }


class OwnBooks:
    """This test's records: attachments in the order they were first recorded, and claims."""

    def __init__(self) -> None:
        self.atts: dict[int, tuple[Any, ...]] = {}
        self.claims: dict[str, list[dict[str, str]]] = {}

    def copy(self) -> OwnBooks:
        new = OwnBooks()
        new.atts, new.claims = dict(self.atts), dict(self.claims)
        return new

    def totals(
        self, devices: dict[str, Device], prepared: bool = True
    ) -> dict[tuple[str, str], tuple[int, str]] | None:
        """(device, capacity) -> (nano-units, format); None when a record is one the test
        does not model (no amount, a negative one)."""
        held: list[tuple[str, dict[str, str]]] = []
        seen: set[tuple[Any, ...]] = set()
        for _cid, device, where, consumed, share_id, uid in self.atts.values():
            if where != (DRIVER, POOL):
                continue
            if not consumed or any(v.startswith("-") for v in consumed.values()):
                return None
            if uid is not None:
                if (device, uid, share_id) in seen:
                    continue
                seen.add((device, uid, share_id))
            held.append((device, consumed))
        for pod in self.claims if prepared else ():
            for i, amount in enumerate(self.claims[pod]):
                if ("a", pod, f"s{i}") not in seen:
                    seen.add(("a", pod, f"s{i}"))
                    held.append(("a", amount))
        out: dict[tuple[str, str], tuple[int, str]] = {}
        for device, consumed in held:
            for cap, text in consumed.items():
                q = Quantity.parse(text)
                n, fmt = out.get((device, cap), (0, ""))
                out[(device, cap)] = (n + q.nanos, q.format if n == 0 else fmt)
        return out


def _product(
    state: NodeState, devices: dict[str, Device], prepared: bool = True
) -> dict[tuple[str, str], tuple[int, str]]:
    usage = node_usage(state, DRIVER, POOL, devices, prepared=prepared)
    return {(d, c): (q.nanos, q.format) for d, caps in usage.consumed.items() for c, q in caps.items()}


@settings(max_examples=300, deadline=None)
@given(steps=steps, with_inventory=st.booleans())
def test_kept_books_equal_a_recount_after_any_sequence(steps: list[Any], with_inventory: bool) -> None:
    devices = INVENTORY if with_inventory else {}
    state, own = NodeState(), OwnBooks()
    txn, mine = Txn(state), own.copy()
    older: list[tuple[NodeState, OwnBooks]] = []
    for step in steps:
        if step[0] == "put":
            rec = step[1]
            txn.put(_attachment(rec))
            mine.atts[rec[0]] = rec
        elif step[0] == "del":
            txn.remove("n", f"c{step[1]}", "eth0")
            mine.atts.pop(step[1], None)
        elif step[0] == "claims":
            _, pod, results = step
            txn.set_claims(pod, [_claim(pod, results)] if results else None)
            if results:
                mine.claims[pod] = results
            else:
                mine.claims.pop(pod, None)
        elif step[0] == "commit":  # what a commit does: the transaction's state is the current one
            older.append((state, own))
            state, own = txn.state, mine
            txn, mine = Txn(state), own.copy()
        elif step[0] == "abandon":  # a transaction that raised: its changes are dropped
            txn, mine = Txn(state), own.copy()
        else:  # a reader still holding an older state (its books have moved on)
            if older:
                old_state, old_own = older[0]
                expected = old_own.totals(devices)
                if expected is not None:
                    assert _product(old_state, devices) == expected
        for prepared in (True, False):
            expected = mine.totals(devices, prepared)
            if expected is not None:
                assert _product(txn.state, devices, prepared) == expected


def test_a_state_whose_books_moved_on_is_counted_again() -> None:
    """Two changes made from one state: the second line's books do not carry the first's."""
    txn = Txn(NodeState())
    txn.put(_attachment((9, "a", (DRIVER, POOL), {"bandwidth": "5G"}, None, None)))
    base = txn.state
    kept_usage(base, DRIVER, POOL, {})  # asked once: added up
    assert kept_usage(base, DRIVER, POOL, {}) is not None  # the books of base, shared by its copies
    txn = Txn(base)
    txn.put(_attachment((0, "a", (DRIVER, POOL), {"bandwidth": "1G"}, None, None)))
    one = txn.state
    txn = Txn(base)
    txn.put(_attachment((1, "a", (DRIVER, POOL), {"bandwidth": "3G"}, None, None)))
    two = txn.state

    def held(state: NodeState) -> dict[str, Any]:
        usage = kept_usage(state, DRIVER, POOL, {}) or kept_usage(state, DRIVER, POOL, {})
        assert usage is not None
        return dict(usage.consumed)

    assert held(two) == {"a": {"bandwidth": Quantity.parse("8G")}}
    assert held(one) == {"a": {"bandwidth": Quantity.parse("6G")}}
    assert held(base) == {"a": {"bandwidth": Quantity.parse("5G")}}


def test_an_attachment_with_no_amount_is_counted_charge_by_charge() -> None:
    """The books cannot hold a whole device (an inventory question): the pool is added up."""
    txn = Txn(NodeState())
    txn.put(_attachment((0, "a", (DRIVER, POOL), {}, "s1", None)))
    assert kept_usage(txn.state, DRIVER, POOL, INVENTORY) is None  # asked once: added up
    assert kept_usage(txn.state, DRIVER, POOL, INVENTORY) is None  # the books cannot
    assert node_usage(txn.state, DRIVER, POOL, INVENTORY).consumed == {
        "a": {"bandwidth": Quantity.parse("10Gi")}
    }


index_steps = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=5),  # container; with "del" below, removed instead
        st.sampled_from(["a", "b"]),
        st.sampled_from(["macvlan", "ipvlan", "other"]),
        st.sampled_from(["adding", "ready", "deleting"]),
        st.booleans(),  # remove instead of record
        st.booleans(),  # commit after this step (a new transaction from its state)
        st.sampled_from([None, "s1"]),  # shareID
        st.sampled_from([None, "u1", "u2"]),  # claim UID
    ),
    max_size=30,
)


def _scan_kinds(state: NodeState) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for a in state.attachments:
        if (a.driver, a.pool) == (DRIVER, POOL):
            slot = out.setdefault(a.device, {})
            slot[a.linkType] = slot.get(a.linkType, 0) + 1
    return out


@settings(max_examples=200, deadline=None)
@given(steps=index_steps)
def test_the_attachments_indexes_equal_a_scan(steps: list[Any]) -> None:
    """Link types per device, the intents and the attachments of each share, kept by each
    change, equal a scan of the attachments, in the state changed and in every earlier state (copies share them)."""
    from cni_dra.attach.placement import link_type_conflicts

    txn = Txn(NodeState())
    seen: list[tuple[NodeState, dict[str, dict[str, int]], set[tuple[str, str, str]]]] = []
    for cid, device, kind, phase, remove, commit, share_id, uid in steps:
        if remove:
            txn.remove("n", f"c{cid}", "eth0")
        else:
            att = _attachment((cid, device, (DRIVER, POOL), {"bandwidth": "1G"}, share_id, uid))
            txn.put(att.model_copy(update={"linkType": kind, "phase": phase}))
        state = txn.state
        kinds = {d: dict(k) for d, k in state.attachments.kinds_by_device(DRIVER, POOL).items()}
        assert kinds == _scan_kinds(state)
        intents = {a.key for a in state.attachments.intents()}
        assert intents == {a.key for a in state.attachments if a.phase != "ready"}
        keys = {a.share_key() for a in state.attachments} - {None}
        for key in keys | {(DRIVER, POOL, "a", "u9", "r", None)}:
            assert state.attachments.sharing(key) == [a for a in state.attachments if a.share_key() == key]
        for want in ("macvlan", "ipvlan"):
            assert link_type_conflicts(state.attachments, want, DRIVER, POOL) == link_type_conflicts(
                list(state.attachments), want, DRIVER, POOL
            )
        if commit:  # the state handed on stays as it is while its copies change
            seen.append((state, kinds, intents))
            txn = Txn(state)
    for state, kinds, intents in seen:
        if state is not txn.state:
            assert {d: dict(k) for d, k in state.attachments.kinds_by_device(DRIVER, POOL).items()} == kinds
            assert {a.key for a in state.attachments.intents()} == intents


def _elsewhere(path: str, cid: int, amount: str, limit: int) -> None:
    """Another process records an attachment (``limit``: its store's journal limit; 1
    folds the journal into a new snapshot at once)."""
    from cni_dra.state import StateStore
    from cni_dra.state import cache as state_cache

    state_cache.CACHE.clear()
    with StateStore(path, journal_limit_bytes=limit).transaction() as txn:
        txn.put(_attachment((cid, "a", (DRIVER, POOL), {"bandwidth": amount}, None, None)))


def _in_another_process(*args: Any) -> None:
    import multiprocessing

    proc = multiprocessing.get_context("fork").Process(target=_elsewhere, args=args)
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0


def test_a_warm_process_books_see_what_other_processes_wrote(tmp_path, monkeypatch) -> None:
    """Appended records, a compaction taken up, and a snapshot written by someone else
    (decoded afresh) all reach what node_usage answers in a process that kept its books."""
    from cni_dra.state.store import StateStore, encode_state

    monkeypatch.delenv("CNI_DRA_STATE_VERIFY", raising=False)
    store = StateStore(tmp_path, journal_limit_bytes=10**9)
    with store.transaction() as txn:
        txn.put(_attachment((0, "a", (DRIVER, POOL), {"bandwidth": "1G"}, None, None)))
    for i in (1, 2, 3):  # a journal longer than the snapshot
        with store.transaction() as txn:
            txn.update(("n", "c0", "eth0"), phase="ready" if i % 2 else "adding")

    def held() -> Quantity:
        with store.transaction() as txn:
            return node_usage(txn.state, DRIVER, POOL, {}).consumed["a"]["bandwidth"]

    assert held() == Quantity.parse("1G")  # the books are counted here, and kept
    _in_another_process(str(tmp_path), 1, "2G", 10**9)  # appended
    assert held() == Quantity.parse("3G")
    _in_another_process(str(tmp_path), 2, "4G", 1)  # appended, then folded into a new snapshot
    assert held() == Quantity.parse("7G")
    (tmp_path / "state.json").write_bytes(
        encode_state(
            NodeState(attachments=[_attachment((5, "a", (DRIVER, POOL), {"bandwidth": "5G"}, None, None))])
        )
    )
    assert held() == Quantity.parse("5G")


def test_the_attachments_of_a_share_keep_their_order_when_one_is_updated() -> None:
    txn = Txn(NodeState())
    for cid in (0, 1, 2):
        txn.put(_attachment((cid, "a", (DRIVER, POOL), {"bandwidth": "1G"}, "s1", "u1")))
    share = (DRIVER, POOL, "a", "u1", "r", "s1")
    txn.update(("n", "c0", "eth0"), phase="deleting")  # in its place
    assert [a.containerID for a in txn.state.attachments.sharing(share)] == ["c0", "c1", "c2"]
    txn.update(("n", "c1", "eth0"), shareID="s2")  # to another share, keeping its place
    txn.update(("n", "c1", "eth0"), shareID="s1")
    assert [a.containerID for a in txn.state.attachments.sharing(share)] == ["c0", "c1", "c2"]


def test_the_first_question_adds_up_and_the_second_counts_the_books(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin run in-process asks once: it does not pay for books it would not use."""
    from cni_dra.state import books

    # as in a plugin run in-process (a test that started a fast-path server in this
    # process turned the serving mode on)
    monkeypatch.setattr(books, "_serving", False)
    txn = Txn(NodeState())
    txn.put(_attachment((0, "a", (DRIVER, POOL), {"bandwidth": "1G"}, None, None)))
    state = txn.state
    assert kept_usage(state, DRIVER, POOL, {}) is None
    txn = Txn(state)
    txn.put(_attachment((1, "a", (DRIVER, POOL), {"bandwidth": "2G"}, None, None)))
    usage = kept_usage(txn.state, DRIVER, POOL, {})  # a copy of a state asked before
    assert usage is not None and usage.consumed == {"a": {"bandwidth": Quantity.parse("3G")}}


def test_a_serving_process_counts_the_books_at_the_first_question(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin run in-process adds up once (cheaper than counting books it will not ask
    again); a serving process (:func:`cni_dra.state.books.serving`, the agent's) counts
    them at the first question: one walk of the attachments for a line of states, not two."""
    from cni_dra.state import books
    from cni_dra.state.schema import Attachments

    txn = Txn(NodeState())
    for cid in range(50):
        txn.put(_attachment((cid, "a", (DRIVER, POOL), {"bandwidth": "1G"}, None, None)))
    dumped = txn.state.model_dump(mode="json")
    walked: list[int] = []
    real_iter = Attachments.__iter__

    def counting(self: Attachments) -> Any:
        walked.append(len(self))
        return real_iter(self)

    monkeypatch.setattr(Attachments, "__iter__", counting)
    monkeypatch.setattr(books, "_serving", False)
    answers = []
    for serving in (False, True):
        if serving:
            books.serving()
        walked.clear()
        state = NodeState.model_validate(dumped)  # as read from the files: no books yet
        answers.append([_product(state, INVENTORY) for _ in range(3)])  # three ADDs' questions
        assert walked == ([50] if serving else [50, 50])
    assert answers[0] == answers[1]
