"""The state store under I/O faults: a full disk or an I/O error at every write, sync,
rename, truncate and unlink it makes, one at a time, for each kind of change a verb makes.

The matrix: each operation below runs once with no fault while the calls it makes are
counted (:func:`cni_dra.state.fsio.counting`); then once per call N and fault kind
(``ENOSPC``, ``EIO``, and a short write where call N is a write), on a fresh copy of the
same starting state, in this process, whose cache lives on between operations exactly as
in the agent's fast-path worker. After each run:

* an operation that returned is durable: a fresh reader of the files sees exactly what the
  no-fault run left;
* an operation that failed raised :class:`~cni_dra.errors.StateWriteError` (code 5) and,
  once its own undo ran (as the verbs' undo steps do), left exactly the starting state:
  nothing of its own, and no other attachment, claim or status record changed;
* this process's cached view (what the agent's worker answers from) equals the fresh
  reader's, and so does what ``state recover`` reports (nothing to do);
* the node recovers once the fault is gone: the same operation then succeeds and leaves
  the no-fault result.

The operations are the state changes of ADD (reserve, intent step, ready), DEL (intent,
removal), GC (through the CNI entry point), claims prepare/unprepare and compaction.
ADD and DEL with real links, the agent process and a real full tmpfs are in
netns_tests/test_io_faults.py.
"""

from __future__ import annotations

import io
import json
import os
import resource
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from cni_dra.cni import run
from cni_dra.errors import StateWriteError
from cni_dra.state import Attachment, StateStore, fsio
from cni_dra.state.preparing import prepare_claim, unprepare_claims
from cni_dra.state.schema import STEP_IPAM
from cni_dra.state.store import JOURNAL_FILE, boot_id, current_owner
from tests.builders import allocation_result, attachment, resource_claim

NET = "net1"
READY_AT = "2026-01-01T00:00:00Z"  # long ago: GC's grace period is over
IPAM_CONF = json.dumps({"cniVersion": "1.1.0", "name": NET, "type": "cni-dra", "ipam": {"type": "fake-ipam"}})


def _att(cid: str, *, phase: str = "ready", bw: str = "1G", device: str = "nic-a") -> Attachment:
    return attachment(
        cid,
        device,
        network=NET,
        driver="d",
        pool="p",
        parent=f"eth-{device[-1]}",
        phase=phase,
        netns="",
        consumedCapacity={"bandwidth": bw},
        owner=current_owner() if phase != "ready" else None,
        readyAt=READY_AT if phase == "ready" else None,
        ipamType="fake-ipam",
        ipamConf=IPAM_CONF,
    )


def _claim(uid: str, bw: str) -> dict:
    return resource_claim(
        allocation_result(
            "nic-b",
            driver="d",
            pool="p",
            consumed={"bandwidth": bw},
            share_id="5f0c1a2b-0000-4000-8000-000000000001",
        ),
        uid=uid,
        name=f"c-{uid}",
    )


def _seed(state_dir: Path) -> None:
    """Two other pods' attachments, one pod's claim, one pending status record."""
    with StateStore(state_dir).transaction() as txn:
        txn.set_boot_id(boot_id())
        txn.put_all([_att("other-1"), _att("other-2", device="nic-b", bw="3G"), _att("doomed")])
        txn.set_claims("pod-x", [_claim("u-x", "2G")])
        txn.add_status_update({"claim": "ns/c-u-x", "op": "apply"})


def _fake_ipam(bin_dir: Path) -> None:
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "fake-ipam"
    exe.write_text(
        "#!/bin/sh\n"
        'if [ "$CNI_COMMAND" = VERSION ]; then echo \'{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}\'; fi\n'
        "cat >/dev/null\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


# -- the operations: each is what one verb does to the state, undo included -------------
def _key(cid: str) -> tuple[str, str, str]:
    return (NET, cid, "eth0")


def op_add(d: Path) -> None:
    """ADD's three transactions: reserve (durable), the intent step (not synced), ready."""
    store = StateStore(d)
    with store.transaction() as txn:
        txn.put(_att("new", phase="adding"))
    try:
        with store.transaction(durable=False) as txn:
            a = txn.find(*_key("new"))
            txn.update(a, steps=[*a.steps, STEP_IPAM])
        with store.transaction() as txn:
            txn.update(
                _key("new"),
                phase="ready",
                readyAt=READY_AT,
                owner=None,
                steps=[],
                result={"cniVersion": "1.1.0", "interfaces": [{"name": "eth0"}]},
            )
    except StateWriteError:
        with store.transaction() as txn:  # ADD's undo: release the capacity
            txn.remove(*_key("new"))
        raise


def _del_intent(d: Path) -> None:
    with StateStore(d).transaction(durable=False) as txn:
        txn.update(_key("doomed"), phase="deleting", owner=current_owner())


def op_del(d: Path) -> None:
    """DEL's two transactions: the ``deleting`` intent, then the removal (neither synced).
    When the removal fails DEL fails with the intent left: the retried DEL finishes it."""
    _del_intent(d)
    with StateStore(d).transaction(durable=False) as txn:
        txn.remove(*_key("doomed"))


def op_gc(d: Path) -> None:
    """GC through the CNI entry point: only ``other-1`` and ``other-2`` are still valid."""
    conf = {
        "cniVersion": "1.1.0",
        "name": NET,
        "type": "cni-dra",
        "stateDir": str(d),
        "ipam": {"type": "fake-ipam"},
        "cni.dev/valid-attachments": [
            {"containerID": "other-1", "ifname": "eth0"},
            {"containerID": "other-2", "ifname": "eth0"},
        ],
    }
    out = io.StringIO()
    code = run({"CNI_COMMAND": "GC", "CNI_PATH": str(d.parent / "bin")}, json.dumps(conf).encode(), out)
    if code:
        reply = json.loads(out.getvalue())
        assert reply["code"] == 5, reply  # an I/O failure, nothing else
        raise StateWriteError(reply["msg"])


def op_prepare(d: Path) -> None:
    prepare_claim(str(d), "pod-y", _claim("u-y", "4G"))


def op_unprepare(d: Path) -> None:
    unprepare_claims(str(d), "pod-x")


def _big(cid: str) -> Attachment:
    """An attachment whose record is bigger than the seeded snapshot."""
    return Attachment.model_validate(
        _att(cid).model_dump() | {"result": {"cniVersion": "1.1.0", "dns": {"search": ["x" * 60] * 100}}}
    )


def op_compact(d: Path) -> None:
    """A commit whose record makes the journal outgrow the snapshot: appended, then folded
    into a new snapshot (and its backup copy)."""
    with StateStore(d, journal_limit_bytes=1).transaction() as txn:
        txn.put(_big("new"))


OPERATIONS: dict[str, Callable[[Path], None]] = {
    "add": op_add,
    "del": op_del,
    "gc": op_gc,
    "prepare": op_prepare,
    "unprepare": op_unprepare,
    "compact": op_compact,
}
INTENTS: dict[str, Callable[[Path], None]] = {"del": _del_intent}
"""What a failed operation may leave besides the starting state: an intent that the retried
verb (or recovery, once its owner is gone) finishes."""


def _dump(store: StateStore) -> dict:
    return store.read_files().model_dump(mode="json")


def _fresh(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    root.mkdir()
    _fake_ipam(root / "bin")
    d = root / "state"
    _seed(d)
    StateStore(d).read()  # this process's cache now holds the seeded state, as a worker's would
    return d


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_a_fault_at_any_state_io_call_commits_all_or_nothing(tmp_path: Path, name: str) -> None:
    op = OPERATIONS[name]
    d = _fresh(tmp_path, "clean")
    before = _dump(StateStore(d))
    with fsio.counting() as plan:
        op(d)
    after = _dump(StateStore(d))
    calls = list(plan.log)
    assert after != before and len(calls) >= 3, calls  # the operation changed something, through the seam

    allowed = [before]
    if name in INTENTS:
        d = _fresh(tmp_path, "intent")
        INTENTS[name](d)
        allowed.append(_dump(StateStore(d)))
    failures = 0
    for n, call in enumerate(calls, 1):
        for kind in ("ENOSPC", "EIO", "short") if call == "write" else ("ENOSPC", "EIO"):
            d = _fresh(tmp_path, f"{n}-{kind}")
            store = StateStore(d)
            try:
                with fsio.inject(f"any@{n}={kind}"):
                    op(d)
            except StateWriteError as exc:
                failures += 1
                assert "failed to write state" in exc.msg or "I/O" in exc.msg or "space" in exc.msg, exc.msg
                left = _dump(store)
                assert left in allowed, f"{call} #{n} {kind}: a failed {name} left changes"
                assert store.read().model_dump(mode="json") == left, (
                    f"{call} #{n} {kind}: cache differs from disk"
                )
                op(d)  # the fault is gone: the same change now goes through
            else:
                assert _dump(store) == after, f"{call} #{n} {kind}: {name} returned but is not on disk"
            assert store.read().model_dump(mode="json") == after, (
                f"{call} #{n} {kind}: cache differs from disk"
            )
            assert _dump(store) == after
            assert _recover_finds_nothing(d), f"{call} #{n} {kind}: state recover had work left"
            # and the node goes on: one more change commits and reads back
            with store.transaction() as txn:
                txn.set_claims("pod-z", [_claim("u-z", "1G")])
            assert _dump(store)["claims"]["pod-z"][0]["metadata"]["uid"] == "u-z"
    assert failures, f"no injected fault made {name} fail"


def _recover_finds_nothing(d: Path) -> bool:
    """What ``cni-dra state recover`` would do: nothing."""
    from cni_dra.attach.recover import recover
    from cni_dra.host.kernel import KernelHost

    report = recover(StateStore(d), environ={}, host=KernelHost(), cni_path=str(d.parent / "bin"))
    return not report.changes and not report.errors


def test_a_short_journal_write_is_completed_not_taken_for_a_commit(tmp_path: Path, monkeypatch) -> None:
    """A write that returns a short count (what a nearly full filesystem does instead of
    ENOSPC) must be continued; the record is whole or the commit fails."""
    d = tmp_path / "state"
    _seed(d)
    real = os.pwrite

    def short_pwrite(fd: int, data, offset: int) -> int:
        return real(fd, bytes(data)[: max(1, len(data) // 3)], offset)

    monkeypatch.setattr(os, "pwrite", short_pwrite)
    with StateStore(d).transaction() as txn:
        txn.put(_att("new"))
    monkeypatch.undo()
    assert StateStore(d).read_files().find(*_key("new")) is not None


def _commit_under_fsize_limit(d: str, slack: int, conn) -> None:
    """In a child: cap file sizes (RLIMIT_FSIZE) a few bytes past the journal's end, so the
    kernel writes part of the next record and then refuses (EFBIG), then try to commit."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    end = os.path.getsize(os.path.join(d, JOURNAL_FILE))
    resource.setrlimit(resource.RLIMIT_FSIZE, (end + slack, resource.RLIM_INFINITY))
    try:
        with StateStore(d).transaction() as txn:
            txn.put(_att("new"))
        conn.send("committed")
    except StateWriteError as exc:
        conn.send(f"failed: {exc.msg}")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(f"raised {exc!r}")


def test_a_real_short_write_fails_the_commit_and_leaves_no_torn_record(tmp_path: Path) -> None:
    import multiprocessing

    d = tmp_path / "state"
    _seed(d)
    with StateStore(d).transaction() as txn:  # a journal to append to
        txn.set_claims("pod-z", [_claim("u-z", "1G")])
    before = _dump(StateStore(d))
    size = os.path.getsize(d / JOURNAL_FILE)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_commit_under_fsize_limit, args=(str(d), 40, child))
    proc.start()
    proc.join(30)
    answer = parent.recv() if parent.poll(5) else f"no answer (exit {proc.exitcode})"
    assert answer.startswith("failed: failed to write state"), answer
    assert "File too large" in answer
    assert os.path.getsize(d / JOURNAL_FILE) == size  # the partial record was cut off again
    assert _dump(StateStore(d)) == before
    with StateStore(d).transaction() as txn:  # and the next writer appends after the last good record
        txn.put(_att("new"))
    assert StateStore(d).read_files().find(*_key("new")) is not None


def test_compaction_that_fails_after_the_record_is_committed_does_not_fail_the_commit(tmp_path: Path) -> None:
    d = tmp_path / "state"
    _seed(d)
    with fsio.counting() as plan:
        op_compact(d)
    synced = plan.log.index("fdatasync")  # the record is committed here (and the new journal's entry synced)
    snapshot = plan.log.index("open", synced)  # then the snapshot is written
    for n in range(snapshot + 1, len(plan.log) + 1):
        d = tmp_path / f"state-{n}"
        _seed(d)
        with fsio.inject(f"any@{n}=ENOSPC"):
            op_compact(d)  # does not raise
        assert StateStore(d).read_files().find(*_key("new")) is not None


def test_the_seam_is_off_without_the_test_switch(tmp_path: Path, monkeypatch) -> None:
    from cni_dra import faults

    monkeypatch.setattr(faults, "SWITCH_FILE", str(tmp_path / "no-switch"))
    monkeypatch.setenv(fsio.FAULT_ENV, "any@1=EIO")
    monkeypatch.setattr(fsio, "_ENV_READ", False)
    monkeypatch.setattr(fsio, "_PLAN", None)
    d = tmp_path / "state"
    _seed(d)  # would fail at its first write if the plan were armed
    assert StateStore(d).read_files().find(*_key("doomed")) is not None


def test_a_malformed_plan_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'write@0=EIO' is not op@n=kind"):
        fsio.parse_plan("write@0=EIO")
    assert fsio.parse_plan("write@3=short, any@5=EIO").faults == [("write", 3, "short"), ("any", 5, "EIO")]
