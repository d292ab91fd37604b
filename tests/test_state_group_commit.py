"""Group commit: transactions of one process that follow each other while the lock is busy
have their records made durable by one sync; a failure of that sync fails every one of
them and leaves none of their records; and a thread's wait for the file lock held by
another process blocks (bounded) instead of polling.

Each test lines up its transactions deterministically: the test thread holds a transaction
open until the other threads are queued on the lock (:func:`_queued`), so they form one
chain when it leaves.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cni_dra.errors import StateWriteError, TryAgainLaterError
from cni_dra.state import Attachment, StateStore, fsio, lock
from tests import builders

N = 6


@pytest.fixture(autouse=True)
def _unbounded_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded test machine must not end a chain early on its time bound."""
    monkeypatch.setattr(lock, "CHAIN_MAX_S", 60.0)


def _att(cid: str) -> Attachment:
    return builders.attachment(
        cid,
        "a",
        network="n",
        driver="d",
        pool="p",
        parent="eth-a",
        phase="adding",
        consumedCapacity={"bandwidth": "1M"},
    )


def _queued(store: StateStore, n: int) -> None:
    """Wait until ``n`` threads wait for ``store``'s lock."""
    group = lock._group(str(store.lock_path))
    deadline = time.monotonic() + 10
    while group.lockers < n:
        assert time.monotonic() < deadline, f"{group.lockers} of {n} threads queued"
        time.sleep(0.005)


def _in_threads(
    n: int, work: Callable[[int], None]
) -> tuple[list[threading.Thread], dict[int, BaseException | None]]:
    outcome: dict[int, BaseException | None] = {}

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome[i] = exc
        else:
            outcome[i] = None

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, outcome


def _seeded(tmp_path: Path) -> StateStore:
    """A state with its journal started (the record that creates a journal is synced alone)."""
    store = StateStore(tmp_path, lock_timeout_s=30)
    for cid in ("seed", "seed2"):
        with store.transaction() as txn:
            txn.put(_att(cid))
    return store


def _put(store: StateStore, cid: str, durable: bool = True) -> None:
    with store.transaction(durable=durable) as txn:
        txn.put(_att(cid))


def _ids(state) -> set[str]:
    return {a.containerID for a in state.attachments}


def test_records_of_transactions_queued_together_are_synced_once_and_all_durable(tmp_path: Path) -> None:
    store = _seeded(tmp_path)
    with fsio.counting() as plan:
        with store.transaction() as txn:
            txn.put(_att("first"))
            threads, outcome = _in_threads(N, lambda i: _put(store, f"c{i}"))
            _queued(store, N)
        for t in threads:
            t.join(10)
    assert outcome == dict.fromkeys(range(N))
    assert plan.log.count("fdatasync") == 1, plan.log  # one sync for N + 1 records
    everyone = {"seed", "seed2", "first", *(f"c{i}" for i in range(N))}
    assert _ids(store.read_files()) == everyone  # a fresh reader: all of them on disk
    assert _ids(store.read()) == everyone


def test_a_failed_shared_sync_fails_every_member_and_leaves_none_of_their_records(tmp_path: Path) -> None:
    store = _seeded(tmp_path)
    before = store.read_files().model_dump(mode="json")
    first: list[BaseException] = []
    with fsio.inject("fdatasync@1=EIO"):
        try:
            with store.transaction() as txn:
                txn.put(_att("first"))
                # one member is not durable: it built on the durable ones, so it fails with them
                threads, outcome = _in_threads(N, lambda i: _put(store, f"c{i}", durable=i != 0))
                _queued(store, N)
        except StateWriteError as exc:
            first.append(exc)
        for t in threads:
            t.join(10)
    assert len(first) == 1 and "Input/output error" in first[0].msg
    assert sorted(outcome) == list(range(N))
    for i, exc in outcome.items():
        assert isinstance(exc, StateWriteError), (i, exc)
        assert exc.code == 5 and "Input/output error" in exc.msg
    assert store.read_files().model_dump(mode="json") == before  # cut off, every one of them
    assert store.read().model_dump(mode="json") == before  # and this process's view with them
    _put(store, "after")  # the node goes on
    assert _ids(store.read_files()) == {"seed", "seed2", "after"}


def test_a_failed_sync_before_a_snapshot_fails_the_chain_and_the_snapshot_writer(tmp_path: Path) -> None:
    store = _seeded(tmp_path)
    before = store.read_files().model_dump(mode="json")
    # the last member's record outgrows the journal limit: it syncs the chain before folding
    small = StateStore(tmp_path, lock_timeout_s=30, journal_limit_bytes=1)
    with fsio.inject("fdatasync@1=EIO"):
        with pytest.raises(StateWriteError):
            with store.transaction() as txn:
                txn.put(_att("first"))
                threads, outcome = _in_threads(1, lambda i: _put(small, "folder"))
                _queued(store, 1)
        for t in threads:
            t.join(10)
    assert isinstance(outcome[0], StateWriteError)
    assert store.read_files().model_dump(mode="json") == before
    assert not list(tmp_path.glob(".state.json*.tmp"))


def test_a_non_durable_record_alone_waits_for_no_sync(tmp_path: Path) -> None:
    store = _seeded(tmp_path)
    with fsio.counting() as plan:
        _put(store, "quick", durable=False)
    assert "fdatasync" not in plan.log
    assert "quick" in _ids(store.read_files())


def _hold_flock(path: str, ready, release) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    release.wait(10)
    time.sleep(0.2)


def _other_process_holds(tmp_path: Path):
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_flock, args=(str(tmp_path / "state.lock"), ready, release))
    holder.start()
    assert ready.wait(20)
    return holder, release


def test_a_thread_waits_for_another_process_in_the_kernel_and_gets_the_lock_once_released(
    tmp_path: Path,
) -> None:
    store = _seeded(tmp_path)
    holder, release = _other_process_holds(tmp_path)
    try:
        threads, outcome = _in_threads(1, lambda i: _put(store, "waited"))
        time.sleep(0.3)
        assert not outcome  # still waiting
        release.set()  # the holder exits 0.2 s later: the kernel drops its lock
        threads[0].join(10)
    finally:
        release.set()
        holder.join(10)
    assert outcome == {0: None}
    assert "waited" in _ids(store.read_files())


def test_a_thread_that_gives_up_waiting_leaves_the_lock_free_once_the_holder_releases(tmp_path: Path) -> None:
    store = _seeded(tmp_path)
    impatient = StateStore(tmp_path, lock_timeout_s=0.3)
    holder, release = _other_process_holds(tmp_path)
    try:
        threads, outcome = _in_threads(1, lambda i: _put(impatient, "late"))
        threads[0].join(10)
        assert isinstance(outcome[0], TryAgainLaterError) and outcome[0].code == 11
    finally:
        release.set()
        holder.join(10)
    # the helper that was still blocked in flock got the lock after the holder exited,
    # and let it go again: another opener takes it without waiting
    deadline = time.monotonic() + 5
    fd = os.open(tmp_path / "state.lock", os.O_RDWR)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, "the abandoned wait kept the lock"
                time.sleep(0.01)
    finally:
        os.close(fd)
    assert "late" not in _ids(store.read_files())


def _try_in_child(path: str, queue) -> None:
    store = StateStore(path, lock_timeout_s=0.3)
    try:
        _put(store, "child")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put(type(exc).__name__)
    else:
        queue.put("committed")


def test_a_forked_child_holds_none_of_its_parents_locks(tmp_path: Path) -> None:
    """Forked while the parent holds the lock (the in-process lock, the file lock), the child
    starts with none: it waits for the parent's file lock like any other process."""
    store = _seeded(tmp_path)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.SimpleQueue()
    with store.locked():
        child = ctx.Process(target=_try_in_child, args=(str(tmp_path), queue))
        child.start()
        child.join(20)
        outcome = queue.get()
    assert outcome == "TryAgainLaterError"  # not NestedLockError, not a commit under our lock
    assert "child" not in _ids(store.read_files())
