"""Property: no sequence of standalone ADDs and DELs over-commits a NIC.

Drives the same functions ADD uses under the lock (NodeState.consumed_by_device and
allocator.select_device) through random sequences, including prepared claims.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cni_dra.allocator import NoFit, select_device
from cni_dra.dra.models import Device
from cni_dra.quantity import Quantity
from cni_dra.state import Attachment, NodeState, Txn

G = 1_000_000_000


def _device(name: str, value_g: int) -> Device:
    return Device.model_validate({
        "name": name, "allowMultipleAllocations": True,
        "attributes": {"ifName": {"string": name}},
        "capacity": {"bandwidth": {"value": f"{value_g}G",
                                   "requestPolicy": {"default": "1G", "validRange": {"min": "100M", "step": "100M"}}}},
    })


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(min_value=1, max_value=120)),  # request in units of 100M
        st.tuples(st.just("del"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("claim"), st.integers(min_value=1, max_value=60)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, sizes=st.lists(st.integers(min_value=1, max_value=20), min_size=1, max_size=3),
       policy=st.sampled_from(["best-fit", "least-allocated"]))
def test_no_sequence_over_commits(ops, sizes, policy):
    devices = [_device(f"nic{i}", s) for i, s in enumerate(sizes)]
    capacity = {d.name: Quantity.parse(f"{s}G") for d, s in zip(devices, sizes, strict=True)}
    txn = Txn(NodeState())  # a transaction without a store: the state's operations only
    n = 0
    for op, arg in ops:
        n += 1
        if op == "add":
            want = Quantity.parse(arg * 100_000_000)
            choice = select_device(devices, txn.consumed_by_device("d", "p"), {"bandwidth": want}, policy)
            if isinstance(choice, NoFit):
                # refused only when truly no device had room
                used = txn.consumed_by_device("d", "p")
                for d in devices:
                    have = used.get(d.name, {}).get("bandwidth", Quantity.parse(0))
                    assert have + want > capacity[d.name]
                continue
            assert choice.consumed_capacity["bandwidth"] >= want
            txn.put(Attachment(
                network="n", containerID=f"c{n}", ifname="eth0", driver="d", pool="p",
                device=choice.device.name, parent=choice.device.name,
                consumedCapacity=dict(choice.consumed_capacity), shareID=f"s{n}"))
        elif op == "del" and txn.attachments:
            txn.remove(*txn.attachments[arg % len(txn.attachments)].key)
        elif op == "claim":
            # a prepared claim (scheduler's verdict) that fits at the time it is prepared
            used = txn.consumed_by_device("d", "p")
            want = Quantity.parse(arg * 100_000_000)
            for d in devices:
                have = used.get(d.name, {}).get("bandwidth", Quantity.parse(0))
                if have + want <= capacity[d.name]:
                    txn.set_claims(f"pod{n}", [{"metadata": {"uid": f"u{n}"}, "status": {"allocation": {"devices": {
                        "results": [{"request": "r", "driver": "d", "pool": "p", "device": d.name,
                                     "consumedCapacity": {"bandwidth": str(want)}, "shareID": f"cs{n}"}]}}}}])
                    break
        used = txn.consumed_by_device("d", "p")
        for name, cap in capacity.items():
            assert used.get(name, {}).get("bandwidth", Quantity.parse(0)) <= cap
