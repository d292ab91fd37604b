"""The state lock: an in-process lock per state directory, then ``flock(2)`` on ``state.lock``;
and group commit: the records of transactions that follow each other in one process made
durable by one sync.

Threads of one process (the agent) first queue on an in-process lock per lock file,
blocking instead of polling the file lock, then take the file lock as processes do. The
file is opened with ``O_NOFOLLOW`` (a symlink planted there is refused, never followed).
The wait for the file lock blocks in the kernel (waiters are woken on release, so none
starves while 200 plugins queue): in the main thread bounded by a ``SIGALRM`` timer, in
other threads by waiting for a helper thread that blocks in ``flock`` for it. The kernel
drops the lock when its holder dies. A wait past the timeout raises
:class:`~cni_dra.errors.TryAgainLaterError` (code 11). A thread that asks again for a lock
it holds (a transaction, read or repair of the state inside another) would wait for
itself: it gets :class:`NestedLockError` at once instead.

**Group commit** (:func:`held`). A holder whose change is committed only once synced
joins the open *chain* (:meth:`Hold.join`) instead of syncing at once. When it leaves while other
threads of the process wait for the lock, it hands the in-process lock to one of them but
keeps the file lock for the process, and waits: the next holder reads the state with that
change in it, adds its own, and so on; the holder that leaves with nobody waiting (or the
chain at its bound, :data:`CHAIN_MAX_MEMBERS`, :data:`CHAIN_MAX_S`, so other processes get
their turn) syncs once for all of them, then releases the file lock. Until then no other
process can see the chain's records (they read under the file lock), and no member has
returned. If the sync fails, the chain is cut off (every record of it: each may build on the
ones before) and every member fails with the sync's error, not only the one that ran it.
A holder about to replace what the chain's records are in (a snapshot) syncs it first
(:meth:`Hold.flush`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from cni_dra.errors import StateError, StateWriteError, TryAgainLaterError

__all__ = [
    "CHAIN_MAX_MEMBERS",
    "CHAIN_MAX_S",
    "Hold",
    "NestedLockError",
    "held",
    "thread_lock",
    "file_locked",
]

_log = logging.getLogger("cni_dra.state.store")

CHAIN_MAX_MEMBERS = 32
"""Most transactions one sync covers (the holder that would be one more syncs instead)."""

CHAIN_MAX_S = 0.05
"""Longest a chain keeps the file lock for this process, seconds, before its next holder syncs
it and releases the file lock (other processes, in-process plugins and the agent's other
accepting processes, wait for it meanwhile)."""

_TAKEOVER_S = 0.05  # a waiting member looks this often whether its chain was left unended


class NestedLockError(RuntimeError):
    """The thread asked for a state lock it already holds: a bug in the caller, never
    something to retry (the nested wait could only time out)."""


class _LockWaitExpired(Exception):
    pass


def _on_alarm(signum: int, frame: object) -> None:
    raise _LockWaitExpired


def _flock_in_helper(fd: int, timeout_s: float) -> bool:
    """``flock(fd, LOCK_EX)`` blocking in a helper thread, waited for at most ``timeout_s``.
    The helper locks a duplicate of ``fd`` (the same open file, so the same lock); when the
    wait expires first, the helper keeps the duplicate and closes it once its ``flock``
    returns, which releases the lock it may have got by then."""
    dup = os.dup(fd)
    guard = threading.Lock()
    got = threading.Event()
    abandoned = False
    error: list[OSError] = []

    def take() -> None:
        try:
            fcntl.flock(dup, fcntl.LOCK_EX)
        except OSError as exc:
            error.append(exc)
        with guard:
            if abandoned:
                os.close(dup)
                return
            got.set()

    threading.Thread(target=take, name="cni-dra-state-flock", daemon=True).start()
    got.wait(timeout_s)
    with guard:
        if not got.is_set():
            abandoned = True
            return False
    os.close(dup)
    if error:
        raise StateError(f"failed to lock state: {error[0].strerror}") from error[0]
    return True


def _flock(fd: int, timeout_s: float) -> bool:
    """``flock(fd, LOCK_EX)`` waiting at most ``timeout_s``; False when it timed out."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    except OSError as exc:
        raise StateError(f"failed to lock state: {exc.strerror}") from exc
    if threading.current_thread() is not threading.main_thread():
        return _flock_in_helper(fd, timeout_s)
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


def _lock_file(lock_path: Path, timeout_s: float) -> int:
    """Open ``lock_path`` and ``flock`` it (module docstring); returns the locked descriptor.
    Raises TryAgainLaterError (11), StateError (5)."""
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
    except BaseException:
        os.close(fd)
        raise
    return fd


def _unlock_file(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class _Chain:
    """Records committed by holders in turn, waiting for one sync (module docstring)."""

    __slots__ = ("sync", "cut", "members", "started", "done", "error")

    def __init__(self, sync: Callable[[], None], cut: Callable[[], None]) -> None:
        self.sync = sync  # makes every record of the chain durable; raises StateError
        self.cut = cut  # removes every record of the chain (after a failed sync)
        self.members = 0
        self.started = time.monotonic()
        self.done = False
        self.error: StateError | None = None


class _Group:
    """One process's side of one lock file: the in-process lock, the file lock's descriptor
    while this process holds it, and the open chain."""

    def __init__(self) -> None:
        self.tlock = threading.Lock()
        self.cond = threading.Condition(threading.Lock())  # guards lockers and chains' done
        self.lockers = 0  # threads in held() waiting for tlock
        self.fd: int | None = None  # the flock'ed descriptor, while this process holds it
        self.chain: _Chain | None = None


_GROUPS: dict[str, _Group] = {}
_GROUPS_GUARD = threading.Lock()
_HOLDERS: dict[str, int] = {}  # lock file -> ident of the thread holding its in-process lock


def _forget_after_fork() -> None:
    """A forked child holds none of its parent's locks (threads, chains, file locks)."""
    global _GROUPS_GUARD
    _GROUPS.clear()
    _HOLDERS.clear()
    _GROUPS_GUARD = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def _group(key: str) -> _Group:
    with _GROUPS_GUARD:
        group = _GROUPS.get(key)
        if group is None:
            group = _GROUPS[key] = _Group()
        return group


def _refuse_nested(lock_path: Path) -> str:
    key = str(lock_path)
    if _HOLDERS.get(key) == threading.get_ident():
        raise NestedLockError(
            f"failed to lock state {lock_path}: this thread holds it already; a state transaction, "
            "read or repair inside another one would wait for itself (finish the outer one first)"
        )
    return key


def _end_chain(group: _Group) -> _Chain | None:
    """Sync the open chain (the caller holds the in-process lock); on failure cut it off.
    Wakes its members; returns it (None: none was open)."""
    chain, group.chain = group.chain, None
    if chain is None:
        return None
    try:
        chain.sync()
    except BaseException as exc:
        chain.error = (
            exc if isinstance(exc, StateError) else StateWriteError(f"failed to write state: {exc!r}")
        )
        try:
            chain.cut()
        except Exception as cut:  # noqa: BLE001 - the members fail with the sync's error anyway
            _log.error("failed to cut uncommitted records off the state journal: %s", cut)
        if not isinstance(exc, StateError):
            raise
    finally:
        with group.cond:
            chain.done = True
            group.cond.notify_all()
    return chain


def _member_error(chain: _Chain) -> StateError:
    """The chain's failure, as a new exception for one member (each thread raises its own)."""
    assert chain.error is not None
    return type(chain.error)(chain.error.msg, chain.error.details)


class Hold:
    """What :func:`held` yields: the holder's part in group commit (module docstring)."""

    __slots__ = ("_group", "member")

    def __init__(self, group: _Group) -> None:
        self._group = group
        self.member: _Chain | None = None

    @property
    def pending(self) -> bool:
        """Whether records of an open chain wait for their sync."""
        return self._group.chain is not None

    def join(self, sync: Callable[[], None], cut: Callable[[], None]) -> None:
        """This holder's change is committed once the chain's sync succeeds; it starts a chain
        (``sync`` makes its records durable, ``cut`` removes them) when none is open."""
        group = self._group
        if group.chain is None:
            group.chain = _Chain(sync, cut)
        group.chain.members += 1
        self.member = group.chain

    def flush(self) -> None:
        """Sync the open chain now. Raises its error (StateError): the chain's records are cut
        off, so whatever this holder read of them is gone too."""
        chain = _end_chain(self._group)
        if chain is not None and chain.error is not None:
            raise _member_error(chain)


def _leave(group: _Group, hold: Hold) -> _Chain | None:
    """The holder leaves (it holds the in-process lock): hand the open chain on to a waiting
    thread (returns the chain when this holder is a member, to wait for), or sync it and
    release the file lock. Raises the chain's error for a member."""
    chain = group.chain
    if chain is not None:
        with group.cond:
            others = group.lockers
        if others and chain.members < CHAIN_MAX_MEMBERS and time.monotonic() - chain.started < CHAIN_MAX_S:
            return chain if hold.member is chain else None
        _end_chain(group)
    if group.fd is not None:
        fd, group.fd = group.fd, None
        _unlock_file(fd)
    if chain is not None and hold.member is chain and chain.error is not None:
        raise _member_error(chain)
    return None


def _await(group: _Group, chain: _Chain) -> None:
    """Wait until ``chain`` is synced or cut off (raise its error then). Should it be left
    open with nobody holding the lock (a thread gave up waiting for it), end it here."""
    while True:
        with group.cond:
            if not chain.done:
                group.cond.wait(_TAKEOVER_S)
            if chain.done:
                break
        if group.tlock.acquire(blocking=False):
            try:
                if group.chain is chain:
                    _end_chain(group)
                    if group.fd is not None:
                        fd, group.fd = group.fd, None
                        _unlock_file(fd)
            finally:
                group.tlock.release()
    if chain.error is not None:
        raise _member_error(chain)


@contextlib.contextmanager
def held(lock_path: Path, timeout_s: float, prepare: Callable[[], None] | None = None) -> Iterator[Hold]:
    """Hold the state lock: the in-process lock, then the file lock unless this process holds
    it for an open chain (``prepare`` runs between them, when the file lock is taken). Yields
    the :class:`Hold`; on leaving, a member of a chain waits for its sync (module docstring).
    Raises TryAgainLaterError (11) past ``timeout_s``, StateError (5), NestedLockError at once
    when this thread holds it already, and a member's chain's StateWriteError when its sync failed."""
    key = _refuse_nested(lock_path)
    group = _group(key)
    with group.cond:
        group.lockers += 1
    got = False
    try:
        got = group.tlock.acquire(timeout=timeout_s)
    finally:
        with group.cond:
            group.lockers -= 1
            if not got:
                group.cond.notify_all()  # a member handed its chain on to this thread: end it yourselves
    if not got:
        raise TryAgainLaterError(
            f"failed to lock state {lock_path}: still held by another thread after {timeout_s:g}s"
        )
    _HOLDERS[key] = threading.get_ident()
    hold = Hold(group)
    waiting: _Chain | None = None
    try:
        if group.fd is None:
            if prepare is not None:
                prepare()
            group.fd = _lock_file(lock_path, timeout_s)
        try:
            yield hold
        finally:
            waiting = _leave(group, hold)
    finally:
        del _HOLDERS[key]
        group.tlock.release()
    if waiting is not None:
        _await(group, waiting)


@contextlib.contextmanager
def thread_lock(lock_path: Path, timeout_s: float) -> Iterator[None]:
    """The in-process lock of the state directory whose lock file is ``lock_path`` alone.
    Raises TryAgainLaterError (11) past ``timeout_s``, NestedLockError at once when this
    thread holds it already."""
    key = _refuse_nested(lock_path)
    tlock = _group(key).tlock
    if not tlock.acquire(timeout=timeout_s):
        raise TryAgainLaterError(
            f"failed to lock state {lock_path}: still held by another thread after {timeout_s:g}s"
        )
    _HOLDERS[key] = threading.get_ident()
    try:
        yield
    finally:
        del _HOLDERS[key]
        tlock.release()


@contextlib.contextmanager
def file_locked(lock_path: Path, timeout_s: float) -> Iterator[None]:
    """``flock(2)`` on ``lock_path`` alone (module docstring). Raises TryAgainLaterError (11),
    StateError (5)."""
    fd = _lock_file(lock_path, timeout_s)
    try:
        yield
    finally:
        _unlock_file(fd)
