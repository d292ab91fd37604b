"""The state lock: an in-process lock per state directory, then ``flock(2)`` on ``state.lock``.

Threads of one process (the agent) first queue on an in-process lock per lock file,
blocking instead of polling the file lock, then take the file lock as processes do. The
file is opened with ``O_NOFOLLOW`` (a symlink planted there is refused, never followed).
In the main thread the wait blocks in the kernel (waiters are woken on release, so none
starves while 200 plugins queue) and a ``SIGALRM`` timer bounds it; other threads poll.
The kernel drops the lock when its holder dies. A wait past the timeout raises
:class:`~cni_dra.errors.TryAgainLaterError` (code 11). A thread that asks again for a lock
it holds (a transaction, read or repair of the state inside another) would wait for
itself: it gets :class:`NestedLockError` at once instead.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from cni_dra.errors import StateError, TryAgainLaterError

__all__ = ["thread_lock", "file_locked", "NestedLockError"]

_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()
_HOLDERS: dict[str, int] = {}  # lock file -> ident of the thread holding its in-process lock


class NestedLockError(RuntimeError):
    """The thread asked for a state lock it already holds: a bug in the caller, never
    something to retry (the nested wait could only time out)."""


class _LockWaitExpired(Exception):
    pass


def _on_alarm(signum: int, frame: object) -> None:
    raise _LockWaitExpired


def _flock(fd: int, timeout_s: float) -> bool:
    """``flock(fd, LOCK_EX)`` waiting at most ``timeout_s``; False when it timed out."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    except OSError as exc:
        raise StateError(f"failed to lock state: {exc.strerror}") from exc
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            return True
        except _LockWaitExpired:
            return False
        finally:
            signal.signal(signal.SIGALRM, previous)
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


@contextlib.contextmanager
def thread_lock(lock_path: Path, timeout_s: float) -> Iterator[None]:
    """The in-process lock of the state directory whose lock file is ``lock_path``.
    Raises TryAgainLaterError (11) past ``timeout_s``, NestedLockError at once when this
    thread holds it already."""
    key, me = str(lock_path), threading.get_ident()
    if _HOLDERS.get(key) == me:
        raise NestedLockError(
            f"failed to lock state {lock_path}: this thread holds it already; a state transaction, "
            "read or repair inside another one would wait for itself (finish the outer one first)"
        )
    with _THREAD_LOCKS_GUARD:
        tlock = _THREAD_LOCKS.setdefault(key, threading.Lock())
    if not tlock.acquire(timeout=timeout_s):
        raise TryAgainLaterError(
            f"failed to lock state {lock_path}: still held by another thread after {timeout_s:g}s"
        )
    _HOLDERS[key] = me
    try:
        yield
    finally:
        del _HOLDERS[key]
        tlock.release()


@contextlib.contextmanager
def file_locked(lock_path: Path, timeout_s: float) -> Iterator[None]:
    """``flock(2)`` on ``lock_path`` (module docstring). Raises TryAgainLaterError (11),
    StateError (5)."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateError(f"failed to lock state {lock_path}: it is a symlink (refused)") from exc
        raise StateError(f"failed to lock state {lock_path}: {exc.strerror}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateError(f"failed to lock state {lock_path}: not a regular file")
        if not _flock(fd, timeout_s):
            raise TryAgainLaterError(
                f"failed to lock state {lock_path}: still held by another process after {timeout_s:g}s"
            )
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
