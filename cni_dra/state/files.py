"""The state directory: where its files are, its safety checks and its lock.

:class:`StateFiles` is what the lower modules of the store (:mod:`cni_dra.state.journal`,
:mod:`cni_dra.state.reading`, :mod:`cni_dra.state.txn`, :mod:`cni_dra.state.salvage`) need
of a store, with no reading or writing of the state itself; :class:`cni_dra.state.store.StateStore`
builds its API on it. So the store imports those modules, and none of them imports it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from cni_dra.errors import StateError
from cni_dra.state import lock
from cni_dra.state.codec import BACKUP_FILE, JOURNAL_FILE, LOCK_FILE, STATE_FILE

__all__ = ["StateFiles", "DEFAULT_JOURNAL_LIMIT_BYTES"]

DEFAULT_JOURNAL_LIMIT_BYTES = 256 << 10
"""Smallest journal (bytes) that is folded into a new snapshot; a bigger snapshot raises
the threshold to its own size (the amortised cost of compaction per commit stays flat)."""


class StateFiles:
    """``<state_dir>``: ``state.json``, ``state.journal``, ``state.json.bak`` and ``state.lock``.

    ``lock_timeout_s``: longest wait for the lock, seconds (code 11 past it);
    ``journal_limit_bytes``: journal size past which it is folded into a new snapshot
    (never below the snapshot's own size; 0: every commit writes a snapshot).
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        lock_timeout_s: float = 10.0,
        journal_limit_bytes: int = DEFAULT_JOURNAL_LIMIT_BYTES,
    ) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        self.backup_path = self.dir / BACKUP_FILE
        self.journal_path = self.dir / JOURNAL_FILE
        self.lock_path = self.dir / LOCK_FILE
        self.lock_timeout_s = lock_timeout_s
        self.journal_limit_bytes = journal_limit_bytes
        self._dir_ok = False  # stateDir checked (see dir_exists)

    # -- the directory -------------------------------------------------------------------
    def dir_exists(self) -> bool:
        """Whether ``stateDir`` exists, checked once per store (one ``lstat(2)``): it must be
        a real directory (not a symlink, not a file), owned by our euid and not writable by
        group or others, since whoever can write it can replace the state. False when it
        does not exist. Raises StateError (5) naming the problem."""
        if self._dir_ok:
            return True
        try:
            st = os.lstat(self.dir)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StateError(f"failed to use state directory {self.dir}: {exc.strerror}") from exc
        problem = ""
        if stat.S_ISLNK(st.st_mode):
            problem = "it is a symlink (refused; set stateDir to the directory itself)"
        elif not stat.S_ISDIR(st.st_mode):
            kind = "a regular file" if stat.S_ISREG(st.st_mode) else "not a directory"
            problem = f"it is {kind}, not a directory"
        elif st.st_uid != os.geteuid():
            problem = f"it is owned by uid {st.st_uid}, not by uid {os.geteuid()} that runs cni-dra"
        elif st.st_mode & 0o022:
            problem = (
                f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"`chmod 0700 {self.dir}` makes it private"
            )
        if problem:
            raise StateError(f"failed to use state directory {self.dir}: {problem}")
        self._dir_ok = True
        return True

    def ensure_dir(self) -> None:
        """Create ``stateDir`` (0700; missing parents with the default mode) unless it exists,
        then check it (:meth:`dir_exists`). Raises StateError (5)."""
        if self.dir_exists():
            return
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"failed to create state directory {self.dir}: {exc.strerror}") from exc
        if not self.dir_exists():  # removed again at once
            raise StateError(f"failed to create state directory {self.dir}: it vanished")

    def private_dir(self) -> Path:
        """``stateDir``, created (0700) if missing and checked as the state's own files are
        (a real directory of ours, not writable by group or others), for a small file of
        another job kept beside the state. Raises StateError (5) naming the problem."""
        self.ensure_dir()
        return self.dir

    # -- locking -------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[lock.Hold]:
        """Hold the state lock (bounded wait); yields the holder's part in group commit
        (:func:`cni_dra.state.lock.held`). Raises TryAgainLaterError (11), StateError (5),
        :class:`~cni_dra.state.lock.NestedLockError` at once when this thread holds it already.

        Threads of one process (the agent) first queue on an in-process lock per lock file,
        blocking instead of polling the file lock, then take the file lock as processes do
        (unless the process holds it already for records that wait for their sync)."""
        with lock.held(self.lock_path, self.lock_timeout_s, prepare=self.ensure_dir) as hold:
            yield hold

    @contextlib.contextmanager
    def thread_locked(self) -> Iterator[None]:
        """The in-process lock of this state directory alone (threads of the agent; the cache)."""
        with lock.thread_lock(self.lock_path, self.lock_timeout_s):
            yield
