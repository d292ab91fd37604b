"""A DEL drops the attachment's record only while it is still that DEL's own intent, and an
ADD meanwhile is told a DEL is in progress.

The record a DEL marked ``deleting`` can change hands while the DEL releases the link and
the address: a second DEL of the same attachment takes the intent over, and once that one
is done, a new ADD of the same container and interface reserves the record again. The first
DEL, ending, must leave that record alone: dropping it would release the capacity of a
link and an address still held and let one more ADD in beside them. Here the concurrent
work is played, while this DEL deletes the link, by a transaction giving the record to
another live process (a ``sleep`` child).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_dra.quantity import Quantity
from cni_dra.state import StateStore
from cni_dra.state.owner import boot_id
from cni_dra.state.schema import STEP_IPAM, Owner
from tests.builders import device, netconf, run_verb, write_slice
from tests.fake_host import FakeHost

KEY = ("net", "c1", "eth0")


@pytest.fixture
def other() -> Iterator[Owner]:
    """Another live process, as an intent names its owner."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        with open(f"/proc/{child.pid}/stat", "rb") as f:
            start = int(f.read().rsplit(b")", 1)[1].split()[19])
        yield Owner(pid=child.pid, start=start, boot=boot_id())
    finally:
        child.kill()
        child.wait()


def _conf(tmp_path: Path) -> dict[str, Any]:
    write_slice(tmp_path / "slice.yaml", [device("nic-a", "eth9")], name="s")
    return netconf(
        name="net", stateDir=str(tmp_path / "state"), inventory=str(tmp_path / "slice.yaml"), shaping=False
    )


def _del_while(tmp_path: Path, change: dict[str, Any]) -> Any:
    """ADD, then a DEL during whose link deletion the record takes ``change``; the record after."""
    host = FakeHost()
    host.add_nic("eth9", 7)
    conf = _conf(tmp_path)
    code, out = run_verb(host, "ADD", conf)
    assert code == 0, out
    store = StateStore(tmp_path / "state")

    def meanwhile(netns: str, name: str) -> None:
        with store.transaction() as txn:
            txn.update(txn.find(*KEY), **change)

    host.hooks["delete_link"] = meanwhile
    assert run_verb(host, "DEL", conf) == (0, None)
    assert host.called("delete_link")
    return store.read().attachments


def test_a_del_leaves_the_intent_a_concurrent_del_took_over(tmp_path, other):
    atts = _del_while(tmp_path, {"phase": "deleting", "owner": other})
    assert [(a.phase, a.owner) for a in atts] == [("deleting", other)]


def test_a_del_leaves_the_record_of_a_new_add_of_the_same_attachment(tmp_path, other):
    atts = _del_while(
        tmp_path, {"phase": "adding", "owner": other, "result": None, "readyAt": None, "steps": (STEP_IPAM,)}
    )
    assert [(a.phase, a.owner, a.consumedCapacity) for a in atts] == [
        ("adding", other, {"bandwidth": Quantity.parse("10G")})
    ]


def test_a_del_drops_its_own_intent(tmp_path):
    assert _del_while(tmp_path, {}) == []


def test_an_add_during_a_del_of_the_same_attachment_is_code_11_naming_the_del(tmp_path, other):
    host = FakeHost()
    host.add_nic("eth9", 7)
    conf = _conf(tmp_path)
    assert run_verb(host, "ADD", conf)[0] == 0
    store = StateStore(tmp_path / "state")
    with store.transaction() as txn:
        txn.update(txn.find(*KEY), phase="deleting", owner=other)
    code, out = run_verb(host, "ADD", conf)
    assert (code, out["code"]) == (1, 11)
    assert (
        out["msg"] == "failed to add eth0 for container c1: a DEL of the same attachment is still in progress"
    )


def _two_dels_at_once(tmp_path: Path, conf: dict[str, Any], hold_s: float) -> tuple[list[Any], list[int]]:
    """ADD, then two DELs of it in two threads of this process (as the agent serves them), the
    second started while the first deletes the link, which it goes on doing for ``hold_s``:
    (both DELs' answers, first's then second's; how many DELs were deleting the link at each
    deletion)."""
    import threading

    host = FakeHost()
    host.add_nic("eth9", 7)
    assert run_verb(host, "ADD", conf)[0] == 0
    inside, deleting, at_once = threading.Event(), [], []

    def hook(netns: str, name: str) -> None:
        deleting.append(name)
        at_once.append(len(deleting))
        if len(at_once) == 1:
            inside.set()
            time.sleep(hold_s)
        deleting.pop()

    host.hooks["delete_link"] = hook
    answers: dict[str, Any] = {}
    first = threading.Thread(target=lambda: answers.setdefault("first", run_verb(host, "DEL", conf)))
    second = threading.Thread(target=lambda: answers.setdefault("second", run_verb(host, "DEL", conf)))
    first.start()
    assert inside.wait(10)
    second.start()
    first.join(20)
    second.join(20)
    return [answers["first"], answers["second"]], at_once


def test_two_dels_of_one_attachment_in_one_process_take_turns(tmp_path):
    """Intents name a process: the second DEL would take over the first's intent as another
    process's, both would release at once, and the first, ending, would drop the record while
    the second still deleted. The second waits for the first instead, then finds nothing left."""
    conf = _conf(tmp_path)
    answers, at_once = _two_dels_at_once(tmp_path, conf, hold_s=0.5)
    assert answers == [(0, None), (0, None)]
    assert max(at_once) == 1
    assert StateStore(tmp_path / "state").read().attachments == []


def test_a_del_waiting_for_another_of_the_same_attachment_past_the_lock_timeout_is_code_11(tmp_path):
    conf = {**_conf(tmp_path), "lockTimeoutSeconds": 0.2}
    answers, at_once = _two_dels_at_once(tmp_path, conf, hold_s=1.0)
    assert answers[0] == (0, None)
    code, out = answers[1]
    assert (code, out["code"]) == (1, 11)
    assert (
        out["msg"]
        == "failed to delete eth0 for container c1: a DEL of the same attachment is still in progress"
    )
    assert at_once == [1]
