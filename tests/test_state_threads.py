"""A state handed out is never changed: threads of one process (the agent) read while others commit.

The agent serves plugin invocations in threads that share the process's cached state. A
reader gets the state under the lock and reads it after releasing the lock; commits of
other threads (and replays of other processes' records) must not change that object under
it, or iterating it fails ("dictionary changed size during iteration") or mixes two states.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from cni_dra.state import Attachment, StateStore
from cni_dra.state.ledger import node_usage


def _att(cid: str) -> Attachment:
    return Attachment(
        network="net",
        containerID=cid,
        ifname="eth0",
        driver="d",
        pool="p",
        device="nic-a",
        parent="eth9",
        consumedCapacity={"bandwidth": "1M"},
        phase="ready",
    )


def test_a_state_read_stays_whole_while_other_threads_commit(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put_all(_att(f"seed{i}") for i in range(50))
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(me: str) -> None:
        n = 0
        try:
            while not stop.is_set():
                with store.transaction() as txn:
                    txn.put(_att(f"{me}{n}"))
                    if n >= 5:
                        txn.remove("net", f"{me}{n - 5}", "eth0")
                n += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(me,)) for me in ("x", "y")]
    for t in threads:
        t.start()
    try:
        for _ in range(100):
            state = store.read()
            before = [a.containerID for a in state.attachments]
            for i, _a in enumerate(state.attachments):  # iterating while the writers commit
                if i % 10 == 0:
                    time.sleep(0)  # let them run mid-iteration
            assert [a.containerID for a in state.attachments] == before  # the object did not change
            assert node_usage(state, "d", "p").consumed["nic-a"]["bandwidth"].nanos == len(before) * 10**15
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert len(store.read_files().attachments) == 50 + 5 * 2  # each writer keeps its last five


def test_a_transaction_changes_its_own_copy_not_the_state_it_started_from(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("a"))
    held = store.read()
    with store.transaction() as txn:
        assert txn.state is held  # read, not yet changed: shared
        txn.put(_att("b"))
        assert txn.state is not held and len(txn.attachments) == 2
    assert [a.containerID for a in held.attachments] == ["a"]
    assert [a.containerID for a in store.read().attachments] == ["a", "b"]
