"""One capacity ledger: :func:`cni_dra.state.ledger.node_usage` over the node state and
:meth:`NodeUsage.plus <cni_dra.allocator.usage.NodeUsage.plus>` under it, and nothing else.

The property compares it with a recount written here from the rules as README states them
(each allocation once, whatever records name it; a record without amounts holds its device
whole; adminAccess holds nothing), organised differently: by the identity of what is held.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cni_dra.allocator import NodeUsage, allocate_claims
from cni_dra.dra.claims import ResourceClaim
from cni_dra.dra.objects import Device, ResourceSlice
from cni_dra.quantity import Quantity
from cni_dra.state import NodeState, Txn
from cni_dra.state.ledger import node_usage

REPO = Path(__file__).resolve().parents[1]
DRIVER, POOL = "d", "p"
DEVICES = {
    "a": {
        "name": "a",
        "allowMultipleAllocations": True,
        "capacity": {"bandwidth": {"value": "10G"}, "pps": {"value": "1M"}},
    },
    "b": {"name": "b", "allowMultipleAllocations": True, "capacity": {"bandwidth": {"value": "25G"}}},
    "x": {"name": "x", "capacity": {"bandwidth": {"value": "1G"}}},  # dedicated
}
INVENTORY = {name: Device.model_validate(d) for name, d in DEVICES.items()}

amounts = st.one_of(
    st.none(),  # no amount recorded
    st.fixed_dictionaries({"bandwidth": st.sampled_from(["100M", "1G", "1500M", "2G"])}),
    st.fixed_dictionaries(
        {"bandwidth": st.sampled_from(["1G", "3G"]), "pps": st.sampled_from(["1k", "20k"])}
    ),
)
where = st.tuples(
    st.sampled_from(["a", "b", "x", "gone"]),
    st.sampled_from([(DRIVER, POOL), (DRIVER, "other"), ("other", POOL)]),
)
claim_results = st.lists(
    st.tuples(where, amounts, st.sampled_from(["s1", "s2", None]), st.booleans()),  # + adminAccess
    min_size=1,
    max_size=3,
)
attachments = st.lists(
    st.tuples(
        where, amounts, st.sampled_from(["s1", "s2", "s3", None]), st.sampled_from([None, "u1", "u2", "u3"])
    ),
    max_size=8,
)


def _claim(uid: str, results: list[Any]) -> dict[str, Any]:
    out = []
    for i, ((device, (driver, pool)), amount, share, admin) in enumerate(results):
        r: dict[str, Any] = {"request": f"r{i}", "driver": driver, "pool": pool, "device": device}
        if amount is not None:
            r["consumedCapacity"] = amount
        if share is not None:
            r["shareID"] = share
        if admin:
            r["adminAccess"] = True
        out.append(r)
    return {
        "metadata": {"uid": uid, "name": f"c-{uid}", "namespace": "ns"},
        "status": {"allocation": {"devices": {"results": out}}},
    }


@st.composite
def states(draw: Any) -> NodeState:
    claims = {uid: _claim(uid, draw(claim_results)) for uid in ("u1", "u2", "u3")}
    pods = draw(
        st.dictionaries(
            st.sampled_from(["p1", "p2", "p3", "p4"]),
            st.lists(st.sampled_from(sorted(claims)), min_size=1, max_size=2, unique=True),
            max_size=4,
        )
    )
    atts = []
    for i, ((device, (driver, pool)), amount, share, uid) in enumerate(draw(attachments)):
        att: dict[str, Any] = {
            "network": "n",
            "containerID": f"c{i}",
            "ifname": "eth0",
            "driver": driver,
            "pool": pool,
            "device": device,
            "parent": device,
            "shareID": share,
        }
        if amount is not None:
            att["consumedCapacity"] = amount
        if uid is not None:
            att["claim"] = {"uid": uid, "name": f"c-{uid}", "namespace": "ns", "request": "r0"}
        atts.append(att)
    return NodeState.model_validate(
        {"claims": {pod: [claims[u] for u in us] for pod, us in pods.items()}, "attachments": atts}
    )


def recount(
    state: NodeState, devices: dict[str, Device] | None, prepared: bool = True
) -> dict[str, dict[str, int]]:
    """Nano-units per device and capacity: every distinct holding once."""
    devices = devices or {}

    def whole(name: str) -> dict[str, Quantity]:
        dev = devices.get(name)
        return {} if dev is None else {k: c.value for k, c in dev.capacity.items()}

    holdings: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}
    unrecorded_claims = set()
    for a in state.attachments:
        if (a.driver, a.pool) != (DRIVER, POOL):
            continue
        if a.claim is None:
            identity: tuple[Any, ...] = ("standalone", a.key)
        else:
            identity = ("claim", a.claim.uid, a.device, a.shareID)
            if not a.consumedCapacity:
                unrecorded_claims.add((a.claim.uid, a.device))
        holdings.setdefault(identity, (a.device, dict(a.consumedCapacity) or whole(a.device)))
    for raw in itertools.chain.from_iterable(state.claims.values()) if prepared else ():
        uid = raw["metadata"]["uid"]
        for r in raw["status"]["allocation"]["devices"]["results"]:
            if (r["driver"], r["pool"]) != (DRIVER, POOL) or r.get("adminAccess"):
                continue
            if (uid, r["device"]) in unrecorded_claims:
                continue
            amounts = {k: Quantity.parse(v) for k, v in (r.get("consumedCapacity") or {}).items()}
            holdings.setdefault(
                ("claim", uid, r["device"], r.get("shareID")), (r["device"], amounts or whole(r["device"]))
            )
    totals: dict[str, dict[str, int]] = {}
    for device, amounts in holdings.values():
        for name, q in amounts.items():
            slot = totals.setdefault(device, {})
            slot[name] = slot.get(name, 0) + Quantity.parse(str(q)).nanos
    return {d: caps for d, caps in totals.items() if caps}


def _nanos(usage: NodeUsage) -> dict[str, dict[str, int]]:
    return {d: {k: q.nanos for k, q in caps.items()} for d, caps in usage.consumed.items() if caps}


@settings(max_examples=400, deadline=None)
@given(state=states(), with_inventory=st.booleans(), prepared=st.booleans())
def test_the_ledger_equals_an_independent_recount(
    state: NodeState, with_inventory: bool, prepared: bool
) -> None:
    devices = INVENTORY if with_inventory else None
    usage = node_usage(state, DRIVER, POOL, devices, prepared=prepared)
    assert _nanos(usage) == recount(state, devices, prepared)
    if with_inventory:  # a device the inventory has is held as the inventory says it may be
        assert not usage.dedicated & {"a", "b"} and "x" not in usage.shared


def test_a_claim_shared_by_pods_and_attached_by_each_is_charged_once() -> None:
    claim = _claim("u1", [(("a", (DRIVER, POOL)), {"bandwidth": "2G"}, "s1", False)])
    att = {
        "network": "n",
        "ifname": "eth0",
        "driver": DRIVER,
        "pool": POOL,
        "device": "a",
        "parent": "a",
        "shareID": "s1",
        "consumedCapacity": {"bandwidth": "2G"},
        "claim": {"uid": "u1", "name": "c-u1", "namespace": "ns", "request": "r0"},
    }
    state = NodeState.model_validate(
        {
            "claims": {"p1": [claim], "p2": [claim]},
            "attachments": [{**att, "containerID": "c1"}, {**att, "containerID": "c2"}],
        }
    )
    assert node_usage(state, DRIVER, POOL).consumed == {"a": {"bandwidth": Quantity.parse("2G")}}


def test_the_allocator_and_the_node_state_count_a_result_alike() -> None:
    """A claim the allocator just placed (NodeUsage.with_results) holds what the same claim,
    once prepared on the node, holds in the node state's books: one rule for both."""
    slice_ = ResourceSlice.model_validate(
        {
            "spec": {
                "driver": DRIVER,
                "pool": {"name": POOL, "generation": 1, "resourceSliceCount": 1},
                "nodeName": "n1",
                "devices": list(DEVICES.values()),
            }
        }
    )
    claims = [
        ResourceClaim.model_validate(
            {
                "metadata": {"name": f"c{i}", "namespace": "ns", "uid": f"u{i}"},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": req}]}},
            }
        )
        for i, req in enumerate(
            [
                {"deviceClassName": "c", "capacity": {"requests": {"bandwidth": "3G"}}},
                {
                    "deviceClassName": "c",
                    "selectors": [{"cel": {"expression": "!device.allowMultipleAllocations"}}],
                },
                {"deviceClassName": "c", "capacity": {"requests": {"bandwidth": "4G"}}},
            ]
        )
    ]
    ids = (f"00000000-0000-4000-8000-{i:012d}" for i in itertools.count())
    results = allocate_claims(claims, slice_, NodeUsage(), lambda: next(ids))
    usage = NodeUsage()
    prepared = {}
    for claim, res in zip(claims, results, strict=True):
        assert not hasattr(res, "reasons"), res
        usage = usage.with_results(res.devices.results, slice_.spec.devices)
        prepared[f"pod-{claim.metadata.name}"] = [
            {
                "metadata": {"uid": claim.metadata.uid},
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                r.model_dump(by_alias=True, exclude_none=True) for r in res.devices.results
                            ]
                        }
                    }
                },
            }
        ]
    books = node_usage(NodeState.model_validate({"claims": prepared}), DRIVER, POOL, INVENTORY)
    assert books.consumed == usage.consumed
    assert books.dedicated == usage.dedicated == {"x"}


def test_there_is_one_ledger() -> None:
    assert not hasattr(NodeState, "consumed_by_device") and not hasattr(Txn, "consumed_by_device")
    hits = [
        str(p.relative_to(REPO))
        for p in (REPO / "cni_dra").rglob("*.py")
        if "consumed_by_device" in p.read_text()
    ]
    assert hits == []


def _flows_only_into(path: Path, source: str, sink: str) -> list[str]:
    """Lines of ``path`` where the value of a ``source(...)`` call (or a name assigned from
    one) is used other than as an argument of ``sink(...)``."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def calls_source(node: ast.AST) -> bool:
        return any(
            isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == source
            for n in ast.walk(node)
        )

    def into_sink(node: ast.AST) -> bool:
        parent = parents.get(node)
        return (
            isinstance(parent, ast.Call) and getattr(parent.func, "id", None) == sink and node in parent.args
        )

    names = {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and calls_source(n.value)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    bad = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Name)
            and isinstance(node.ctx, ast.Load)
            and node.id in names
            and not into_sink(node)
        ):
            bad.append(f"{path.name}:{node.lineno}: {node.id}")
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == source
        ):
            top: ast.AST = node
            while isinstance(parents.get(top), ast.Attribute):
                top = parents[top]
            if not isinstance(parents.get(top), ast.Assign) and not into_sink(top):
                bad.append(f"{path.name}:{node.lineno}: {source}(...)")
    return bad


def test_the_over_commit_tests_judge_by_their_own_books() -> None:
    """The books property and the 200-way stress test may let the product decide with its
    ledger (what ADD does), but judge over-commit by totals they keep themselves."""
    assert _flows_only_into(REPO / "tests/test_books_property.py", "node_usage", "select_device") == []
    assert (
        _flows_only_into(REPO / "tests/test_books_property.py", "consumed_by_device", "select_device") == []
    )
    stress = (REPO / "netns_tests/test_stress.py").read_text()
    assert "node_usage" not in stress and "consumed_by_device" not in stress and "own_totals" in stress
