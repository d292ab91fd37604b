"""An ADD or DEL whose own attachment is being recovered waits for that recovery instead of
answering code 11.

When a process dies mid-ADD (a fast-path agent killed during a burst), the next cni-dra
process on the node recovers its intent: it takes the intent over (``recovering``, itself as
owner) and undoes it outside the lock. The interrupted invocation's own retry (the client's
in-process fallback) finds the intent held by a live process: it waits for the recovery (at
most ``lockTimeoutSeconds``), then adds afresh. A live ADD of the same attachment that is not
a recovery still gets code 11 at once. The recovering owner here is this test process; the
recovery "finishes" when a thread drops the record, as :func:`cni_dra.attach.recover.recover`
does at its end.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cni_dra.attach import recover as recover_mod
from cni_dra.state import StateStore
from cni_dra.state.owner import boot_id, current_owner
from cni_dra.state.schema import STEP_IPAM, Owner
from tests.builders import attachment, device, netconf, run_verb, write_slice
from tests.fake_host import FakeHost

KEY = ("net", "c1", "eth0")


class Kernel(FakeHost):
    """The in-memory host with NIC eth9; ``done``: links made and deleted (``+eth0`` / ``-eth0``)."""

    def __init__(self) -> None:
        super().__init__()
        self.add_nic("eth9", 7)
        self.done: list[str] = []
        self.hooks["rename_and_up"] = lambda spec, temp: self.done.append("+" + spec.ifname)
        self.hooks["delete_link"] = lambda netns, name: self.done.append("-" + name)
        self.hooks["delete_shaped_link"] = lambda netns, name: self.done.append("-" + name)


@pytest.fixture
def kernel() -> Kernel:
    return Kernel()


def _conf(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    write_slice(tmp_path / "slice.yaml", [device("nic-a", "eth9")], name="s")
    return netconf(
        name="net",
        stateDir=str(tmp_path / "state"),
        inventory=str(tmp_path / "slice.yaml"),
        shaping=False,
        **kw,
    )


def _held(tmp_path: Path, *, recovering: bool, owner: Owner | None = None) -> StateStore:
    """The attachment's interrupted ADD, its intent held by this (live) process."""
    store = StateStore(tmp_path / "state")
    with store.transaction() as txn:
        txn.set_boot_id(boot_id())
        txn.put(
            attachment(
                "c1",
                network="net",
                parent="eth9",
                netns="/var/run/netns/x",
                phase="adding",
                owner=owner or current_owner(),
                recovering=True if recovering else None,
                steps=(STEP_IPAM,),
                consumedCapacity={"bandwidth": "1G"},
            )
        )
    return store


def _finish_recovery_after(store: StateStore, delay_s: float) -> threading.Thread:
    def finish() -> None:
        time.sleep(delay_s)
        with store.transaction() as txn:
            txn.remove(*KEY)

    thread = threading.Thread(target=finish, daemon=True)
    thread.start()
    return thread


def test_add_waits_for_the_recovery_of_its_own_interrupted_add(tmp_path, kernel):
    store = _held(tmp_path, recovering=True)
    finisher = _finish_recovery_after(store, 0.3)
    started = time.monotonic()
    code, out = run_verb(kernel, "ADD", _conf(tmp_path))
    finisher.join()
    assert code == 0, out
    assert time.monotonic() - started >= 0.3
    (att,) = store.read().attachments
    assert att.phase == "ready" and att.owner is None and att.recovering is None
    assert kernel.done == ["+eth0"]


def test_del_waits_for_the_recovery_of_its_attachments_interrupted_add(tmp_path, kernel):
    store = _held(tmp_path, recovering=True)
    finisher = _finish_recovery_after(store, 0.3)
    code, out = run_verb(kernel, "DEL", _conf(tmp_path))
    finisher.join()
    assert (code, out) == (0, None)
    assert store.read().attachments == []


def test_a_recovery_that_outlasts_the_lock_timeout_is_code_11_naming_it(tmp_path, kernel):
    store = _held(tmp_path, recovering=True)
    kernel.manual_clock = True  # the wait passes on the host's clock alone
    started = kernel.monotonic()
    code, out = run_verb(kernel, "ADD", _conf(tmp_path, lockTimeoutSeconds=30))
    assert code == 1 and out["code"] == 11
    assert f"its interrupted ADD is still being recovered by process {current_owner().pid}" in out["msg"]
    assert 30 <= kernel.monotonic() - started < 31
    (att,) = store.read().attachments
    assert att.phase == "adding" and kernel.done == []


def test_an_add_in_progress_that_is_no_recovery_is_code_11_at_once(tmp_path, kernel):
    _held(tmp_path, recovering=False)
    started = time.monotonic()
    code, out = run_verb(kernel, "ADD", _conf(tmp_path))
    assert code == 1 and out["code"] == 11 and "still in progress" in out["msg"]
    assert time.monotonic() - started < 2


def test_recovery_marks_what_it_takes_over_and_gives_back_what_it_could_not_undo(tmp_path, kernel):
    """While it works, the intent is marked ``recovering`` (what the waits above look for);
    when the undo fails, the intent goes back to its dead owner, so the next recovery (of any
    process) tries again instead of it staying with a process that may live on (an agent)."""
    from cni_dra.errors import NetlinkError

    dead = Owner(pid=2**22 + 7, start=1, boot=boot_id())
    store = _held(tmp_path, recovering=False, owner=dead)
    seen: list[Any] = []

    kernel.hooks["delete_shaped_link"] = lambda netns, name: seen.append(store.read().find(*KEY))
    kernel.fail["delete_shaped_link"] = NetlinkError("failed to delete link eth0: boom")
    report = recover_mod.recover(store, environ={}, host=kernel)
    assert report.errors and "boom" in report.errors[0]
    (during,) = seen
    assert during.recovering is True and during.owner == current_owner()
    after = store.read().find(*KEY)
    assert after is not None and after.owner == dead and after.recovering is None and after.phase == "adding"
