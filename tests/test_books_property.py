"""Property: no sequence of standalone ADDs and DELs over-commits a NIC.

Drives the same functions ADD uses under the lock (:func:`cni_dra.state.ledger.node_usage`
and allocator.select_device) through random sequences, including prepared claims, and
judges them by its own books (what each attachment and claim it made holds), not by the
product's ledger.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cni_dra.allocator import NoFit, select_device
from cni_dra.dra.objects import Device
from cni_dra.quantity import Quantity
from cni_dra.state import Attachment, NodeState, Txn
from cni_dra.state.ledger import node_usage

G = 1_000_000_000


def _device(name: str, value_g: int) -> Device:
    return Device.model_validate(
        {
            "name": name,
            "allowMultipleAllocations": True,
            "attributes": {"ifName": {"string": name}},
            "capacity": {
                "bandwidth": {
                    "value": f"{value_g}G",
                    "requestPolicy": {"default": "1G", "validRange": {"min": "100M", "step": "100M"}},
                }
            },
        }
    )


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(min_value=1, max_value=120)),  # request in units of 100M
        st.tuples(st.just("del"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("claim"), st.integers(min_value=1, max_value=60)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    ops=ops,
    sizes=st.lists(st.integers(min_value=1, max_value=20), min_size=1, max_size=3),
    policy=st.sampled_from(["best-fit", "least-allocated"]),
)
def test_no_sequence_over_commits(ops, sizes, policy):
    devices = [_device(f"nic{i}", s) for i, s in enumerate(sizes)]
    capacity = {d.name: Quantity.parse(f"{s}G") for d, s in zip(devices, sizes, strict=True)}
    txn = Txn(NodeState())  # a transaction without a store: the state's operations only
    # This test's own books: what each attachment and prepared claim holds, by who holds it.
    books: dict[str, tuple[str, Quantity]] = {}

    def held(device: str) -> Quantity:
        return sum((q for d, q in books.values() if d == device), Quantity.parse(0))

    n = 0
    for op, arg in ops:
        n += 1
        if op == "add":
            want = Quantity.parse(arg * 100_000_000)
            used = node_usage(txn.state, "d", "p").consumed  # what ADD decides on
            choice = select_device(devices, used, {"bandwidth": want}, policy)
            if isinstance(choice, NoFit):
                # refused only when truly no device had room
                for d in devices:
                    assert held(d.name) + want > capacity[d.name]
                continue
            assert choice.consumed_capacity["bandwidth"] >= want
            txn.put(
                Attachment(
                    network="n",
                    containerID=f"c{n}",
                    ifname="eth0",
                    driver="d",
                    pool="p",
                    device=choice.device.name,
                    parent=choice.device.name,
                    consumedCapacity=dict(choice.consumed_capacity),
                    shareID=f"s{n}",
                )
            )
            books[f"c{n}"] = (choice.device.name, choice.consumed_capacity["bandwidth"])
        elif op == "del" and txn.attachments:
            gone = txn.remove(*txn.attachments[arg % len(txn.attachments)].key)
            books.pop(gone.containerID)
        elif op == "claim":
            # a prepared claim (scheduler's verdict) that fits at the time it is prepared
            want = Quantity.parse(arg * 100_000_000)
            for d in devices:
                if held(d.name) + want <= capacity[d.name]:
                    txn.set_claims(
                        f"pod{n}",
                        [
                            {
                                "metadata": {"uid": f"u{n}"},
                                "status": {
                                    "allocation": {
                                        "devices": {
                                            "results": [
                                                {
                                                    "request": "r",
                                                    "driver": "d",
                                                    "pool": "p",
                                                    "device": d.name,
                                                    "consumedCapacity": {"bandwidth": str(want)},
                                                    "shareID": f"cs{n}",
                                                }
                                            ]
                                        }
                                    }
                                },
                            }
                        ],
                    )
                    books[f"claim{n}"] = (d.name, want)
                    break
        for name, cap in capacity.items():
            assert held(name) <= cap
