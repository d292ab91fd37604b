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

from cni_dra.cni import run
from cni_dra.state import StateStore, fsio
from tests.builders import device, write_slice
from tests.fake_host import FakeHost

ADD_COSTS = {"lock": 2, "fdatasync": 2}
"""Reserve (synced; the intent with its IPAM step) and ready (synced)."""
DEL_COSTS = {"lock": 2}
"""The ``deleting`` intent and the removal, neither synced (a retried DEL finishes either)."""
SYNCS = ("fsync", "fdatasync", "fsync_dir")


def _node(tmp_path: Path) -> tuple[dict[str, str], bytes, FakeHost]:
    write_slice(tmp_path / "slice.yaml", [device("nic-a", "eth9")], name="s")
    conf = {
        "cniVersion": "1.0.0",
        "name": "net",
        "type": "cni-dra",
        "stateDir": str(tmp_path / "state"),
        "inventory": str(tmp_path / "slice.yaml"),
        "ipam": {"type": "host-local"},
    }
    host = FakeHost()
    host.add_nic("eth9", 7)
    env = {
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/var/run/netns/pod",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
        "PATH": "/usr/bin:/bin",
    }
    return env, json.dumps(conf).encode(), host


def _costs(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], stdin: bytes, host: FakeHost
) -> dict[str, int]:
    """Run one verb; count its exclusive lock acquisitions and each sync kind."""
    counts: collections.Counter[str] = collections.Counter()
    real = fcntl.flock

    def flock(fd: int, op: int) -> None:
        if op & fcntl.LOCK_EX:
            counts["lock"] += 1
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)  # the state lock (the state layer's, not the host's), counted
    out = io.StringIO()
    with fsio.counting() as plan:
        assert run(env, stdin, out, host=host) == 0, out.getvalue()
    monkeypatch.setattr(fcntl, "flock", real)
    counts.update(op for op in plan.log if op in SYNCS)
    return dict(counts)


def test_add_and_del_take_the_lock_and_sync_as_often_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, stdin, host = _node(tmp_path)
    for n in range(2):  # a snapshot, then a journal: the verbs' commits append to it
        with StateStore(tmp_path / "state").transaction() as txn:
            txn.add_status_update({"claim": {"uid": f"other-{n}"}})
    add = _costs(monkeypatch, {**env, "CNI_COMMAND": "ADD"}, stdin, host)
    delete = _costs(monkeypatch, {**env, "CNI_COMMAND": "DEL"}, stdin, host)
    assert (add, delete) == (ADD_COSTS, DEL_COSTS)
    assert StateStore(tmp_path / "state").read_files().attachments == []
