"""Who holds an intent: this process's identity, and whether another one still runs.

An :class:`~cni_dra.state.models.Owner` names a process by pid, start time (clock ticks
since boot, ``/proc/PID/stat`` field 22) and kernel boot id, so a reused pid or a reboot
never passes for the process that wrote an intent record.
"""

from __future__ import annotations

import os

from cni_dra.state.models import Owner

__all__ = ["BOOT_ID_PATH", "boot_id", "current_owner", "owner_alive"]

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """The kernel's boot id (``/proc/sys/kernel/random/boot_id``), "" when unreadable."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as f:
            return f.read().strip()
    except OSError:  # pragma: no cover - always readable on Linux
        return ""


def _start_ticks(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm (field 2) is in parentheses and may hold spaces; fields after the last ')' are plain.
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return int(rest[19])  # field 22 overall; rest starts at field 3
    except (IndexError, ValueError):  # pragma: no cover - kernel format is stable
        return None


def current_owner() -> Owner:
    """An :class:`Owner` naming this process (for intent records)."""
    pid = os.getpid()
    return Owner(pid=pid, start=_start_ticks(pid) or 0, boot=boot_id())


def owner_alive(owner: Owner | None) -> bool:
    """True when ``owner`` is a process that still runs (same boot, pid and start time)."""
    if owner is None:
        return False
    if owner.boot and owner.boot != boot_id():
        return False
    start = _start_ticks(owner.pid)
    return start is not None and start == owner.start

