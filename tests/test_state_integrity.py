"""State integrity: checksum, backup, migration, lock hardening, intents and recovery.

Unprivileged: recovery here deals with attachments that have no netns and no IPAM, so it
touches no link and runs no plugin; the netns tests cover those paths for real.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_dra import faults
from cni_dra.attach.rebuild import repair
from cni_dra.attach.recover import recover
from cni_dra.errors import StateError, TryAgainLaterError
from cni_dra.host.kernel import KernelHost
from cni_dra.quantity import Quantity
from cni_dra.state import Attachment, NodeState, StateStore
from cni_dra.state.migrations import migrate
from cni_dra.state.schema import SCHEMA_VERSION, Owner
from cni_dra.state.store import boot_id, current_owner, decode_state, encode_state, owner_alive
from tests.fake_host import FakeHost


def _att(cid: str, bw: str = "1G", **kw) -> Attachment:
    kw.setdefault("phase", "ready")
    return Attachment(
        network="net",
        containerID=cid,
        ifname="eth0",
        driver="d",
        pool="p",
        device="nic-a",
        parent="eth9",
        consumedCapacity={"bandwidth": Quantity.parse(bw)},
        **kw,
    )


def _claim(uid: str) -> dict:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "net",
                            "driver": "d",
                            "pool": "p",
                            "device": "nic-b",
                            "consumedCapacity": {"bandwidth": "3G"},
                            "shareID": "5f0c",
                        }
                    ]
                }
            }
        },
    }


def _dead_owner() -> Owner:
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=lambda: None)
    child.start()
    child.join()
    return Owner(pid=child.pid, start=1, boot=boot_id())


states = st.builds(
    lambda cids, bws, claim: NodeState(
        bootID="b",
        attachments=[_att(c, b) for c, b in zip(cids, bws, strict=False)],
        claims={"pod": [_claim("u")]} if claim else {},
    ),
    st.lists(st.from_regex(r"[a-z0-9]{1,12}", fullmatch=True), max_size=4, unique=True),
    st.lists(st.sampled_from(["100M", "1G", "2500M", "10G"]), min_size=4, max_size=4),
    st.booleans(),
)


# -- checksum ------------------------------------------------------------------------------
@given(states)
def test_encode_decode_round_trip(state):
    assert decode_state(encode_state(state)) == state


def test_file_is_json_with_checksum_over_the_rest():
    data = encode_state(NodeState(attachments=[_att("c1")]))
    obj = json.loads(data)
    assert obj["schemaVersion"] == SCHEMA_VERSION
    body = data[: data.rindex(b',"checksum"')] + b"}"
    assert obj["checksum"] == "sha256:" + hashlib.sha256(body).hexdigest()


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(states, st.data())
def test_truncated_file_is_never_read(state, data):
    raw = encode_state(state)
    cut = data.draw(st.integers(0, len(raw) - 2))  # the trailing newline alone is optional
    with pytest.raises(StateError) as ei:
        decode_state(raw[:cut])
    assert ei.value.code == 5 and "corrupt" in ei.value.msg


@settings(max_examples=300)
@given(states, st.data())
def test_any_changed_byte_is_detected(state, data):
    raw = bytearray(encode_state(state))
    i = data.draw(st.integers(0, len(raw) - 2))
    new = data.draw(st.integers(0, 255).filter(lambda b: b != raw[i]))
    raw[i] = new
    with pytest.raises(StateError):
        decode_state(bytes(raw))


@pytest.mark.parametrize(
    "content,why",
    [
        (b"", "not valid JSON"),
        (b'{"schemaVersion": 2, "attachments": [', "not valid JSON"),
        (b'{"schemaVersion": 2, "attachments": []}', "checksum missing"),
        (b"[]", "not an object"),
    ],
)
def test_corrupt_files_name_the_problem(tmp_path, content, why):
    (tmp_path / "state.json").write_bytes(content)
    with pytest.raises(StateError) as ei:
        StateStore(tmp_path).read()
    assert why in ei.value.msg and "state repair" in ei.value.msg


def test_missing_file_with_a_backup_is_not_empty(tmp_path):
    store = StateStore(tmp_path)
    for cid in ("c1", "c2"):
        with store.transaction() as txn:
            txn.put(_att(cid))
    (tmp_path / "state.json").unlink()
    with pytest.raises(StateError, match="missing but state.json.bak exists"):
        store.read()


# -- migration -----------------------------------------------------------------------------
def test_schema_1_file_is_migrated_and_rewritten_as_current(tmp_path):
    v1 = {
        "schemaVersion": 1,
        "claims": {"pod": [_claim("u")]},
        "attachments": [
            {
                "network": "net",
                "containerID": "c1",
                "ifname": "eth0",
                "driver": "d",
                "pool": "p",
                "device": "nic-a",
                "ifName": "eth9",
                "consumedCapacity": {"bandwidth": "2G"},
                "phase": "ready",
            }
        ],
    }
    (tmp_path / "state.json").write_text(json.dumps(v1))
    store = StateStore(tmp_path)
    got = store.read()
    assert got.schemaVersion == SCHEMA_VERSION and got.bootID is None
    assert got.find("net", "c1", "eth0").consumedCapacity == {"bandwidth": Quantity.parse("2G")}
    with store.transaction() as txn:
        txn.set_boot_id("x")
    raw = json.loads((tmp_path / "state.json").read_bytes())  # no journal in a schema-1 file: a new snapshot
    assert raw["schemaVersion"] == SCHEMA_VERSION and raw["checksum"].startswith("sha256:")
    assert raw["journal"]["seq"] == 0 and raw["bootID"] == "x"
    assert (tmp_path / "state.json.bak").read_bytes() == (tmp_path / "state.json").read_bytes()


def test_newer_schema_is_refused():
    with pytest.raises(ValueError, match="newer"):
        migrate({"schemaVersion": SCHEMA_VERSION + 1})
    with pytest.raises(StateError, match="newer than this cni-dra"):
        body = b'{"schemaVersion":9,"attachments":[]}'
        decode_state(body[:-1] + b',"checksum":"sha256:' + hashlib.sha256(body).hexdigest().encode() + b'"}')


# -- atomic writes and backup --------------------------------------------------------------
def test_each_snapshot_is_written_twice_and_the_backup_takes_the_journal(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    first = (tmp_path / "state.json").read_bytes()
    assert (tmp_path / "state.json.bak").read_bytes() == first
    with store.transaction() as txn:  # journaled: the snapshot and its copy stay
        txn.put(_att("c2"))
    assert (tmp_path / "state.json").read_bytes() == first == (tmp_path / "state.json.bak").read_bytes()
    (tmp_path / "state.json").write_bytes(
        b"\x00" * 10
    )  # damage the snapshot: the copy + journal still hold all
    assert [a.containerID for a in store.read_backup().attachments] == ["c1", "c2"]


def test_crash_before_rename_leaves_old_file_and_leftover_is_cleaned(tmp_path, monkeypatch):
    store = StateStore(tmp_path, journal_limit_bytes=0)  # every commit writes a snapshot
    with store.transaction() as txn:
        txn.put(_att("c1"))
    before = (tmp_path / "state.json").read_bytes()
    real_replace = os.replace

    def crash(src, dst):
        if str(dst).endswith("state.json"):
            raise OSError(5, "simulated crash")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StateError):
        with store.transaction() as txn:
            for _a in list(txn.attachments):
                txn.remove(*_a.key)
    monkeypatch.setattr(os, "replace", real_replace)
    assert (tmp_path / "state.json").read_bytes() == before
    (tmp_path / ".state.json.99999.tmp").write_bytes(b"half")  # left by a writer that died
    with store.transaction() as txn:
        txn.put(_att("c2"))
    assert not list(tmp_path.glob(".state.json*.tmp"))


# -- lock ----------------------------------------------------------------------------------
def test_symlinked_lock_file_is_refused_and_target_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "state").mkdir(mode=0o700)
    os.symlink(victim, tmp_path / "state" / "state.lock")
    with pytest.raises(StateError, match="symlink"):
        StateStore(tmp_path / "state").read()
    assert victim.read_text() == "precious"


def test_lock_timeout_in_a_thread_gives_code_11(tmp_path):
    import fcntl

    store = StateStore(tmp_path, lock_timeout_s=0.2)
    store.read()  # creates the lock file
    fd = os.open(tmp_path / "state.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    errors: list[BaseException] = []

    def worker():
        try:
            store.read()
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    try:
        t = threading.Thread(target=worker)
        t.start()
        t.join(5)
    finally:
        os.close(fd)
    assert len(errors) == 1 and isinstance(errors[0], TryAgainLaterError) and errors[0].code == 11


# -- owners, recovery ----------------------------------------------------------------------
def test_owner_liveness():
    me = current_owner()
    assert owner_alive(me)
    assert not owner_alive(_dead_owner())
    assert not owner_alive(Owner(pid=me.pid, start=me.start, boot="another-boot"))
    assert not owner_alive(Owner(pid=me.pid, start=me.start + 1, boot=me.boot))  # pid reused
    assert not owner_alive(None)


def test_recover_undoes_stale_intents_and_keeps_live_ones(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.set_boot_id(boot_id())
        txn.put_all(
            [
                _att("done"),
                _att("crashed-add", phase="adding", owner=_dead_owner(), steps=["link"]),
                _att("crashed-del", phase="deleting", owner=_dead_owner()),
                _att("in-flight", phase="adding", owner=current_owner()),
            ]
        )
    report = recover(store, environ={}, host=KernelHost())
    assert {a.containerID for a in store.read().attachments} == {"done", "in-flight"}
    assert report.errors == []
    assert any("crashed-add" in line and "its process died" in line for line in report.changes)
    assert recover(store, environ={}, host=KernelHost()).changes == []  # converged


def test_recover_after_reboot_releases_gone_netns_and_keeps_claims(tmp_path):
    store = StateStore(tmp_path)
    live_ns = f"/proc/{os.getpid()}/ns/net"  # exists (recovery only asks whether it is gone)
    with store.transaction() as txn:
        txn.set_boot_id("previous-boot")
        txn.set_claims("pod", [_claim("u")])
        txn.put_all([_att("gone", netns=str(tmp_path / "no-such-netns")), _att("alive", netns=live_ns)])
    report = recover(store, environ={}, host=KernelHost())
    got = store.read()
    assert {a.containerID for a in got.attachments} == {"alive"}
    assert got.claims == {"pod": [_claim("u")]} and got.bootID == boot_id()
    assert any("boot id changed" in line for line in report.changes)


def test_repair_restores_backup_and_drops_dead_attachments(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.set_claims("pod", [_claim("u")])
        txn.put(_att("c1"))
    with store.transaction() as txn:
        txn.put(_att("c2"))
    (tmp_path / "state.json").write_bytes(b'{"schemaVersion": 2, "attac')
    report = repair(store, environ={}, host=FakeHost(every_path_a_netns=False))
    text = "\n".join(report.changes)
    assert "moved the unreadable state.json to state.json.corrupt-" in text
    # the backup is the snapshot's second copy, and the journal (c2) applies to it
    assert "restored 2 attachment(s) and 1 prepared claim(s) from state.json.bak" in text
    assert (
        "dropped attachment net/c1/eth0" in text and "dropped attachment net/c2/eth0" in text
    )  # no live link
    got = store.read()
    assert got.attachments == [] and got.claims == {"pod": [_claim("u")]}
    assert len(list(tmp_path.glob("state.json.corrupt-*"))) == 1


def test_repair_without_backup_starts_empty_and_says_so(tmp_path):
    (tmp_path / "state.json").write_bytes(b"\x00" * 10)
    report = repair(StateStore(tmp_path), environ={}, host=FakeHost(every_path_a_netns=False))
    assert any("starting from an empty state" in line for line in report.changes)
    assert StateStore(tmp_path).read().attachments == []


def test_repair_with_a_corrupt_backup_says_why_it_starts_empty_without_sending_you_to_repair(tmp_path):
    (tmp_path / "state.json").write_bytes(b"garbage")
    (tmp_path / "state.json.bak").write_bytes(b"garbage")
    report = repair(StateStore(tmp_path), environ={}, host=FakeHost(every_path_a_netns=False))
    (line,) = [line for line in report.changes if "starting from an empty state" in line]
    assert line.startswith("failed to read state ") and "state.json.bak: file is corrupt" in line
    assert "state repair" not in "\n".join(report.changes)


# -- fault points --------------------------------------------------------------------------
def _fire(name: str) -> None:
    faults.fault_point(name)
    os._exit(0)


@pytest.mark.parametrize("switch,expect", [(True, -signal.SIGKILL), (False, 0)])
def test_fault_point_needs_env_and_switch(tmp_path, monkeypatch, switch, expect):
    monkeypatch.setattr(faults, "SWITCH_FILE", str(tmp_path / "switch"))
    monkeypatch.setenv(faults.FAULT_ENV, "x:other,add:reserved")
    if switch:
        (tmp_path / "switch").write_text("")
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_fire, args=("add:reserved",))
    child.start()
    child.join(10)
    assert child.exitcode == expect


def test_symlinked_switch_does_not_arm(tmp_path, monkeypatch):
    (tmp_path / "real").write_text("")
    os.symlink(tmp_path / "real", tmp_path / "switch")
    monkeypatch.setattr(faults, "SWITCH_FILE", str(tmp_path / "switch"))
    assert not faults.switch_on()


def test_recovered_claim_mode_add_leaves_a_failure_record_for_the_agent(tmp_path):
    from cni_dra.state import ClaimRef

    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.set_boot_id(boot_id())
        txn.put(
            _att(
                "crashed",
                phase="adding",
                owner=_dead_owner(),
                claim=ClaimRef(namespace="ns", name="c", uid="cu", request="net"),
            )
        )
    recover(store, environ={}, host=KernelHost())
    got = store.read()
    assert got.attachments == []
    (rec,) = got.statusUpdates
    assert rec["ready"] is False and rec["claim"]["uid"] == "cu" and "interrupted" in rec["message"]


def test_recover_releases_ipam_of_a_previous_boot_intent_whatever_its_steps(tmp_path):
    """Intent steps of older versions were journaled without fsync: after a kernel crash an ADD's
    "ipam" step may be lost though host-local kept the address, so an intent whose owner ran
    in an earlier boot gets an IPAM DEL anyway; one of this boot with no step does not."""
    log = tmp_path / "ipam.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    plugin = bin_dir / "fake-ipam"
    plugin.write_text(f'#!/bin/sh\necho "$CNI_COMMAND $CNI_CONTAINERID" >> {log}\n')
    plugin.chmod(0o755)
    conf = json.dumps({"cniVersion": "1.0.0", "name": "net", "ipam": {"type": "fake-ipam"}})
    me = current_owner()
    store = StateStore(tmp_path / "state")
    with store.transaction() as txn:
        txn.set_boot_id(boot_id())
        txn.put_all(
            [
                _att("this-boot", phase="adding", owner=_dead_owner(), ipamType="fake-ipam", ipamConf=conf),
                _att(
                    "earlier-boot",
                    phase="adding",
                    owner=Owner(pid=me.pid, start=me.start, boot="earlier"),
                    ipamType="fake-ipam",
                    ipamConf=conf,
                ),
            ]
        )
    report = recover(store, environ={"PATH": "/usr/bin:/bin"}, host=KernelHost(), cni_path=[str(bin_dir)])
    assert report.errors == []
    assert store.read().attachments == []
    assert log.read_text().split("\n")[:-1] == ["DEL earlier-boot"]


def test_repair_keeps_a_live_owners_add_with_a_live_link_as_ready(tmp_path, monkeypatch):
    """After a bad journal line the "ready" record of an agent-served ADD may be lost while
    the agent (the intent's owner) lives on: with its link live it is kept as ready, so its
    DEL is not refused as "ADD in progress" for as long as the agent runs. An intent of a
    live owner without a live link stays in flight."""
    from tests.fake_host import nic

    me = current_owner()
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put_all(
            [
                _att("served", phase="adding", owner=me, netns="/var/run/netns/a"),
                _att("in-flight", phase="adding", owner=me, netns="/var/run/netns/b"),
            ]
        )
    (tmp_path / "state.json").write_bytes(b"\x00" * 10)  # damaged: repair takes the backup copy
    host = FakeHost()  # the served ADD's link is live on its parent, without shaping
    host.add_nic("eth9", 7)
    host.put_link("/var/run/netns/a", nic("eth0", 3), "eth9")
    report = repair(store, environ={}, host=host)
    got = {a.containerID: a for a in store.read().attachments}
    assert got["served"].phase == "ready" and got["served"].owner is None
    assert got["in-flight"].phase == "adding" and got["in-flight"].owner == me
    assert any("kept attachment net/served/eth0" in line and "as ready" in line for line in report.changes)
