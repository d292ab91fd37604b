"""Whether an intent's owner still runs: real processes that are dead, zombies, or alive
with their main thread gone, and recorded ``/proc`` entries for a process caught exiting.

A killed plugin or agent stays in ``/proc`` (same pid, same start time) while the kernel
tears it down and then as a zombie until its parent reaps it; none of that is a process
that can still finish its ADD or DEL. Unprivileged.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cni_dra.state.owner import boot_id, current_owner, owner_alive
from cni_dra.state.schema import Owner

PF_EXITING = 0x4  # include/linux/sched.h: the task is in do_exit()


def _stat_field(pid: int, n: int, proc: str = "/proc") -> str:
    """Field ``n`` (1-based, proc(5)) of ``/proc/PID/stat``, read here independently."""
    raw = Path(f"{proc}/{pid}/stat").read_text()
    fields = [raw.split(" ", 1)[0], raw[raw.index("(") + 1 : raw.rindex(")")]] + raw[
        raw.rindex(")") + 2 :
    ].split()
    return fields[n - 1]


def _owner_of(pid: int) -> Owner:
    return Owner(pid=pid, start=int(_stat_field(pid, 22)), boot=boot_id())


def _wait_for_state(pid: int, state: str) -> None:
    deadline = time.monotonic() + 10
    while _stat_field(pid, 3) != state:
        assert time.monotonic() < deadline, f"process {pid} never reached state {state}"
        time.sleep(0.01)


def test_a_running_process_is_alive():
    me = current_owner()
    assert owner_alive(me)
    assert me.start == int(_stat_field(me.pid, 22))


def test_a_killed_process_not_yet_reaped_is_dead():
    """SIGKILLed, its parent (this test) not having waited: /proc still shows it, state Z,
    same start time. Its intents are stale: counting it alive made a fallback ADD answer
    code 11 until the parent got round to reaping it."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = _owner_of(child.pid)
        assert owner_alive(owner)
        child.send_signal(signal.SIGKILL)
        _wait_for_state(child.pid, "Z")
        assert Path(f"/proc/{child.pid}/stat").exists() and _owner_of(child.pid) == owner
        assert not owner_alive(owner)
    finally:
        child.kill()
        child.wait()
    assert not owner_alive(owner)  # reaped: gone from /proc


_MAIN_THREAD_EXITS = """
import ctypes, threading, time
threading.Thread(target=lambda: time.sleep(60)).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def test_a_process_whose_main_thread_exited_while_another_runs_is_alive():
    """/proc/PID/stat shows the main thread (a zombie, exiting flag set) while another
    thread of the process still runs: the process is alive."""
    child = subprocess.Popen([sys.executable, "-c", _MAIN_THREAD_EXITS], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        _wait_for_state(child.pid, "Z")
        assert int(_stat_field(child.pid, 9)) & PF_EXITING
        assert len(list(Path(f"/proc/{child.pid}/task").iterdir())) == 2
        assert owner_alive(_owner_of(child.pid))
    finally:
        child.kill()
        child.wait()
        if child.stdout:
            child.stdout.close()


def _fake_proc(root: Path, pid: int, threads: dict[int, tuple[str, int]], start: int = 4242) -> Path:
    """A recorded /proc: ``threads`` maps tid → (state, flags); the first is the main thread."""
    for tid, (state, flags) in threads.items():
        fields = (
            [state, "1", str(pid), str(pid), "0", "-1", str(flags)] + ["0"] * 12 + [str(start)] + ["0"] * 30
        )
        line = f"{tid} (cni dra) " + " ".join(fields) + "\n"
        task = root / str(pid) / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "stat").write_text(line)
        if tid == pid:
            (root / str(pid) / "stat").write_text(line)
    return root


@pytest.mark.parametrize(
    ("threads", "alive"),
    [
        ({7: ("S", 0x400040)}, True),
        ({7: ("R", 0x400040 | PF_EXITING)}, False),  # caught in do_exit: its sockets may be closed already
        (
            {7: ("D", 0x400040 | PF_EXITING), 8: ("R", 0x400040 | PF_EXITING)},
            False,
        ),  # killed: every thread exits
        ({7: ("Z", 0x400040 | PF_EXITING)}, False),
        ({7: ("X", 0x400040 | PF_EXITING)}, False),
        ({7: ("Z", 0x400040 | PF_EXITING), 8: ("S", 0x400040)}, True),  # main thread gone, another runs
        ({7: ("Z", 0x400040 | PF_EXITING), 8: ("Z", 0x400040 | PF_EXITING)}, False),
    ],
    ids=["sleeping", "exiting", "all-threads-exiting", "zombie", "dead", "main-thread-gone", "all-zombies"],
)
def test_liveness_rule_on_recorded_proc_entries(tmp_path, threads, alive):
    proc = _fake_proc(tmp_path, 7, threads)
    assert owner_alive(Owner(pid=7, start=4242, boot=boot_id()), proc=str(proc)) is alive
    assert not owner_alive(Owner(pid=7, start=4243, boot=boot_id()), proc=str(proc))  # another process


def test_this_process_is_alive_without_reading_proc_and_the_boot_id_is_read_once(monkeypatch):
    """An agent checks the owners of the intents in flight at every ADD and DEL; most of
    them are its own process, which runs the check: no ``/proc`` read for it, and the boot
    id (no process outlives its boot) is read once."""
    from cni_dra.state import owner as owner_module

    me = current_owner()
    reads: list[str] = []
    real_stat = owner_module._stat
    monkeypatch.setattr(owner_module, "_stat", lambda path: reads.append(path) or real_stat(path))
    real_open = open
    opened: list[str] = []

    def counting_open(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    assert current_owner() == me
    assert owner_alive(me)
    assert reads == []
    assert owner_module.BOOT_ID_PATH not in opened and boot_id() == me.boot
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        child = Owner(pid=other.pid, start=int(_stat_field(other.pid, 22)), boot=me.boot)
        assert owner_alive(child) and reads == [f"/proc/{other.pid}/stat"]  # another process: read
    finally:
        other.kill()
        other.wait()
    assert not owner_alive(me.model_copy(update={"boot": "another-boot"}))


def test_a_forked_child_names_itself_not_its_parent():
    import multiprocessing

    parent = current_owner()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.SimpleQueue()
    child = ctx.Process(target=lambda: queue.put(current_owner().model_dump()))
    child.start()
    named = Owner.model_validate(queue.get())
    child.join(10)
    assert named.pid == child.pid != parent.pid
    assert named.start != 0 and named.boot == parent.boot
