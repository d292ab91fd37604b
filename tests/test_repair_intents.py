"""``cni-dra state repair`` and the intents of ADDs: an ADD still running keeps its own; one
whose process died is undone, its ifb device included; and only when records may be lost
(a bad journal record, an unreadable snapshot) is an ADD with a live link taken as done,
recording the shaping found on its link, so that its DEL removes the ifb device too.

The machine is the in-memory host (:class:`Kernel`, on tests/fake_host.py): one pod namespace holding the pod's macvlan on the
inventory NIC, shaped as :data:`FOUND`.
"""

from __future__ import annotations

import io
import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from cni_dra.attach.rebuild import repair
from cni_dra.attach.shaping_plan import record
from cni_dra.cni import run
from cni_dra.netlink.shaping import ShapeInfo, Tbf
from cni_dra.state import StateStore
from cni_dra.state.owner import boot_id, current_owner
from cni_dra.state.schema import STEP_IPAM, Owner
from tests.builders import attachment, cni_env, device, netconf, write_slice
from tests.fake_host import FakeHost, pod_link

POD_NS = "/run/netns/pod"
POD = (0x20, 4026532001)
FOUND = ShapeInfo("eth0", Tbf.for_rate(1_000_000_000), Tbf.for_rate(1_000_000_000), "ifb-eth0")
"""The traffic control on the pod's link, as the kernel reports it."""


class Kernel(FakeHost):
    """The pod namespace :data:`POD_NS` with ``eth0`` on host NIC ``eth9``, shaped as
    ``shaping`` (:data:`FOUND`); records the deletions as (how, netns, name): ``shaped``
    deletes the link and its ifb device."""

    def __init__(self) -> None:
        super().__init__(every_path_a_netns=False)
        self.netns_paths[POD_NS] = POD
        self.deleted: list[tuple[str, str, str]] = []
        self.add_nic("eth9", 7)
        self.put_link(
            POD_NS,
            pod_link(index=3, parent_index=7),
            "eth9",
        )
        self.shaping[(POD, "eth0")] = FOUND
        self.hooks["delete_shaped_link"] = lambda ns, name: self.deleted.append(("shaped", ns, name))
        self.hooks["delete_link"] = lambda ns, name: self.deleted.append(("plain", ns, name))

    def no_shaping(self) -> None:
        self.shaping.clear()


def _dead_owner() -> Owner:
    child = multiprocessing.get_context("fork").Process(target=lambda: None)
    child.start()
    child.join()
    return Owner(pid=child.pid, start=1, boot=boot_id())


def _adding(owner: Owner) -> Any:
    return attachment(
        "c1",
        network="net",
        parent="eth9",
        netns=POD_NS,
        netnsIdentity=POD,
        phase="adding",
        owner=owner,
        steps=(STEP_IPAM,),
        tempName="cdra0123456789",
        consumedCapacity={"bandwidth": "1G"},
    )


def _store(tmp_path: Path, *atts: Any) -> StateStore:
    store = StateStore(tmp_path / "state")
    with store.transaction() as txn:
        txn.set_boot_id(boot_id())
        txn.put_all(atts)
    return store


def _damage(store: StateStore) -> None:
    """Make ``state.json`` unreadable: repair takes its backup copy, and records may be lost."""
    with store.transaction() as txn:  # a second snapshot-backed commit: the backup holds the same
        txn.add_status_update({"claim": {"uid": "other"}})
    store.path.write_bytes(b"\x00" * 10)


def test_repair_leaves_an_add_in_flight_alone(tmp_path):
    """A healthy state: nothing was lost, so an ``adding`` intent of a live process is an ADD
    still running (stopped, say, between its link and its IPAM): it stays as it is, and its
    DEL is still refused with code 11 (then the ADD completes and the DEL can run)."""
    kernel = Kernel()
    me = current_owner()
    store = _store(tmp_path, _adding(me))
    report = repair(store, environ={}, host=kernel)
    (att,) = store.read().attachments
    assert (att.phase, att.owner, att.tempName) == ("adding", me, "cdra0123456789")
    assert kernel.deleted == [] and not any("as ready" in line for line in report.changes), report.changes


def test_repair_undoes_the_add_of_a_dead_process_with_its_ifb_device(tmp_path):
    """A healthy state, the ADD's process dead: it never answered the runtime, so it is undone
    as recovery undoes it: the link goes together with its ifb device, and the capacity."""
    kernel = Kernel()
    store = _store(tmp_path, _adding(_dead_owner()))
    report = repair(store, environ={}, host=kernel)
    assert store.read().attachments == []
    assert kernel.deleted == [("shaped", POD_NS, "eth0")]
    assert any(line.startswith("dropped attachment net/c1/eth0") for line in report.changes), report.changes


@pytest.mark.parametrize("alive", [True, False], ids=["owner-alive", "owner-dead"])
def test_repair_after_lost_records_keeps_an_add_with_a_live_link_as_ready_with_its_shaping(tmp_path, alive):
    """Records may be lost: the ADD's "ready" record may have been among them (the runtime got
    its result), so the attachment is kept as ready, recording the shaping found on its link;
    its DEL then removes the link with its ifb device."""
    kernel = Kernel()
    store = _store(tmp_path, _adding(current_owner() if alive else _dead_owner()))
    _damage(store)
    report = repair(store, environ={}, host=kernel)
    (att,) = store.read().attachments
    assert (att.phase, att.owner, att.recovering) == ("ready", None, None)
    assert att.shaping == record(FOUND) and att.readyAt is not None
    assert any(
        "kept attachment net/c1/eth0" in line and "ifb device ifb-eth0" in line for line in report.changes
    )
    write_slice(tmp_path / "slice.yaml", [device("nic-a", "eth9")], name="s")
    conf = netconf(name="net", stateDir=str(tmp_path / "state"), inventory=str(tmp_path / "slice.yaml"))
    out = io.StringIO()
    code = run(
        {**cni_env("DEL", container_id="c1", netns=POD_NS), "PATH": "/usr/bin:/bin"},
        json.dumps(conf).encode(),
        out,
        host=kernel,
    )
    assert (code, out.getvalue()) == (0, "")
    assert kernel.deleted == [("shaped", POD_NS, "eth0")] and store.read().attachments == []


def test_repair_after_lost_records_finding_no_shaping_still_lets_del_look_for_an_ifb(tmp_path):
    kernel = Kernel()
    kernel.no_shaping()
    store = _store(tmp_path, _adding(current_owner()))
    _damage(store)
    repair(store, environ={}, host=kernel)
    (att,) = store.read().attachments
    assert att.phase == "ready" and att.shaping == {}
