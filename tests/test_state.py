"""State store: round trip, atomic replace, corrupt files, lock timeout, consumption books."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat

import pytest

from cni_dra.errors import StateError, TryAgainLaterError
from cni_dra.quantity import Quantity
from cni_dra.state import SCHEMA_VERSION, Attachment, ClaimRef, NodeState, StateStore, Txn
from cni_dra.state.ledger import node_usage


def _att(cid: str, device: str, bw: str, **kw) -> Attachment:
    return Attachment(
        network="net1",
        containerID=cid,
        ifname="eth0",
        driver="d",
        pool="p",
        device=device,
        parent=device,
        consumedCapacity={"bandwidth": Quantity.parse(bw)},
        shareID=f"s-{cid}",
        **kw,
    )


def _claim(uid: str, device: str, bw: str, share: str, pool: str = "p") -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"c-{uid}", "namespace": "ns", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "net",
                            "driver": "d",
                            "pool": pool,
                            "device": device,
                            "consumedCapacity": {"bandwidth": bw},
                            "shareID": share,
                        }
                    ]
                }
            }
        },
    }


def test_missing_file_reads_as_empty_state(tmp_path):
    assert StateStore(tmp_path / "s").read().attachments == []


def test_round_trip_keeps_attachments_and_claims(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1", "eth-a", "4G"))
        txn.set_claims("pod", [_claim("u1", "eth-b", "6G", "sh")])
    again = store.read()
    assert again.find("net1", "c1", "eth0").consumedCapacity == {"bandwidth": Quantity.parse("4000M")}
    assert again.claims["pod"][0]["metadata"]["uid"] == "u1"
    raw = json.loads((tmp_path / "state.json").read_text())  # the first commit writes the snapshot
    assert raw["schemaVersion"] == SCHEMA_VERSION == 4
    assert raw["attachments"][0]["consumedCapacity"] == {"bandwidth": "4G"}


def test_files_are_private(tmp_path):
    store = StateStore(tmp_path / "state")
    with store.transaction() as txn:
        txn.put(_att("c1", "eth-a", "1G"))
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "state.json").st_mode) == 0o600


def test_failed_transaction_writes_nothing(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1", "eth-a", "1G"))
    before = (tmp_path / "state.json").read_bytes()
    with pytest.raises(RuntimeError):
        with store.transaction() as txn:
            for _a in list(txn.attachments):
                txn.remove(*_a.key)
            raise RuntimeError("boom")
    assert (tmp_path / "state.json").read_bytes() == before


def test_write_is_atomic_replace(tmp_path):
    """A snapshot is replaced by rename: a reader holding the old inode sees the old bytes whole."""
    store = StateStore(tmp_path, journal_limit_bytes=0)  # every commit writes a snapshot
    with store.transaction() as txn:
        txn.put(_att("c1", "eth-a", "1G"))
    old_inode = os.stat(tmp_path / "state.json").st_ino
    with open(tmp_path / "state.json", "rb") as held:
        with store.transaction() as txn:
            txn.put(_att("c2", "eth-a", "2G"))
        assert len(json.loads(held.read())["attachments"]) == 1
    assert os.stat(tmp_path / "state.json").st_ino != old_inode
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


@pytest.mark.parametrize(
    "content", [b"", b'{"schemaVersion": 1, "attachments": [', b"\x00\x00garbage", b"[]"]
)
def test_corrupt_state_is_never_read_as_empty(tmp_path, content):
    (tmp_path / "state.json").write_bytes(content)
    with pytest.raises(StateError) as ei:
        StateStore(tmp_path).read()
    assert ei.value.code == 5
    assert "corrupt" in ei.value.msg


def _hold_lock(path: str, ready, release) -> None:
    store = StateStore(path)
    with store.locked():
        ready.set()
        release.wait(10)


def test_lock_timeout_gives_code_11_and_writes_nothing(tmp_path):
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    holder.start()
    try:
        assert ready.wait(10)
        store = StateStore(tmp_path, lock_timeout_s=0.3)
        with pytest.raises(TryAgainLaterError) as ei:
            with store.transaction() as txn:
                txn.put(_att("c1", "eth-a", "1G"))
        assert ei.value.code == 11
        assert not (tmp_path / "state.json").exists()
    finally:
        release.set()
        holder.join(10)


def test_lock_is_released_when_holder_dies(tmp_path):
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    holder.start()
    assert ready.wait(10)
    holder.kill()
    holder.join(10)
    with StateStore(tmp_path, lock_timeout_s=2).transaction() as txn:
        txn.put(_att("c1", "eth-a", "1G"))
    assert StateStore(tmp_path).read().find("net1", "c1", "eth0") is not None


def test_consumption_counts_attachments_and_unattached_claims_once():
    txn = Txn(NodeState())
    txn.put(_att("c1", "eth-a", "4G"))
    txn.put(_att("c2", "eth-a", "3G", phase="ready"))
    txn.set_claims("pod5", [_claim("u5", "eth-b", "6G", "share5")])
    txn.set_claims("pod6", [_claim("u5", "eth-b", "6G", "share5")])  # same claim shared by two pods
    txn.set_claims("other", [_claim("u7", "eth-b", "9G", "x", pool="other-pool")])
    used = node_usage(txn.state, "d", "p").consumed
    assert used["eth-a"]["bandwidth"] == Quantity.parse("7G")
    assert used["eth-b"]["bandwidth"] == Quantity.parse("6G")
    # once pod5's claim is attached, it is counted through the attachment only
    att = _att("c5", "eth-b", "6G").model_copy(
        update={"shareID": "share5", "claim": ClaimRef(uid="u5", name="c-u5", namespace="ns")}
    )
    txn.put(att)
    assert node_usage(txn.state, "d", "p").consumed["eth-b"]["bandwidth"] == Quantity.parse("6G")


def test_remove_returns_the_attachment_and_is_idempotent():
    txn = Txn(NodeState(attachments=[_att("c1", "eth-a", "1G")]))
    assert txn.remove("net1", "c1", "eth0").containerID == "c1"
    assert txn.remove("net1", "c1", "eth0") is None
    assert txn.attachments == []


# -- the state directory ------------------------------------------------------------------
def _use(store: StateStore, cid: str = "a") -> None:
    with store.transaction() as txn:
        txn.put(_att(cid, "nic-a", "1G"))


def test_state_dir_that_is_a_symlink_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "state"
    link.symlink_to(real)
    for use in (_use, lambda s: s.read(), lambda s: s.peek()):
        with pytest.raises(StateError) as ei:
            use(StateStore(link))
        assert ei.value.code == 5
        assert f"state directory {link}: it is a symlink" in ei.value.msg
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777, 0o720])
def test_state_dir_writable_by_group_or_others_is_refused(tmp_path, mode):
    d = tmp_path / "state"
    d.mkdir()
    os.chmod(d, mode)
    with pytest.raises(StateError) as ei:
        _use(StateStore(d))
    assert "writable by group or others" in ei.value.msg and f"{stat.S_IMODE(mode):04o}" in ei.value.msg
    assert f"chmod 0700 {d}" in ei.value.msg
    assert list(d.iterdir()) == []


def test_state_dir_readable_by_others_is_used(tmp_path):
    """0755 is what a pre-made directory often has (a Kubernetes hostPath DirectoryOrCreate):
    readable, but nobody else can replace the state in it."""
    d = tmp_path / "state"
    d.mkdir()
    os.chmod(d, 0o755)
    _use(StateStore(d))
    assert [a.containerID for a in StateStore(d).read_files().attachments] == ["a"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory to another uid")
def test_state_dir_of_another_owner_is_refused(tmp_path):
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(StateError) as ei:
        _use(StateStore(d))
    assert "owned by uid 65534" in ei.value.msg


def test_state_dir_that_is_a_regular_file_says_so(tmp_path):
    f = tmp_path / "state"
    f.write_text("")
    for use in (_use, lambda s: s.read()):
        with pytest.raises(StateError) as ei:
            use(StateStore(f))
        assert ei.value.msg == f"failed to use state directory {f}: it is a regular file, not a directory"


def test_created_state_dir_is_private(tmp_path):
    d = tmp_path / "a" / "state"
    _use(StateStore(d))
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700


def test_state_dir_costs_one_lstat_per_store(tmp_path, monkeypatch):
    """The directory check is on every invocation's path: one lstat(2) of it per store, no
    stat or mkdir, however many times the store reads or locks."""
    d = tmp_path / "state"
    _use(StateStore(d))  # exists from now on
    calls: list[str] = []
    for name in ("lstat", "stat", "mkdir"):
        real = getattr(os, name)

        def spy(path, *a, _real=real, _name=name, **kw):
            if os.fspath(path) == str(d):
                calls.append(_name)
            return _real(path, *a, **kw)

        monkeypatch.setattr(os, name, spy)
    store = StateStore(d)
    store.peek()
    store.read()
    _use(store, "b")
    with store.transaction():
        pass
    assert calls == ["lstat"]


def test_prepared_claims_are_decoded_once_and_again_after_a_change():
    txn = Txn(NodeState())
    txn.set_claims("pod", [_claim("u1", "eth-b", "6G", "sh")])
    first = txn.state.prepared("pod")
    assert first[0].uid == "u1" and first[0].results[0].device == "eth-b"
    assert first[0].results[0].consumedCapacity == {"bandwidth": Quantity.parse("6G")}
    assert txn.state.prepared("pod") is first  # not decoded again
    txn.set_claims("pod", [_claim("u2", "eth-a", "1G", "sh2")])
    assert [c.uid for c in txn.state.prepared("pod")] == ["u2"]
    assert txn.state.claim_pods("u2") == {"pod"} and txn.state.claim_pods("u1") == set()
    assert txn.state.prepared("other") == ()
