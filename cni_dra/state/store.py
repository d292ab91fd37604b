"""The node-local state store: one JSON file guarded by a file lock.

Files in ``stateDir`` (created 0700): ``state.json`` (0600, schema in
:mod:`cni_dra.state.models`) and ``state.lock``. Writes are atomic: a temporary file
in the same directory is written, fsync'ed and renamed over ``state.json``, then the
directory is fsync'ed, so a crash leaves either the old or the new file, never a mix.

The lock is held only around a read-modify-write (:meth:`StateStore.transaction`),
never while an IPAM plugin or netlink call runs. A lock wait longer than the timeout
raises :class:`~cni_dra.errors.TryAgainLaterError` (CNI code 11) with nothing written.
A file that cannot be decoded raises :class:`~cni_dra.errors.StateError` (code 5): it is
never read as empty.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from cni_dra.errors import StateError, TryAgainLaterError
from cni_dra.state.models import SCHEMA_VERSION, NodeState

__all__ = ["StateStore", "STATE_FILE", "LOCK_FILE"]

STATE_FILE = "state.json"
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()
LOCK_FILE = "state.lock"


class StateStore:
    """Read and update ``<state_dir>/state.json`` under ``<state_dir>/state.lock``.

    ``lock_timeout_s``: longest wait for the lock, seconds (code 11 past it).
    """

    def __init__(self, state_dir: str | os.PathLike[str], lock_timeout_s: float = 10.0) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
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
        from filelock import FileLock, Timeout

        self._ensure_dir()
        lock = FileLock(str(self.lock_path), timeout=self.lock_timeout_s, mode=0o600)
        try:
            lock.acquire()
        except Timeout as exc:
            raise TryAgainLaterError(
                f"failed to lock state {self.lock_path}: still held by another process after "
                f"{self.lock_timeout_s:g}s"
            ) from exc
        except OSError as exc:
            raise StateError(f"failed to lock state {self.lock_path}: {exc}") from exc
        try:
            yield
        finally:
            lock.release()

    # -- reading and writing ---------------------------------------------------------------
    def _read_unlocked(self) -> NodeState:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return NodeState()
        except OSError as exc:
            raise StateError(f"failed to read state {self.path}: {exc.strerror}") from exc
        try:
            state = NodeState.model_validate_json(data)
        except ValidationError as exc:
            raise StateError(
                f"failed to read state {self.path}: file is corrupt ({len(data)} bytes); "
                "it is not treated as empty",
                str(exc),
            ) from exc
        if state.schemaVersion > SCHEMA_VERSION:
            raise StateError(
                f"failed to read state {self.path}: schemaVersion {state.schemaVersion} is newer "
                f"than this cni-dra ({SCHEMA_VERSION})"
            )
        return state

    def _write_unlocked(self, state: NodeState) -> None:
        data = state.model_dump_json(exclude_none=True).encode()
        tmp = self.dir / f".{STATE_FILE}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise StateError(f"failed to write state {self.path}: {exc.strerror}") from exc

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
        the block exits normally and the state changed; writes nothing when it raises."""
        with self.locked():
            state = self._read_unlocked()
            before = state.model_dump_json()
            yield state
            if state.model_dump_json() != before:
                self._write_unlocked(state)
