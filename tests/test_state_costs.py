"""What one ADD and one DEL cost the state store: lock acquisitions and fsyncs.

Counted through the I/O seam (:func:`cni_dra.state.fsio.counting`) and the kernel lock
call (``fcntl.flock``), with the link and IPAM calls faked, so a change of the store's
shape that takes the lock or syncs more often shows here before it shows in the bench.
"""

from __future__ import annotations

import collections
import fcntl
import io
import json
from pathlib import Path

import pytest

from cni_dra import ipam
from cni_dra.cni import run
from cni_dra.netlink import addr, info, shaping, sublink, sysctl
from cni_dra.protocol.results import IPConfig, Result
from cni_dra.state import StateStore, fsio
from tests.builders import device, every_path_a_netns, write_slice

ADD_COSTS = {"lock": 2, "fdatasync": 2}
"""Reserve (synced; the intent with its IPAM step) and ready (synced)."""
DEL_COSTS = {"lock": 2}
"""The ``deleting`` intent and the removal, neither synced (a retried DEL finishes either)."""
SYNCS = ("fsync", "fdatasync", "fsync_dir")


def _node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, str], bytes]:
    write_slice(tmp_path / "slice.yaml", [device("nic-a", "eth9")], name="s")
    conf = {
        "cniVersion": "1.0.0",
        "name": "net",
        "type": "cni-dra",
        "stateDir": str(tmp_path / "state"),
        "inventory": str(tmp_path / "slice.yaml"),
        "ipam": {"type": "host-local"},
    }
    parent = info.LinkInfo(
        name="eth9",
        index=7,
        kind=None,
        mac="02:00:00:00:00:09",
        mtu=1500,
        operstate="UP",
        admin_up=True,
        parent_index=None,
        parent_netnsid=None,
        mode=None,
    )
    link = info.LinkInfo(
        name="eth0",
        index=2,
        kind="macvlan",
        mac="02:00:00:00:00:01",
        mtu=1500,
        operstate="UP",
        admin_up=True,
        parent_index=None,
        parent_netnsid=None,
        mode=None,
    )
    every_path_a_netns(monkeypatch)
    monkeypatch.setattr(info, "host_link", lambda name: parent if name == "eth9" else None)
    monkeypatch.setattr(sublink, "create_macvlan", lambda **kw: link)
    monkeypatch.setattr(
        shaping,
        "apply_shaping",
        lambda netns, ifname, spec, **kw: shaping.ShapeInfo(
            ifname, spec.egress, spec.ingress, shaping.ifb_name(ifname) if spec.ingress else None
        ),
    )
    monkeypatch.setattr(shaping, "remove_shaping", lambda netns, ifname: True)
    monkeypatch.setattr(shaping, "delete_shaped_link", lambda netns, ifname: (True, True))
    monkeypatch.setattr(sysctl, "set_sysctl_in_netns", lambda *a: None)
    monkeypatch.setattr(addr, "configure_interface", lambda *a, **k: None)
    monkeypatch.setattr(sublink, "delete_link", lambda *a: True)
    monkeypatch.setattr(ipam, "ipam_add", lambda *a, **k: Result(ips=[IPConfig(address="192.0.2.5/24")]))
    monkeypatch.setattr(ipam, "ipam_del", lambda *a, **k: None)
    env = {
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/var/run/netns/pod",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
        "PATH": "/usr/bin:/bin",
    }
    return env, json.dumps(conf).encode()


def _costs(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], stdin: bytes) -> dict[str, int]:
    """Run one verb; count its exclusive lock acquisitions and each sync kind."""
    counts: collections.Counter[str] = collections.Counter()
    real = fcntl.flock

    def flock(fd: int, op: int) -> None:
        if op & fcntl.LOCK_EX:
            counts["lock"] += 1
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    out = io.StringIO()
    with fsio.counting() as plan:
        assert run(env, stdin, out) == 0, out.getvalue()
    monkeypatch.setattr(fcntl, "flock", real)
    counts.update(op for op in plan.log if op in SYNCS)
    return dict(counts)


def test_add_and_del_take_the_lock_and_sync_as_often_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, stdin = _node(tmp_path, monkeypatch)
    for n in range(2):  # a snapshot, then a journal: the verbs' commits append to it
        with StateStore(tmp_path / "state").transaction() as txn:
            txn.add_status_update({"claim": {"uid": f"other-{n}"}})
    add = _costs(monkeypatch, {**env, "CNI_COMMAND": "ADD"}, stdin)
    delete = _costs(monkeypatch, {**env, "CNI_COMMAND": "DEL"}, stdin)
    assert (add, delete) == (ADD_COSTS, DEL_COSTS)
    assert StateStore(tmp_path / "state").read_files().attachments == []
