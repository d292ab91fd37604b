"""Records that name no consumed amount hold their device's whole capacity, counted once.

A schema-1 state (no checksum) may hold an attachment without ``consumedCapacity``; a
prepared claim result may lack it too. Such a record's share is unknown, so every sum of
consumed capacity (standalone ADD, claim-mode ADD, ``cni-dra status``, ``allocate
--state-dir``) charges it the whole device, the way ``cni-dra state repair`` charges an
untracked link, until the pod's DEL releases it. Charging it nothing let later ADDs put
11G on a 10G NIC.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_dra.allocator import NoFit, select_device
from cni_dra.attach.invocation import Invocation
from cni_dra.dra.objects import Device
from cni_dra.errors import ClaimError, NoCapacityError
from cni_dra.protocol.config import load_conf
from cni_dra.protocol.env import parse_env
from cni_dra.quantity import Quantity
from cni_dra.state import Attachment, NodeState, StateStore, Txn
from cni_dra.state.ledger import node_usage

DRIVER = "net.cni-dra.dev"
G = Quantity.parse("1G")


def _device(name: str, value: str = "10G", shared: bool = True) -> dict[str, Any]:
    dev: dict[str, Any] = {
        "name": name,
        "attributes": {"ifName": {"string": f"if-{name}"}},
        "capacity": {"bandwidth": {"value": value}},
    }
    if shared:
        dev["allowMultipleAllocations"] = True
    return dev


def _slice(devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "n"},
        "spec": {
            "driver": DRIVER,
            "nodeName": "n",
            "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _old_attachment(cid: str, device: str, **extra: Any) -> dict[str, Any]:
    """An attachment as a schema-1 file may hold it: no consumedCapacity."""
    return {
        "network": "net1",
        "containerID": cid,
        "ifname": "eth0",
        "netns": f"/var/run/netns/{cid}",
        "driver": DRIVER,
        "pool": "n",
        "device": device,
        "ifName": f"if-{device}",
        "phase": "ready",
        **extra,
    }


def _claim(
    uid: str, device: str, consumed: dict[str, str] | None, share: str | None = "5f0c"
) -> dict[str, Any]:
    res: dict[str, Any] = {"request": "eth0", "driver": DRIVER, "pool": "n", "device": device}
    if consumed is not None:
        res["consumedCapacity"] = consumed
    if share is not None:
        res["shareID"] = share
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"c-{uid}", "namespace": "ns", "uid": uid},
        "status": {"allocation": {"devices": {"results": [res]}}},
    }


def _schema_1(
    tmp_path: Path, attachments: list[dict[str, Any]], claims: dict[str, Any] | None = None
) -> StateStore:
    d = tmp_path / "st"
    d.mkdir(mode=0o700)
    (d / "state.json").write_text(
        json.dumps({"schemaVersion": 1, "claims": claims or {}, "attachments": attachments})
    )
    return StateStore(d)


class _Parent:
    mtu, mac = 1500, "02:00:00:00:00:aa"


def _invocation(
    tmp_path: Path, devices: list[dict[str, Any]], cid: str, bw: str | None = "1G", pod_uid: str | None = None
) -> Invocation:
    inventory = tmp_path / "slice.json"
    inventory.write_text(json.dumps(_slice(devices)))
    conf: dict[str, Any] = {
        "cniVersion": "1.1.0",
        "name": "net1",
        "type": "cni-dra",
        "inventory": str(inventory),
        "stateDir": str(tmp_path / "st"),
    }
    if bw is not None:
        conf["capacity"] = {"requests": {"bandwidth": bw}}
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": f"/var/run/netns/{cid}",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
    }
    if pod_uid:
        env["CNI_ARGS"] = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p-{cid};K8S_POD_UID={pod_uid}"
    raw = json.dumps(conf).encode()
    return Invocation(env=parse_env(env), conf=load_conf(raw), raw=raw)


def _parents(devices: list[dict[str, Any]]) -> dict[str, _Parent]:
    return {f"if-{d['name']}": _Parent() for d in devices}


def _reserve_until_refused(
    tmp_path: Path, store: StateStore, devices: list[dict[str, Any]], n: int
) -> list[str]:
    """Standalone ADD reservations of 1G each, committed one by one; the devices they got."""
    from cni_dra.attach.plan import plan_attachment

    got = []
    for i in range(n):
        inv = _invocation(tmp_path, devices, f"new{i}")
        try:
            with store.transaction() as txn:
                att = plan_attachment(inv, txn.state, _parents(devices))
                txn.put(att)
        except NoCapacityError:
            break
        got.append(att.device)
    return got


def test_schema_1_attachment_without_amounts_holds_its_whole_nic(tmp_path: Path) -> None:
    """The old pod's share is unknown: no later standalone ADD lands on its NIC."""
    devices = [_device("a")]
    store = _schema_1(tmp_path, [_old_attachment("old", "a")])
    assert store.read().find("net1", "old", "eth0").consumedCapacity == {}  # still no amount recorded
    assert _reserve_until_refused(tmp_path, store, devices, 11) == []
    # the other NIC still takes exactly its 10G, the old pod's NIC nothing
    devices = [_device("a"), _device("b")]
    assert _reserve_until_refused(tmp_path, store, devices, 12) == ["b"] * 10


def test_unrecorded_attachment_counted_once_in_status(tmp_path: Path) -> None:
    from cni_dra.report import status_report

    devices = [_device("a"), _device("b")]
    _schema_1(
        tmp_path,
        [_old_attachment("old", "a"), _old_attachment("known", "b", consumedCapacity={"bandwidth": "3G"})],
    )
    (tmp_path / "slice.json").write_text(json.dumps(_slice(devices)))
    report = status_report(str(tmp_path / "st"), str(tmp_path / "slice.json"))
    by_dev = {d["name"]: d for d in report["devices"]}
    assert by_dev["a"]["consumed"] == {"bandwidth": "10G"} and by_dev["a"]["remaining"] == {"bandwidth": "0"}
    assert by_dev["b"]["consumed"] == {"bandwidth": "3G"}
    by_cid = {a["containerID"]: a for a in report["attachments"]}
    assert (
        by_cid["old"]["consumedCapacity"] == {"bandwidth": "10G"}
        and by_cid["old"]["consumedRecorded"] is False
    )
    assert (
        by_cid["known"]["consumedCapacity"] == {"bandwidth": "3G"}
        and by_cid["known"]["consumedRecorded"] is True
    )


def test_null_consumed_capacity_in_schema_1_reads_as_unrecorded(tmp_path: Path) -> None:
    store = _schema_1(tmp_path, [_old_attachment("old", "a", consumedCapacity=None)])
    devices = {"a": Device.model_validate(_device("a"))}
    assert node_usage(store.read(), DRIVER, "n", devices).consumed == {
        "a": {"bandwidth": Quantity.parse("10G")}
    }


def test_claim_mode_add_refuses_a_nic_held_by_an_unrecorded_attachment(tmp_path: Path) -> None:
    """The scheduler's claim may fit by its books; the node cannot tell, so it refuses (101)."""
    from cni_dra.attach.plan import plan_attachment

    devices = [_device("a")]
    store = _schema_1(
        tmp_path, [_old_attachment("old", "a")], {"pod-u": [_claim("u1", "a", {"bandwidth": "6G"})]}
    )
    inv = _invocation(tmp_path, devices, "new", bw=None, pod_uid="pod-u")
    with pytest.raises(ClaimError, match="allocation no longer fits: remaining bandwidth 0 < 6G"):
        with store.transaction() as txn:
            plan_attachment(inv, txn.state, _parents(devices))


@pytest.mark.parametrize("share", ["5f0c", None], ids=["with-shareID", "record-without-shareID"])
def test_unrecorded_claim_attachment_and_its_prepared_result_count_once(share: str | None) -> None:
    """A claim-mode attachment without amounts covers its claim's prepared result on that
    device (also when the old record lacks the shareID): the device is charged whole, once."""
    devices = {"a": Device.model_validate(_device("a")), "b": Device.model_validate(_device("b"))}
    state = NodeState.model_validate(
        {
            "claims": {
                "pod-u": [_claim("u1", "a", {"bandwidth": "6G"})],
                "pod-v": [_claim("u2", "b", {"bandwidth": "2G"}, "77aa")],
            },
            "attachments": [
                _old_attachment("old", "a", shareID=share, claim={"uid": "u1", "request": "eth0"})
            ],
        }
    )
    assert node_usage(state, DRIVER, "n", devices).consumed == {
        "a": {"bandwidth": Quantity.parse("10G")},
        "b": {"bandwidth": Quantity.parse("2G")},
    }


def test_prepared_result_without_amounts_holds_the_whole_shared_nic(tmp_path: Path) -> None:
    """Unattached it reserves the whole NIC; attached, the attachment records the whole NIC."""
    from cni_dra.attach.plan import plan_attachment

    devices = [_device("a"), _device("b")]
    by_name = {d["name"]: Device.model_validate(d) for d in devices}
    store = _schema_1(tmp_path, [], {"pod-u": [_claim("u1", "a", None)]})
    assert node_usage(store.read(), DRIVER, "n", by_name).consumed == {
        "a": {"bandwidth": Quantity.parse("10G")}
    }
    assert _reserve_until_refused(tmp_path, store, devices, 1) == ["b"]
    inv = _invocation(tmp_path, devices, "claimed", bw=None, pod_uid="pod-u")
    with store.transaction() as txn:
        att = plan_attachment(inv, txn.state, _parents(devices))
        txn.put(att)
    assert att.device == "a" and att.consumedCapacity == {"bandwidth": Quantity.parse("10G")}
    assert node_usage(store.read(), DRIVER, "n", by_name).consumed["a"] == {
        "bandwidth": Quantity.parse("10G")
    }


def test_release_of_an_unrecorded_attachment_frees_the_nic(tmp_path: Path) -> None:
    devices = [_device("a")]
    store = _schema_1(tmp_path, [_old_attachment("old", "a")])
    with store.transaction() as txn:
        assert txn.remove("net1", "old", "eth0") is not None
    assert _reserve_until_refused(tmp_path, store, devices, 11) == ["a"] * 10


# -- property --------------------------------------------------------------------------------


def _dev(i: int, value_g: int) -> Device:
    return Device.model_validate(
        {
            "name": f"nic{i}",
            "allowMultipleAllocations": True,
            "attributes": {"ifName": {"string": f"nic{i}"}},
            "capacity": {
                "bandwidth": {
                    "value": f"{value_g}G",
                    "requestPolicy": {"default": "1G", "validRange": {"min": "100M", "step": "100M"}},
                }
            },
        }
    )


old_records = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=2),  # device index
        st.one_of(
            st.none(), st.just("{}"), st.integers(min_value=1, max_value=40)
        ),  # amount in 100M, or none
        st.booleans(),  # a claim-mode record (with a prepared result of the same claim)
    ),
    max_size=5,
)
later = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(min_value=1, max_value=60)),
        st.tuples(st.just("del"), st.integers(min_value=0, max_value=20)),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=12), min_size=3, max_size=3),
    old=old_records,
    ops=later,
    policy=st.sampled_from(["best-fit", "least-allocated"]),
)
def test_whatever_old_records_lack_no_later_add_over_commits(sizes, old, ops, policy) -> None:
    """Whatever an unrecorded old record really held (anything up to the whole NIC), the
    ADDs after it never take more than the NIC has: no new share lands on a NIC while such a
    record is on it, and recorded shares plus new ones stay within the value."""
    devices = [_dev(i, s) for i, s in enumerate(sizes)]
    by_name = {d.name: d for d in devices}
    capacity = {d.name: Quantity.parse(f"{s}G") for d, s in zip(devices, sizes, strict=True)}
    atts: list[dict[str, Any]] = []
    claims: dict[str, Any] = {}
    recorded = {name: Quantity.ZERO for name in capacity}
    for i, (dev_i, amount, claimed) in enumerate(old):
        name = f"nic{dev_i}"
        extra: dict[str, Any] = {}
        if amount == "{}":
            extra["consumedCapacity"] = {}
        elif amount is not None:
            q = Quantity.parse(amount * 100_000_000)
            if recorded[name] + q > capacity[name]:
                continue  # the old books were right about what they recorded
            recorded[name] = recorded[name] + q
            extra["consumedCapacity"] = {"bandwidth": str(q)}
        if claimed:
            extra |= {"shareID": f"s{i}", "claim": {"uid": f"u{i}", "request": "eth0"}}
            claims[f"pod{i}"] = [
                _claim(f"u{i}", name, extra.get("consumedCapacity") or {"bandwidth": "1G"}, f"s{i}")
            ]
        atts.append(_old_attachment(f"old{i}", name, **extra))
    txn = Txn(NodeState.model_validate({"claims": claims, "attachments": atts}))
    unrecorded = {a["device"] for a in atts if not a.get("consumedCapacity")}
    new: list[Attachment] = []
    for n, (op, arg) in enumerate(ops):
        if op == "del" and new:
            txn.remove(*new.pop(arg % len(new)).key)
            continue
        if op != "add":
            continue
        want = Quantity.parse(arg * 100_000_000)
        choice = select_device(
            devices, node_usage(txn.state, DRIVER, "n", by_name).consumed, {"bandwidth": want}, policy
        )
        if isinstance(choice, NoFit):
            continue
        att = Attachment(
            network="net1",
            containerID=f"new{n}",
            ifname="eth0",
            driver=DRIVER,
            pool="n",
            device=choice.device.name,
            parent=choice.device.name,
            consumedCapacity=dict(choice.consumed_capacity),
            shareID=f"n{n}",
        )
        txn.put(att)
        new.append(att)
        for name in capacity:
            mine = [a.consumedCapacity["bandwidth"] for a in new if a.device == name]
            if name in unrecorded:
                assert not mine, f"a new share landed on {name}, held by a record without amounts"
            total = recorded[name]
            for q in mine:
                total = total + q
            assert total <= capacity[name]
