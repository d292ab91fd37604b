"""The attachments' index is copied at the cost of what changed, and keeps ``dict``'s order.

:class:`cni_dra.state.cowmap.CowMap` against a plain ``dict`` over random sequences of
puts, removals and copies (each copy changed on its own, the ones made before checked
again later), with folds forced often; and a transaction on a large node, whose copy of
the state must not copy its attachments (measured in bytes allocated, not in time).
"""

from __future__ import annotations

import tracemalloc
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cni_dra.state import NodeState, Txn, cowmap
from cni_dra.state.cowmap import CowMap
from tests import builders

keys = st.integers(min_value=0, max_value=12)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("set"), keys, st.integers()),
        st.tuples(st.just("pop"), keys),
        st.tuples(st.just("copy")),  # go on with a copy; the map before it is kept, unchanged
        st.tuples(st.just("back"), st.integers(min_value=0, max_value=30)),  # a copy of an older map
    ),
    max_size=80,
)


def _check(m: CowMap[int, int], model: dict[int, int]) -> None:
    assert list(m.items()) == list(model.items())
    assert list(m) == list(model) and list(m.values()) == list(model.values())
    assert len(m) == len(model)
    for k in range(14):
        assert (k in m) == (k in model)
        assert m.get(k) == model.get(k)


@settings(max_examples=400, deadline=None)
@given(steps=steps, start=st.lists(keys, max_size=10, unique=True), fold_min=st.sampled_from([0, 2, 64]))
def test_a_cowmap_reads_as_a_dict_after_any_sequence(
    steps: list[Any], start: list[int], fold_min: int
) -> None:
    saved = cowmap.FOLD_MIN
    cowmap.FOLD_MIN = fold_min  # folds at every copy, often, or never in these sizes
    try:
        m, model = CowMap((k, -k - 1) for k in start), {k: -k - 1 for k in start}
        older: list[tuple[CowMap[int, int], dict[int, int]]] = []
        for step in steps:
            if step[0] == "set":
                m.set(step[1], step[2])
                model[step[1]] = step[2]
            elif step[0] == "pop":
                assert m.pop(step[1]) == model.pop(step[1], None)
            elif step[0] == "copy":
                older.append((m, dict(model)))
                m, model = m.copy(), dict(model)
            elif older:
                m, model = older[step[1] % len(older)]
                m, model = m.copy(), dict(model)
            _check(m, model)
        for old, old_model in older:  # a copy changed after it was made leaves the original as it was
            _check(old, old_model)
    finally:
        cowmap.FOLD_MIN = saved


def test_a_removed_key_put_again_goes_last_as_in_a_dict() -> None:
    m = CowMap([(1, "a"), (2, "b"), (3, "c")])
    m.set(2, "B")  # in place
    m.pop(1)
    m.set(1, "A")  # removed, then put again: last
    assert list(m.items()) == [(2, "B"), (3, "c"), (1, "A")]
    assert list(m.copy().items()) == [(2, "B"), (3, "c"), (1, "A")]


def _node(n: int) -> NodeState:
    """A state of ``n`` attachments read from its files, as the agent holds it: half of
    them claim-mode, each its own share (so the share index has as many entries)."""
    txn = Txn(NodeState())
    for i in range(n):
        claim = {"uid": f"u{i}", "name": f"c{i}", "namespace": "ns", "request": "r"} if i % 2 else None
        txn.put(builders.attachment(f"seed{i}", shareID=f"s{i}" if claim else None, claim=claim))
    return NodeState.model_validate(txn.state.model_dump(mode="json"))


def _bytes_allocated(fn: Any) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_transaction_on_a_large_node_does_not_copy_its_attachments() -> None:
    """A change to one attachment of 4,000 allocates what a node of 10 would (a copy of the
    attachments' index and of the shares' index alone was about 300 KB here); the same for
    a record replayed from the journal (:func:`cni_dra.state.journal.replay` copies too)."""
    big, small = _node(4000), _node(10)

    def change(state: NodeState) -> None:
        txn = Txn(state)
        txn.remove("net1", "seed3", "eth0")
        txn.put(
            builders.attachment(
                "new", shareID="s", claim={"uid": "u", "name": "c", "namespace": "ns", "request": "r"}
            )
        )

    change(big)  # warm: the first call's imports and caches
    change(small)
    assert _bytes_allocated(lambda: change(big)) < _bytes_allocated(lambda: change(small)) + 32_000
    assert _bytes_allocated(big.changeable_copy) < 16_000


def test_a_line_of_transactions_folds_its_changes_once_per_many() -> None:
    """Copies of copies keep their changes apart from the shared base until they are many,
    then a copy folds them in: every copy stays small, folds are rare, and the order is a
    dict's."""
    state = _node(200)
    expected = [a.key for a in state.attachments]
    bases: list[dict[Any, Any]] = []  # kept: an id is unique only while its object lives
    for i in range(300):
        txn = Txn(state)
        txn.put(builders.attachment(f"n{i}"))
        if i < 200:
            txn.remove("net1", f"seed{i}", "eth0")
            expected.remove(("net1", f"seed{i}", "eth0"))
        expected.append(("net1", f"n{i}", "eth0"))
        state = txn.state
        index = state.attachments._by_key
        assert index.changes() <= 2 * cowmap.FOLD_MIN
        if not bases or bases[-1] is not index._parts[0]:
            bases.append(index._parts[0])
    assert 2 <= len(bases) <= 600 // cowmap.FOLD_MIN
    assert [a.key for a in state.attachments] == expected
