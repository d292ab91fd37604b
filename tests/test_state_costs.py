"""What one ADD and one DEL cost the state store: lock acquisitions and fsyncs, and what of
the node's attachments they walk or copy.

Counted through the I/O seam (:func:`cni_dra.state.fsio.counting`) and the kernel lock
call (``fcntl.flock``), with the link and IPAM calls faked, so a change of the store's
shape that takes the lock or syncs more often shows here before it shows in the bench;
the attachments walked and the bytes allocated on a node of 3,000 against one of 10,
so that a cost growing with the node shows too.
"""

from __future__ import annotations

import collections
import fcntl
import io
import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni_dra.cni import run
from cni_dra.state import Attachment, StateStore, fsio
from cni_dra.state.schema import Attachments
from cni_dra.state.store import VERIFY_ENV
from tests.builders import attachment, device, write_slice
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


def _peak_bytes_of_add_and_del(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, others: int, walked: collections.Counter[str]
) -> int:
    """Peak bytes allocated by one ADD then one DEL with ``others`` attachments of other pods
    in the state (the agent's case: the state already read); counts in ``walked`` the
    attachments the verbs iterate over."""
    tmp_path.mkdir()
    env, stdin, host = _node(tmp_path)
    stdin = json.dumps({**json.loads(stdin), "capacity": {"requests": {"bandwidth": "1M"}}}).encode()
    with StateStore(tmp_path / "state").transaction() as txn:
        for i in range(others):
            txn.put(
                attachment(
                    f"seed{i}", "nic-a", network="net", parent="eth9", consumedCapacity={"bandwidth": "1M"}
                )
            )
    io_ = io.StringIO()
    for warm in ("warm1", "warm2"):  # as in a warm agent: the state read, its books counted
        for cmd in ("ADD", "DEL"):  # (at the second question of placement: books.py)
            assert run({**env, "CNI_COMMAND": cmd, "CNI_CONTAINERID": warm}, stdin, io_, host=host) == 0
    real_iter = Attachments.__iter__

    def counting(self: Attachments) -> Iterator[Attachment]:
        for att in real_iter(self):
            walked[str(others)] += 1
            yield att

    monkeypatch.setattr(Attachments, "__iter__", counting)
    tracemalloc.start()
    try:
        for cmd in ("ADD", "DEL"):
            assert run({**env, "CNI_COMMAND": cmd}, stdin, io_, host=host) == 0, io_.getvalue()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        monkeypatch.setattr(Attachments, "__iter__", real_iter)


def test_add_and_del_on_a_large_node_neither_walk_nor_copy_its_attachments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an ADD+DEL does to the state does not grow with the node: no verb iterates over
    the attachments, and no transaction copies their index (a dict copy of 3,000 entries,
    ≈ 160 KB, each time a transaction or a journal record copied the state)."""
    monkeypatch.delenv(VERIFY_ENV, raising=False)  # its re-read after each commit walks them all
    walked: collections.Counter[str] = collections.Counter()
    small = _peak_bytes_of_add_and_del(monkeypatch, tmp_path / "small", 10, walked)
    large = _peak_bytes_of_add_and_del(monkeypatch, tmp_path / "large", 3000, walked)
    assert walked == {}
    assert large < small + 64_000, (small, large)
