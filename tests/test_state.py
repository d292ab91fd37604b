"""State store: round trip, atomic replace, corrupt files, lock timeout, consumption books."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat

import pytest

from cni_dra.errors import StateError, TryAgainLaterError
from cni_dra.quantity import Quantity
from cni_dra.state import SCHEMA_VERSION, Attachment, NodeState, StateStore


def _att(cid: str, device: str, bw: str, **kw) -> Attachment:
    return Attachment(
        network="net1", containerID=cid, ifname="eth0", driver="d", pool="p", device=device,
        ifName=device, consumedCapacity={"bandwidth": Quantity.parse(bw)}, shareID=f"s-{cid}", **kw,
    )


def _claim(uid: str, device: str, bw: str, share: str, pool: str = "p") -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": f"c-{uid}", "namespace": "ns", "uid": uid},
        "status": {"allocation": {"devices": {"results": [
            {"request": "net", "driver": "d", "pool": pool, "device": device,
             "consumedCapacity": {"bandwidth": bw}, "shareID": share}]}}},
    }


def test_missing_file_reads_as_empty_state(tmp_path):
    assert StateStore(tmp_path / "s").read().attachments == []


def test_round_trip_keeps_attachments_and_claims(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as st:
        st.attachments.append(_att("c1", "eth-a", "4G"))
        st.claims["pod"] = [_claim("u1", "eth-b", "6G", "sh")]
    again = store.read()
    assert again.find("net1", "c1", "eth0").consumedCapacity == {"bandwidth": Quantity.parse("4000M")}
    assert again.claims["pod"][0]["metadata"]["uid"] == "u1"
    raw = json.loads((tmp_path / "state.json").read_text())  # the first commit writes the snapshot
    assert raw["schemaVersion"] == SCHEMA_VERSION == 3
    assert raw["attachments"][0]["consumedCapacity"] == {"bandwidth": "4G"}


def test_files_are_private(tmp_path):
    store = StateStore(tmp_path / "state")
    with store.transaction() as st:
        st.attachments.append(_att("c1", "eth-a", "1G"))
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "state.json").st_mode) == 0o600


def test_failed_transaction_writes_nothing(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as st:
        st.attachments.append(_att("c1", "eth-a", "1G"))
    before = (tmp_path / "state.json").read_bytes()
    with pytest.raises(RuntimeError):
        with store.transaction() as st:
            st.attachments.clear()
            raise RuntimeError("boom")
    assert (tmp_path / "state.json").read_bytes() == before


def test_write_is_atomic_replace(tmp_path):
    """A snapshot is replaced by rename: a reader holding the old inode sees the old bytes whole."""
    store = StateStore(tmp_path, journal_limit_bytes=0)  # every commit writes a snapshot
    with store.transaction() as st:
        st.attachments.append(_att("c1", "eth-a", "1G"))
    old_inode = os.stat(tmp_path / "state.json").st_ino
    with open(tmp_path / "state.json", "rb") as held:
        with store.transaction() as st:
            st.attachments.append(_att("c2", "eth-a", "2G"))
        assert len(json.loads(held.read())["attachments"]) == 1
    assert os.stat(tmp_path / "state.json").st_ino != old_inode
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


@pytest.mark.parametrize("content", [b"", b"{\"schemaVersion\": 1, \"attachments\": [", b"\x00\x00garbage", b"[]"])
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
            with store.transaction() as st:
                st.attachments.append(_att("c1", "eth-a", "1G"))
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
    with StateStore(tmp_path, lock_timeout_s=2).transaction() as st:
        st.attachments.append(_att("c1", "eth-a", "1G"))
    assert StateStore(tmp_path).read().find("net1", "c1", "eth0") is not None


def test_consumption_counts_attachments_and_unattached_claims_once():
    st = NodeState()
    st.attachments.append(_att("c1", "eth-a", "4G"))
    st.attachments.append(_att("c2", "eth-a", "3G", phase="ready"))
    st.claims["pod5"] = [_claim("u5", "eth-b", "6G", "share5")]
    st.claims["pod6"] = [_claim("u5", "eth-b", "6G", "share5")]  # same claim shared by two pods
    st.claims["other"] = [_claim("u7", "eth-b", "9G", "x", pool="other-pool")]
    used = st.consumed_by_device("d", "p")
    assert used["eth-a"]["bandwidth"] == Quantity.parse("7G")
    assert used["eth-b"]["bandwidth"] == Quantity.parse("6G")
    # once pod5's claim is attached, it is counted through the attachment only
    att = _att("c5", "eth-b", "6G")
    att.shareID = "share5"
    att.claim = __import__("cni_dra.state", fromlist=["ClaimRef"]).ClaimRef(uid="u5", name="c-u5", namespace="ns")
    st.attachments.append(att)
    assert st.consumed_by_device("d", "p")["eth-b"]["bandwidth"] == Quantity.parse("6G")


def test_remove_returns_the_attachment_and_is_idempotent():
    st = NodeState(attachments=[_att("c1", "eth-a", "1G")])
    assert st.remove("net1", "c1", "eth0").containerID == "c1"
    assert st.remove("net1", "c1", "eth0") is None
    assert st.attachments == []
