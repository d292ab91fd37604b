"""The node-local state store: one JSON file with a checksum, its backup, and a file lock.

Files in ``stateDir`` (created 0700): ``state.json`` (0600, schema in
:mod:`cni_dra.state.models`), ``state.json.bak`` (the previous good file) and ``state.lock``.

File format: the state as compact JSON whose last key is ``"checksum": "sha256:<hex>"``, the
SHA-256 of the same bytes without that key (``{...}``): the file stays plain JSON for an
operator, and a torn, truncated or edited file is detected. A file without a checksum is
accepted only from schema 1 (written before checksums existed) and is migrated on read.

Writes are atomic: a temporary file in the same directory is written and fsync'ed; the
current (verified) file is hard-linked to ``state.json.bak``; the temporary file is renamed
over ``state.json``; the directory is fsync'ed. A crash leaves either the old or the new
file, never a mix, and never no file.

The lock is held only around a read-modify-write (:meth:`StateStore.transaction`), never
while an IPAM plugin or netlink call runs. It is an ``flock(2)`` on ``state.lock``, opened
with ``O_NOFOLLOW`` (the symlink attack filelock < 3.20.1 had is closed by construction), so
the kernel releases it when its holder dies; waiters block in the kernel (no polling), so
none starves when hundreds of plugins start at once. A wait longer than the timeout raises
:class:`~cni_dra.errors.TryAgainLaterError` (CNI code 11) with nothing written.

A file that cannot be decoded, fails its checksum, or is missing while a backup exists
raises :class:`~cni_dra.errors.StateError` (code 5): it is never read as empty. ``cni-dra
state repair`` (:mod:`cni_dra.verbs.recover`) rebuilds it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from cni_dra.errors import StateError, TryAgainLaterError
from cni_dra.faults import fault_point
from cni_dra.state.models import SCHEMA_VERSION, NodeState, Owner, migrate

__all__ = [
    "StateStore",
    "RepairView",
    "STATE_FILE",
    "BACKUP_FILE",
    "LOCK_FILE",
    "BOOT_ID_PATH",
    "encode_state",
    "decode_state",
    "boot_id",
    "current_owner",
    "owner_alive",
]

STATE_FILE = "state.json"
BACKUP_FILE = "state.json.bak"
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()
LOCK_FILE = "state.lock"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"

_CHECKSUM_TAIL = re.compile(rb',"checksum":"sha256:([0-9a-f]{64})"\}\n?\Z')


def encode_state(state: NodeState) -> bytes:
    """The file bytes for ``state``: compact JSON ending in ``"checksum": "sha256:<hex>"``."""
    body = state.model_dump_json(exclude_none=True).encode()
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + b',"checksum":"sha256:' + digest.encode() + b'"}\n'


def decode_state(data: bytes, source: str = STATE_FILE) -> NodeState:
    """Verify and decode state file bytes (migrating an older schema).

    Raises StateError (5) naming ``source`` when the bytes are empty, truncated, not JSON,
    fail the checksum, lack a checksum (schema ≥ 2), or come from a newer schema.
    """
    def corrupt(why: str, details: str = "") -> StateError:
        return StateError(
            f"failed to read state {source}: file is corrupt ({len(data)} bytes, {why}); it is not "
            "treated as empty. Run `cni-dra state repair` (see README \"Failure modes\")",
            details,
        )

    m = _CHECKSUM_TAIL.search(data)
    if m is not None:
        body = data[: m.start()] + b"}"
        if hashlib.sha256(body).hexdigest() != m.group(1).decode():
            raise corrupt("checksum mismatch")
    else:
        body = data
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise corrupt("not valid JSON", str(exc)) from exc
    if not isinstance(obj, dict):
        raise corrupt("top level is not an object")
    version = obj.get("schemaVersion", 1)
    if m is None and version != 1:
        raise corrupt("checksum missing")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise StateError(
            f"failed to read state {source}: schemaVersion {version} is newer than this cni-dra ({SCHEMA_VERSION})"
        )
    try:
        return NodeState.model_validate(migrate(obj))
    except (ValidationError, ValueError) as exc:
        raise corrupt("does not match the schema", str(exc)) from exc


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


class StateStore:
    """Read and update ``<state_dir>/state.json`` under ``<state_dir>/state.lock``.

    ``lock_timeout_s``: longest wait for the lock, seconds (code 11 past it).
    """

    def __init__(self, state_dir: str | os.PathLike[str], lock_timeout_s: float = 10.0) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        self.backup_path = self.dir / BACKUP_FILE
        self.lock_path = self.dir / LOCK_FILE
        self.lock_timeout_s = lock_timeout_s

    # -- locking -------------------------------------------------------------------------
    def _ensure_dir(self) -> None:
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"failed to create state directory {self.dir}: {exc.strerror}") from exc

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the state lock (bounded wait). Raises TryAgainLaterError (11), StateError (5).

        Threads of one process (the agent) first queue on an in-process lock per lock file,
        blocking instead of polling the file lock, then take the file lock as processes do."""
        with _THREAD_LOCKS_GUARD:
            tlock = _THREAD_LOCKS.setdefault(str(self.lock_path), threading.Lock())
        if not tlock.acquire(timeout=self.lock_timeout_s):
            raise TryAgainLaterError(
                f"failed to lock state {self.lock_path}: still held by another thread after {self.lock_timeout_s:g}s"
            )
        try:
            with self._file_locked():
                yield
        finally:
            tlock.release()

    @contextlib.contextmanager
    def _file_locked(self) -> Iterator[None]:
        """``flock(2)`` on ``state.lock``, opened with ``O_NOFOLLOW`` (a symlink planted there is
        refused, never followed). In the main thread the wait blocks in the kernel (waiters are
        woken on release, so none starves while 200 plugins queue) and a ``SIGALRM`` timer
        bounds it; other threads poll. The kernel drops the lock when its holder dies.
        """
        self._ensure_dir()
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StateError(f"failed to lock state {self.lock_path}: it is a symlink (refused)") from exc
            raise StateError(f"failed to lock state {self.lock_path}: {exc.strerror}") from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StateError(f"failed to lock state {self.lock_path}: not a regular file")
            if not _flock(fd, self.lock_timeout_s):
                raise TryAgainLaterError(
                    f"failed to lock state {self.lock_path}: still held by another process after "
                    f"{self.lock_timeout_s:g}s"
                )
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # -- reading and writing ---------------------------------------------------------------
    def _read_unlocked(self) -> NodeState:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            if self.backup_path.exists():
                raise StateError(
                    f"failed to read state {self.path}: the file is missing but {self.backup_path.name} "
                    "exists; it is not treated as empty. Run `cni-dra state repair`"
                ) from None
            return NodeState()
        except OSError as exc:
            raise StateError(f"failed to read state {self.path}: {exc.strerror}") from exc
        return decode_state(data, str(self.path))

    def _fsync_dir(self) -> None:
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _write_unlocked(self, state: NodeState, *, backup: bool = True) -> None:
        """Atomically replace the file; ``backup``: keep the current file as ``state.json.bak``
        (only when the current file was verified in this transaction)."""
        if state.bootID is None:  # a new or migrated state is written in this boot
            state.bootID = boot_id()
        data = encode_state(state)
        tmp = self.dir / f".{STATE_FILE}.{os.getpid()}.tmp"
        bak_tmp = self.dir / f".{BACKUP_FILE}.{os.getpid()}.tmp"
        try:
            # Writers hold the lock, so any other temp file is left by a writer that died.
            for leftover in self.dir.glob(f".{STATE_FILE}*.tmp"):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            fault_point("state:tmp-written")
            if backup and self.path.exists():
                os.link(self.path, bak_tmp)
                os.replace(bak_tmp, self.backup_path)
                # rename(2) does nothing when both names are links to one inode (no change since
                # the last backup): drop the extra name.
                with contextlib.suppress(FileNotFoundError):
                    bak_tmp.unlink()
            os.replace(tmp, self.path)
            fault_point("state:renamed")
            self._fsync_dir()
        except OSError as exc:
            for t in (tmp, bak_tmp):
                with contextlib.suppress(OSError):
                    t.unlink()
            raise StateError(f"failed to write state {self.path}: {exc.strerror}") from exc

    def peek(self) -> NodeState:
        """A snapshot read without the lock: safe because writes replace the file atomically,
        but stale at once; for fast "anything to do?" checks only. Raises StateError (5)."""
        return self._read_unlocked()

    def read(self) -> NodeState:
        """A snapshot of the state, read under the lock (a missing state directory reads as
        empty and is not created). Raises StateError (5), TryAgainLaterError (11)."""
        if not self.dir.is_dir():
            return NodeState()
        with self.locked():
            return self._read_unlocked()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[NodeState]:
        """Read-modify-write under the lock: yields the state; writes it back atomically when
        the block exits normally and the state changed; writes nothing when it raises.
        Raises StateError (5) for a corrupt file, TryAgainLaterError (11) on lock timeout."""
        with self.locked():
            state = self._read_unlocked()
            before = state.model_dump_json()
            yield state
            if state.model_dump_json() != before:
                self._write_unlocked(state)

    # -- repair --------------------------------------------------------------------------
    def _read_backup_unlocked(self) -> NodeState | None:
        try:
            data = self.backup_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError(f"failed to read state backup {self.backup_path}: {exc.strerror}") from exc
        return decode_state(data, str(self.backup_path))

    def read_backup(self) -> NodeState | None:
        """The backup (previous good file), verified; None when there is none.
        Raises StateError (5) when the backup is corrupt too."""
        with self.locked():
            return self._read_backup_unlocked()

    @contextlib.contextmanager
    def replace(self) -> Iterator[RepairView]:
        """Hold the lock for ``cni-dra state repair``; yields a :class:`RepairView`.

        An unreadable ``state.json`` is moved aside first as ``state.json.corrupt-<unix s>``
        (so it never overwrites the backup). Write the result with :meth:`RepairView.write`.
        """
        with self.locked():
            view = RepairView(self)
            try:
                view.current = self._read_unlocked()
            except StateError as exc:
                view.error = exc
                if self.path.exists():
                    view.aside = self.dir / f"{STATE_FILE}.corrupt-{int(time.time())}"
                    os.replace(self.path, view.aside)
            try:
                view.backup = self._read_backup_unlocked()
            except StateError as exc:
                view.backup_error = exc
            yield view


class RepairView:
    """What :meth:`StateStore.replace` found (under the lock): ``current`` state (None when
    unreadable or absent), its ``error``, where the unreadable file went (``aside``), the
    verified ``backup`` (None when absent or unreadable) and ``backup_error``."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.current: NodeState | None = None
        self.error: StateError | None = None
        self.aside: Path | None = None
        self.backup: NodeState | None = None
        self.backup_error: StateError | None = None

    def write(self, state: NodeState) -> None:
        """Write the repaired state; the current file becomes the backup only if it was good."""
        self.store._write_unlocked(state, backup=self.current is not None)
