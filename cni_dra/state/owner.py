"""Who holds an intent: this process's identity, and whether another one still runs.

An :class:`~cni_dra.state.schema.Owner` names a process by pid (the thread group id: every
thread of a plugin or of the agent, and each of the agent's worker processes, records its
own process), start time (clock ticks since boot, ``/proc/PID/stat`` field 22) and kernel
boot id, so a reused pid or a reboot never passes for the process that wrote an intent
record.

A killed process stays in ``/proc`` with its pid and start time while the kernel tears it
down (its main thread flagged ``PF_EXITING``) and then as a zombie (state ``Z``) until its
parent reaps it; its sockets are closed before that, so a client of the agent already runs
the invocation again in-process. Neither can finish an intent: :func:`owner_alive` counts
a process alive only while one of its threads is neither exiting nor a zombie.

A process knows itself without ``/proc``: :func:`current_owner` is computed once (again after
a fork), and :func:`owner_alive` of it is true at once (the agent checks the owners of the
intents in flight, mostly its own, at every ADD and DEL); the boot id is read once.
"""

from __future__ import annotations

import os

from cni_dra.state.schema import Owner

__all__ = ["BOOT_ID_PATH", "boot_id", "current_owner", "owner_alive"]

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_PF_EXITING = 0x4  # task flag (include/linux/sched.h, /proc/PID/stat field 9): in do_exit()
_GONE_STATES = frozenset("ZXx")  # zombie, dead (``x`` on kernels before 4.14)


def boot_id() -> str:
    """The kernel's boot id (``/proc/sys/kernel/random/boot_id``), "" when unreadable. Read
    once per process: no process outlives the boot it started in."""
    global _BOOT_ID
    if _BOOT_ID is None:
        try:
            with open(BOOT_ID_PATH, encoding="ascii") as f:
                _BOOT_ID = f.read().strip()
        except OSError:  # pragma: no cover - always readable on Linux
            return ""
    return _BOOT_ID


_BOOT_ID: str | None = None
_SELF: Owner | None = None  # this process, once current_owner() named it (a fork forgets it)


def _forget_self() -> None:
    global _SELF
    _SELF = None


os.register_at_fork(after_in_child=_forget_self)


def _stat(path: str) -> tuple[str, int, int] | None:
    """(state, flags, start time in clock ticks since boot) from a ``/proc`` stat file
    (fields 3, 9 and 22), None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm (field 2) is in parentheses and may hold spaces; fields after the last ')' are plain.
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return rest[0].decode("ascii"), int(rest[6]), int(rest[19])  # rest starts at field 3
    except (IndexError, ValueError, UnicodeDecodeError):  # pragma: no cover - kernel format is stable
        return None


def _going(stat: tuple[str, int, int]) -> bool:
    """The thread exits (``PF_EXITING``) or has exited (zombie or dead)."""
    state, flags, _start = stat
    return state in _GONE_STATES or bool(flags & _PF_EXITING)


def current_owner() -> Owner:
    """An :class:`Owner` naming this process (for intent records) by the pid ``/proc`` gives
    it (``/proc/self``), which is what :func:`owner_alive` reads back through ``/proc``. That
    is :func:`os.getpid` unless ``/proc`` belongs to another PID namespace: a fast-path
    process that started in a container's and joined the node's mount namespace
    (:mod:`cni_dra.fastpath.join`) sees the node's ``/proc``, the one every other reader of
    the node's state uses, where its container pid names another process or none."""
    global _SELF
    try:
        pid = int(os.readlink("/proc/self"))
    except (OSError, ValueError):  # pragma: no cover - /proc is always mounted on a node
        pid = os.getpid()
    if _SELF is not None and _SELF.pid == pid:
        return _SELF
    stat = _stat(f"/proc/{pid}/stat")
    me = Owner(pid=pid, start=stat[2] if stat else 0, boot=boot_id())
    if stat is not None:
        _SELF = me
    return me


def owner_alive(owner: Owner | None, *, proc: str = "/proc") -> bool:
    """True when ``owner`` is a process that still runs: same boot, a process with its pid
    and start time, and a thread of it that is neither exiting nor a zombie (module
    docstring). ``/proc/PID/stat`` describes the main thread; only when that one is going
    are the other threads (``/proc/PID/task``) read, as a process may outlive its main
    thread. ``proc``: where procfs is mounted."""
    if owner is None:
        return False
    if owner.boot and owner.boot != boot_id():
        return False
    if owner == _SELF and proc == "/proc":
        return True  # this process, which runs this line (an agent's intents in flight)
    main = _stat(f"{proc}/{owner.pid}/stat")
    if main is None or main[2] != owner.start:
        return False
    if not _going(main):
        return True
    try:
        tids = [t for t in os.listdir(f"{proc}/{owner.pid}/task") if t != str(owner.pid)]
    except OSError:  # reaped meanwhile
        return False
    for tid in tids:
        thread = _stat(f"{proc}/{owner.pid}/task/{tid}/stat")
        if thread is not None and not _going(thread):
            return True
    return False
