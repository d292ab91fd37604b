"""The state journal: commits cost what they change, readers rebuild snapshot + records.

Source of the rules: cni_dra/state/store.py module docstring (torn last record ignored,
bad record before others is corruption, stale journal ignored, compaction, cache)."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cni_dra.attach.rebuild import repair
from cni_dra.errors import StateError
from cni_dra.quantity import Quantity
from cni_dra.state import Attachment, NodeState, StateStore, journal, ops, reading
from cni_dra.state import cache as state_cache
from cni_dra.state.store import JOURNAL_FILE, encode_state
from tests.fake_host import FakeHost


def _att(cid: str, bw: str = "1G", **kw) -> Attachment:
    return Attachment(
        network="net",
        containerID=cid,
        ifname="eth0",
        driver="d",
        pool="p",
        device="nic-a",
        parent="eth9",
        consumedCapacity={"bandwidth": Quantity.parse(bw)},
        phase="ready",
        **kw,
    )


def _fresh(path) -> NodeState:
    """The state as a new process reads it (no cache)."""
    state_cache.CACHE.clear()
    return StateStore(path).read()


def _ids(state: NodeState) -> list[str]:
    return [a.containerID for a in state.attachments]


def test_a_commit_appends_one_record_and_leaves_the_snapshot(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    snapshot = (tmp_path / "state.json").read_bytes()
    with store.transaction() as txn:
        txn.update(("net", "c1", "eth0"), phase="deleting")
        txn.put(_att("c2"))
    assert (tmp_path / "state.json").read_bytes() == snapshot
    lines = (tmp_path / JOURNAL_FILE).read_bytes().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["seq"] == 1 and record["j"] == json.loads(snapshot)["journal"]["id"]
    assert [list(op) for op in record["ops"]] == [["put"], ["put"]]
    got = _fresh(tmp_path)
    assert _ids(got) == ["c1", "c2"] and got.find("net", "c1", "eth0").phase == "deleting"


def test_removal_claims_status_and_boot_id_are_journaled(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put_all([_att("c1"), _att("c2"), _att("c3")])
        txn.set_claims("pod-a", [{"metadata": {"uid": "u1"}}])
    with store.transaction() as txn:
        txn.remove("net", "c2", "eth0")
        txn.set_claims("pod-a", [*txn.claims["pod-a"], {"metadata": {"uid": "u2"}}])
        txn.set_claims("pod-b", [{"metadata": {"uid": "u3"}}])
        txn.add_status_update({"claim": {"uid": "u1"}, "ready": True})
        txn.set_boot_id("boot-2")
    assert (tmp_path / JOURNAL_FILE).exists()
    got = _fresh(tmp_path)
    assert _ids(got) == ["c1", "c3"]
    assert [c["metadata"]["uid"] for c in got.claims["pod-a"]] == ["u1", "u2"]
    assert got.claims["pod-b"] == [{"metadata": {"uid": "u3"}}]
    assert got.statusUpdates == [{"claim": {"uid": "u1"}, "ready": True}] and got.bootID == "boot-2"
    with store.transaction() as txn:
        txn.set_claims("pod-a", None)
        txn.set_status_updates([])
    got = _fresh(tmp_path)
    assert set(got.claims) == {"pod-b"} and got.statusUpdates == []


def test_a_torn_last_record_is_ignored_then_cut_off(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    with store.transaction() as txn:
        txn.put(_att("c2"))
    journal = tmp_path / JOURNAL_FILE
    good = journal.read_bytes()
    with open(journal, "ab") as f:  # a writer died halfway through its append
        f.write(b'{"j":"x","seq":2,"ops":[{"put":{"netw')
    assert _ids(_fresh(tmp_path)) == ["c1", "c2"]
    with StateStore(tmp_path).transaction() as txn:
        txn.put(_att("c3"))
    data = journal.read_bytes()
    assert data.startswith(good) and data.count(b"\n") == 2  # the torn bytes are gone
    assert _ids(_fresh(tmp_path)) == ["c1", "c2", "c3"]


def test_a_bad_record_before_good_ones_is_corruption_and_repair_keeps_the_good_prefix(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    for cid in ("c2", "c3"):
        with store.transaction() as txn:
            txn.put(_att(cid))
    journal = tmp_path / JOURNAL_FILE
    first, second = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(first + second.replace(b'"c3"', b'"c4"'))  # checksum no longer matches, then...
    with open(journal, "ab") as f:
        f.write(first)  # ...a well-formed line after it: not a torn tail
    with pytest.raises(StateError, match="journal is corrupt") as err:
        _fresh(tmp_path)
    assert err.value.code == 5
    report = repair(StateStore(tmp_path), environ={}, host=FakeHost(every_path_a_netns=False))
    text = "\n".join(report.changes)
    assert "journal records before the bad one" in text
    assert list(tmp_path.glob(f"{JOURNAL_FILE}.corrupt-*"))
    assert _ids(_fresh(tmp_path)) == []  # c1/c2 dropped by repair: no live link (no netns)


def test_a_journal_of_another_snapshot_is_ignored(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    with store.transaction() as txn:
        txn.put(_att("c2"))
    # someone writes a snapshot of their own (no journal reference): the journal is stale
    (tmp_path / "state.json").write_bytes(encode_state(NodeState(attachments=[_att("x")])))
    assert _ids(_fresh(tmp_path)) == ["x"]
    with StateStore(tmp_path).transaction() as txn:
        txn.put(_att("y"))
    assert _ids(_fresh(tmp_path)) == ["x", "y"]


def test_the_journal_is_folded_into_a_new_snapshot_past_its_limit(tmp_path):
    store = StateStore(tmp_path, journal_limit_bytes=2000)
    with store.transaction() as txn:
        txn.put(_att("c0"))
    first = json.loads((tmp_path / "state.json").read_bytes())["journal"]["id"]
    i = 0
    while json.loads((tmp_path / "state.json").read_bytes())["journal"]["id"] == first:
        i += 1
        with store.transaction() as txn:
            txn.put(_att(f"c{i}"))
        assert i < 50, "never compacted"
    assert not (tmp_path / JOURNAL_FILE).exists()
    snap = json.loads((tmp_path / "state.json").read_bytes())
    assert [a["containerID"] for a in snap["attachments"]] == [f"c{k}" for k in range(i + 1)]
    assert (tmp_path / "state.json.bak").read_bytes() == (tmp_path / "state.json").read_bytes()


def _other_process_adds(path: str, cid: str) -> None:
    state_cache.CACHE.clear()
    with StateStore(path).transaction() as txn:
        txn.put(_att(cid))


def test_a_cached_reader_sees_what_another_process_appended(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    with store.transaction() as txn:
        txn.put(_att("c2"))
    assert _ids(store.read()) == ["c1", "c2"]  # now cached in this process
    proc = multiprocessing.get_context("fork").Process(target=_other_process_adds, args=(str(tmp_path), "c3"))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    assert _ids(store.read()) == ["c1", "c2", "c3"]


def test_a_change_outside_a_transaction_is_refused(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    with pytest.raises(ValidationError, match="frozen"):
        store.read().attachments[0].phase = "deleting"  # read() is read-only, and so is what it holds
    with store.transaction() as txn:
        assert txn.attachments[0].phase == "ready"


def test_failed_transaction_leaves_memory_and_disk_as_they_were(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    with pytest.raises(RuntimeError):
        with store.transaction() as txn:
            txn.update(txn.attachments[0], phase="deleting")
            txn.put(_att("c2"))
            raise RuntimeError("boom")
    got = store.read()
    assert _ids(got) == ["c1"] and got.attachments[0].phase == "ready"


def test_verify_mode_catches_a_cache_that_differs_from_the_files(tmp_path, monkeypatch):
    monkeypatch.setenv("CNI_DRA_STATE_VERIFY", "1")
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    with pytest.raises(StateError, match="does not reproduce"):
        with store.transaction() as txn:
            ops.apply(txn.state, ops.Put(_att("c2")))  # applied, not kept: the journal never sees it
            txn.set_boot_id("other")  # something kept, so a record is written


# -- property: any sequence of transactions reads back the same from scratch ---------------
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 7)),
        st.tuples(st.just("del"), st.integers(0, 7)),
        st.tuples(st.just("phase"), st.integers(0, 7)),
        st.tuples(st.just("claim"), st.integers(0, 3)),
        st.tuples(st.just("unclaim"), st.integers(0, 3)),
        st.tuples(st.just("status"), st.integers(0, 3)),
        st.tuples(st.just("boot"), st.integers(0, 3)),
        st.tuples(st.just("fail"), st.integers(0, 7)),
        st.tuples(st.just("reorder"), st.integers(0, 7)),
    ),
    max_size=6,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_ops, min_size=1, max_size=12), st.sampled_from([0, 600, 1 << 20]))
def test_any_sequence_of_transactions_reads_back_from_scratch(tmp_path_factory, transactions, limit):
    path = tmp_path_factory.mktemp("journal")
    store = StateStore(path, journal_limit_bytes=limit)
    for txn_ops in transactions:
        fails = any(op == "fail" for op, _ in txn_ops)
        try:
            with store.transaction() as txn:
                for op, n in txn_ops:
                    cid = f"c{n}"
                    att = txn.find("net", cid, "eth0")
                    if op == "add" and att is None:
                        txn.put(_att(cid))
                    elif op == "del" and att is not None:
                        txn.remove("net", cid, "eth0")
                    elif op == "phase" and att is not None:
                        txn.update(att, phase="deleting" if att.phase == "ready" else "ready")
                    elif op == "claim":
                        txn.set_claims(
                            f"pod{n}",
                            [*txn.claims.get(f"pod{n}", ()), {"metadata": {"uid": f"u{len(txn.claims)}"}}],
                        )
                    elif op == "unclaim":
                        txn.set_claims(f"pod{n}", None)
                    elif op == "status":
                        txn.add_status_update({"n": n})
                    elif op == "boot":
                        txn.set_boot_id(f"b{n}")
                    elif op == "reorder" and att is not None:  # a removed key comes back last
                        txn.remove("net", cid, "eth0")
                        txn.put(att)
                if fails:
                    raise RuntimeError("rolled back")
        except RuntimeError:
            pass
        in_memory = store.read().model_dump(mode="json")  # this process's cached state
        assert _fresh(path).model_dump(mode="json") == in_memory


def test_the_change_stamp_moves_with_a_journaled_commit(tmp_path):
    """The agent's status writer wakes on this stamp; a commit that only appends to the
    journal leaves state.json untouched, so the stamp must cover the journal too."""
    store = StateStore(tmp_path)
    assert store.change_stamp() is None
    with store.transaction() as txn:
        txn.put(_att("c1"))
    before = store.change_stamp()
    snapshot = (tmp_path / "state.json").read_bytes()
    with store.transaction() as txn:
        txn.add_status_update({"claim": {"uid": "u"}})
    assert (tmp_path / "state.json").read_bytes() == snapshot
    assert store.change_stamp() != before


def test_replaying_another_process_records_keeps_the_cache(tmp_path, monkeypatch):
    """Records replayed from the journal update this process's cached state without
    making it look changed outside a transaction (which would force a full re-read)."""
    monkeypatch.delenv("CNI_DRA_STATE_VERIFY", raising=False)  # verify mode re-reads on purpose
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    store.read()  # cached here
    proc = multiprocessing.get_context("fork").Process(target=_phase_elsewhere, args=(str(tmp_path),))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    reads = []
    real = state_cache.decode_snapshot
    monkeypatch.setattr(state_cache, "decode_snapshot", lambda *a, **k: reads.append(1) or real(*a, **k))
    with store.transaction() as txn:  # replays the other process's record, then commits its own
        assert txn.find("net", "c1", "eth0").phase == "deleting"
        txn.set_boot_id("b")
    with store.transaction() as txn:
        txn.set_boot_id("c")
    assert reads == []  # the snapshot was never parsed again


def _phase_elsewhere(path: str) -> None:
    state_cache.CACHE.clear()
    with StateStore(path).transaction() as txn:
        txn.update(("net", "c1", "eth0"), phase="deleting")


def test_a_non_durable_commit_is_appended_without_fdatasync(tmp_path, monkeypatch):
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    with store.transaction() as txn:  # the journal file exists from here on
        txn.set_boot_id("b0")
    synced = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: synced.append(fd) or real(fd))
    with store.transaction(durable=False) as txn:
        txn.update(("net", "c1", "eth0"), steps=["link"])
    assert synced == []
    with store.transaction() as txn:
        txn.set_boot_id("b1")
    assert len(synced) == 1  # a durable commit syncs the file, the earlier record with it
    assert _fresh(tmp_path).find("net", "c1", "eth0").steps == ("link",)


def test_a_same_size_edit_of_a_read_record_is_noticed_by_a_cached_reader(tmp_path, monkeypatch):
    """A cached process must not keep trusting a journal someone damaged in place."""
    import time

    monkeypatch.delenv("CNI_DRA_STATE_VERIFY", raising=False)
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    for cid in ("c2", "c3"):
        with store.transaction() as txn:
            txn.put(_att(cid))
    store.read()  # cached, journal read to its end
    journal = tmp_path / JOURNAL_FILE
    data = journal.read_bytes()
    time.sleep(0.01)  # a later mtime for sure
    journal.write_bytes(data.replace(b'"c2"', b'"x2"', 1))  # same size, checksum now wrong
    with pytest.raises(StateError, match="journal is corrupt"):
        with store.transaction() as txn:
            txn.set_boot_id("b")


def _compact_elsewhere(path: str, before: int) -> None:
    """Another process: ``before`` commits, then one whose store compacts at once."""
    state_cache.CACHE.clear()
    for i in range(before):
        with StateStore(path, journal_limit_bytes=10**9).transaction() as txn:
            txn.put(_att(f"o{i}"))
    with StateStore(path, journal_limit_bytes=1).transaction() as txn:
        txn.put(_att("last"))


def _after_compaction_elsewhere(tmp_path, monkeypatch, before: int) -> tuple[NodeState, list[int]]:
    """This process reads, another commits ``before`` + 1 records and folds the journal;
    returns what this process then reads, and how many snapshots it decoded for it."""
    monkeypatch.delenv("CNI_DRA_STATE_VERIFY", raising=False)  # verify mode re-reads on purpose
    store = StateStore(tmp_path, journal_limit_bytes=10**9)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    for phase in ("deleting", "ready", "deleting"):  # a journal longer than the snapshot
        with store.transaction() as txn:
            txn.update(("net", "c1", "eth0"), phase=phase)
    store.read()  # cached here, up to the last record
    first = json.loads((tmp_path / "state.json").read_bytes())["journal"]["id"]
    proc = multiprocessing.get_context("fork").Process(
        target=_compact_elsewhere, args=(str(tmp_path), before)
    )
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    assert json.loads((tmp_path / "state.json").read_bytes())["journal"]["id"] != first  # folded
    decodes: list[int] = []
    real = state_cache.decode_snapshot
    monkeypatch.setattr(state_cache, "decode_snapshot", lambda *a, **k: decodes.append(1) or real(*a, **k))
    return store.read(), decodes


def test_a_process_a_few_records_behind_takes_up_another_process_compaction_without_decoding(
    tmp_path, monkeypatch
):
    state, decodes = _after_compaction_elsewhere(tmp_path, monkeypatch, before=3)
    assert decodes == []  # the 10,000-attachment snapshot is not parsed again
    assert _ids(state) == ["c1", "o0", "o1", "o2", "last"]
    assert state.model_dump(mode="json") == StateStore(tmp_path).read_files().model_dump(mode="json")
    with StateStore(tmp_path).transaction() as txn:  # and it goes on from there
        txn.put(_att("next"))
    assert _ids(_fresh(tmp_path)) == ["c1", "o0", "o1", "o2", "last", "next"]


def test_a_process_further_behind_than_the_folded_records_decodes_the_new_snapshot(tmp_path, monkeypatch):
    state, decodes = _after_compaction_elsewhere(tmp_path, monkeypatch, before=state_cache.RECENT + 2)
    assert decodes == [1]
    assert state.model_dump(mode="json") == StateStore(tmp_path).read_files().model_dump(mode="json")


def test_a_folded_snapshot_edited_afterwards_is_noticed_by_a_process_that_would_take_it_up(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("CNI_DRA_STATE_VERIFY", raising=False)
    store = StateStore(tmp_path, journal_limit_bytes=10**9)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    for phase in ("deleting", "ready", "deleting"):
        with store.transaction() as txn:
            txn.update(("net", "c1", "eth0"), phase=phase)
    store.read()
    proc = multiprocessing.get_context("fork").Process(target=_compact_elsewhere, args=(str(tmp_path), 0))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    path = tmp_path / "state.json"
    path.write_bytes(path.read_bytes().replace(b'"phase":"deleting"', b'"phase":"ready"   '))
    with pytest.raises(StateError, match="checksum mismatch"):
        store.read()


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_large_snapshot_decoded_into_the_cache_is_kept_out_of_the_collector(
    tmp_path, monkeypatch, unfrozen
):
    """A full collection does not walk the state a warm process keeps (reading.FREEZE_ATTACHMENTS)."""
    monkeypatch.setattr(reading, "FREEZE_ATTACHMENTS", 3)
    small, large = StateStore(tmp_path / "small"), StateStore(tmp_path / "large")
    with small.transaction() as txn:  # a first commit writes the snapshot
        txn.put_all([_att("c1"), _att("c2")])
    with large.transaction() as txn:
        txn.put_all([_att("c1"), _att("c2"), _att("c3")])
    state_cache.CACHE.clear()
    large.read_files()  # a tool's read: not kept, not frozen
    small.read()  # kept, but below the size
    assert gc.get_freeze_count() == 0
    state = large.read()
    assert gc.get_freeze_count() > 0
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(a) in tracked for a in state.attachments)


def test_a_peek_that_a_compaction_elsewhere_interrupts_still_sees_every_committed_record(
    tmp_path, monkeypatch
):
    """A peek reads the snapshot, then the journal it names, without the file lock. When
    another process folds that journal into a new snapshot and removes it in between, the
    old snapshot alone is a state older than commits that returned before the peek began
    (CHECK would answer "no attachment" for an ADD that succeeded; the claim watch would
    drop a claim it must share)."""
    monkeypatch.delenv("CNI_DRA_STATE_VERIFY", raising=False)
    store = StateStore(tmp_path, journal_limit_bytes=10**9)
    with store.transaction() as txn:
        txn.put(_att("c0"))  # the snapshot
    with store.transaction() as txn:
        txn.put(_att("c1"))  # a journal record: an ADD that returned
    state_cache.CACHE.clear()  # a process that has not read the state yet (an in-process CHECK)
    real = reading.decoded
    compacted: list[int] = []
    me = os.getpid()

    def decoded_then_compaction_elsewhere(*args, **kwargs):
        entry = real(*args, **kwargs)
        if not compacted and os.getpid() == me:  # between reading the snapshot and opening its journal
            proc = multiprocessing.get_context("fork").Process(
                target=_compact_elsewhere, args=(str(tmp_path), 0)
            )
            proc.start()
            proc.join(30)
            compacted.append(proc.exitcode)
        return entry

    monkeypatch.setattr(reading, "decoded", decoded_then_compaction_elsewhere)
    peeked = StateStore(tmp_path).peek()
    assert compacted == [0]
    assert {"c0", "c1"} <= set(_ids(peeked))


def _put_elsewhere(path: str, cid: str) -> None:
    """Another process: one commit of attachment ``cid`` (a journal record)."""
    state_cache.CACHE.clear()
    with StateStore(path, journal_limit_bytes=10**9).transaction() as txn:
        txn.put(_att(cid))


def _elsewhere(target, *args) -> int | None:
    proc = multiprocessing.get_context("fork").Process(target=target, args=args)
    proc.start()
    proc.join(30)
    return proc.exitcode


def test_a_warm_peek_that_a_compaction_elsewhere_interrupts_still_sees_every_committed_record(
    tmp_path, monkeypatch
):
    """The agent's peek: the snapshot it holds is still the file's when it looks, and the
    journal, which it has read nothing of, is folded and removed before it opens it."""
    monkeypatch.delenv("CNI_DRA_STATE_VERIFY", raising=False)
    store = StateStore(tmp_path, journal_limit_bytes=10**9)
    with store.transaction() as txn:
        txn.put(_att("c0"))  # the snapshot, cached here with none of its journal read
    assert _elsewhere(_put_elsewhere, str(tmp_path), "c1") == 0  # an ADD served elsewhere returned
    real = journal.replay
    compacted: list[int | None] = []
    me = os.getpid()

    def compaction_elsewhere_then_replay(*args, **kwargs):
        if not compacted and os.getpid() == me:
            compacted.append(_elsewhere(_compact_elsewhere, str(tmp_path), 0))
        return real(*args, **kwargs)

    monkeypatch.setattr(journal, "replay", compaction_elsewhere_then_replay)
    peeked = store.peek()
    assert compacted == [0]
    assert {"c0", "c1"} <= set(_ids(peeked))
