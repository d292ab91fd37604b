"""The node-local state store: a checksummed snapshot, a journal, a backup and a file lock.

Files in ``stateDir`` (created 0700, files 0600; an existing directory that is a symlink, is
not owned by the process's euid or is writable by group or others is refused with code 5):

* ``state.json``: the snapshot (schema in :mod:`cni_dra.state.models`) as compact JSON whose
  last keys are ``"journal": {"id": "<hex>", "seq": N}`` (the journal that continues it) and
  ``"checksum": "sha256:<hex>"``, the SHA-256 of the same bytes without the checksum key: the
  file stays plain JSON for an operator, and a torn, truncated or edited file is detected;
* ``state.journal``: the changes made since the snapshot, one record per transaction and per
  line, ``{"j": "<journal id>", "seq": N, "ops": [...], "checksum": "sha256:<hex>"}`` with
  ``seq`` counting on from the snapshot's. Ops: ``{"put": <attachment>}`` (replace the one
  with that key, else append), ``{"del": [network, containerID, ifname]}``, ``{"claims":
  "<pod UID>", "value": [...] | null}``, ``{"statusUpdates": [...]}``, ``{"bootID": "..."}``;
* ``state.json.bak``: the previous snapshot; ``state.lock``: the lock.

Why a journal: a transaction costs what it changes, not what the node holds. Rewriting the
whole file made an ADD+DEL 46 times slower at 10,000 attachments than at 10 (README
"Performance"). A commit appends one record and ``fdatasync``s it; when the journal has
grown past ``max(journal_limit_bytes, size of the snapshot)`` it is folded into a new
snapshot (compaction), so the amortised cost per commit stays flat and a fresh reader never
replays more than about one snapshot's worth of records.

The state is the snapshot plus the records of the journal it names, in order. A reader
verifies each record; the last record may be torn (a writer died while appending: it was
never committed, and is ignored, then cut off by the next writer); a bad record followed
by more records, or a gap in ``seq``, is corruption. A journal whose records name another
id is stale (left by a crash between a compaction's snapshot and the journal's removal, or
by a snapshot written by someone else) and is ignored. A snapshot without a ``journal`` key
(schema 1 and 2, or written by :func:`encode_state`) has no journal.

Snapshot writes are atomic: a temporary file in the same directory is written and fsync'ed;
the current (verified) file is hard-linked to ``state.json.bak``; the temporary file is
renamed over ``state.json``; the directory is fsync'ed; then the old journal is removed. A
crash leaves either the old or the new state, never a mix, and never no file.

Caching: a process keeps the state it last read or wrote, keyed by the snapshot's identity
(inode, size, mtime, ctime) and the journal's (inode, end of the last record read), so the
resident agent parses the snapshot once and then only the records other processes appended.
A transaction changes the cached state in place; one that raises drops it from the cache.
A journal of the same size with another mtime or ctime was edited in place and is read
again whole; an edit of records already read, followed by appends of others, is found
by any fresh reader (the CLI, an in-process plugin, a restarted agent), not by this cache.
:meth:`StateStore.read` and :meth:`StateStore.peek` may return that shared object: treat it
as read-only. The store knows what a transaction changed from the attachments it added,
removed or assigned fields of (:data:`cni_dra.state.models.TOUCHED`), the identities of the
prepared claim lists and status records, and ``bootID``; a change it cannot express as ops
(attachments reordered) is written as a new snapshot. ``CNI_DRA_STATE_VERIFY=1`` (the test
suites set it) re-reads the files after every commit and fails if they differ from memory.

The lock is held only around a read-modify-write (:meth:`StateStore.transaction`), never
while an IPAM plugin or netlink call runs. It is an ``flock(2)`` on ``state.lock``, opened
with ``O_NOFOLLOW`` (the symlink attack filelock < 3.20.1 had is closed by construction), so
the kernel releases it when its holder dies; waiters block in the kernel (no polling), so
none starves when hundreds of plugins start at once. A wait longer than the timeout raises
:class:`~cni_dra.errors.TryAgainLaterError` (CNI code 11) with nothing written.

A snapshot or journal that cannot be decoded or fails its checksum, or a snapshot missing
while a backup or journal records exist, raises :class:`~cni_dra.errors.StateError` (code
5): it is never read as empty. ``cni-dra state repair`` (:mod:`cni_dra.verbs.recover`)
rebuilds it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import signal
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cni_dra.errors import StateError, StateWriteError, TryAgainLaterError
from cni_dra.faults import fault_point
from cni_dra.state import fsio
from cni_dra.state.models import SCHEMA_VERSION, TOUCHED, Attachment, NodeState, Owner, migrate

__all__ = [
    "StateStore",
    "RepairView",
    "STATE_FILE",
    "BACKUP_FILE",
    "JOURNAL_FILE",
    "DEFAULT_JOURNAL_LIMIT_BYTES",
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
JOURNAL_FILE = "state.journal"
DEFAULT_JOURNAL_LIMIT_BYTES = 256 << 10
"""Smallest journal (bytes) that is folded into a new snapshot; a bigger snapshot raises
the threshold to its own size (the amortised cost of compaction per commit stays flat)."""
VERIFY_ENV = "CNI_DRA_STATE_VERIFY"
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()
LOCK_FILE = "state.lock"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"

_log = logging.getLogger(__name__)

_CHECKSUM_TAIL = re.compile(rb',"checksum":"sha256:([0-9a-f]{64})"\}\n?\Z')


def _seal(body: bytes) -> bytes:
    """``body`` (a JSON object) with ``"checksum": "sha256:<hex of body>"`` as its last key, plus a newline."""
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + b',"checksum":"sha256:' + digest.encode() + b'"}\n'


def _unseal(data: bytes) -> bytes | None:
    """The inverse of :func:`_seal`: the body when ``data`` ends in its checksum, None when it
    has none. Raises ValueError when the checksum does not match."""
    m = _CHECKSUM_TAIL.search(data)
    if m is None:
        return None
    body = data[: m.start()] + b"}"
    if hashlib.sha256(body).hexdigest() != m.group(1).decode():
        raise ValueError("checksum mismatch")
    return body


def encode_state(state: NodeState, journal: tuple[str, int] | None = None) -> bytes:
    """The snapshot bytes for ``state``: compact JSON ending in ``"checksum": "sha256:<hex>"``.

    ``journal``: (journal id, last seq folded in) when a journal continues this snapshot."""
    body = state.model_dump_json(exclude_none=True).encode()
    if journal is not None:
        body = body[:-1] + b',"journal":' + json.dumps({"id": journal[0], "seq": journal[1]}).encode() + b"}"
    return _seal(body)


def decode_state(data: bytes, source: str = STATE_FILE) -> NodeState:
    """Verify and decode snapshot bytes (migrating an older schema); the journal is not read.

    Raises StateError (5) naming ``source`` when the bytes are empty, truncated, not JSON,
    fail the checksum, lack a checksum (schema ≥ 2), or come from a newer schema.
    """
    return _decode_snapshot(data, source)[0]


def _decode_snapshot(data: bytes, source: str = STATE_FILE) -> tuple[NodeState, tuple[str, int] | None]:
    """:func:`decode_state` plus the snapshot's journal reference (id, seq), if any."""
    def corrupt(why: str, details: str = "") -> StateError:
        return StateError(
            f"failed to read state {source}: file is corrupt ({len(data)} bytes, {why}); it is not "
            "treated as empty. Run `cni-dra state repair` (see README \"Failure modes\")",
            details,
        )

    try:
        sealed = _unseal(data)
    except ValueError:
        raise corrupt("checksum mismatch") from None
    body = data if sealed is None else sealed
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise corrupt("not valid JSON", str(exc)) from exc
    if not isinstance(obj, dict):
        raise corrupt("top level is not an object")
    version = obj.get("schemaVersion", 1)
    if sealed is None and version != 1:
        raise corrupt("checksum missing")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise StateError(
            f"failed to read state {source}: schemaVersion {version} is newer than this cni-dra ({SCHEMA_VERSION})"
        )
    jref = obj.pop("journal", None)
    journal: tuple[str, int] | None = None
    if jref is not None:
        if not (isinstance(jref, dict) and isinstance(jref.get("id"), str) and type(jref.get("seq")) is int):
            raise corrupt("journal reference is malformed")
        journal = (jref["id"], jref["seq"])
    try:
        return NodeState.model_validate(migrate(obj)), journal
    except (ValidationError, ValueError) as exc:
        raise corrupt("does not match the schema", str(exc)) from exc


class _Reload(Exception):
    """The cached state cannot be continued from the files: read them from scratch."""


@dataclass
class _Cached:
    """What a process knows of one state directory (see module docstring, "Caching")."""

    snap_ident: tuple[int, int, int, int] | None  # state.json (ino, size, mtime_ns, ctime_ns); None: absent
    snap_size: int
    jid: str | None  # journal id the snapshot names (None: no journal)
    seq: int  # last record applied
    state: NodeState
    # the journal as last read or written (nothing read yet: the defaults)
    j_ident: tuple[int, int] | None = None  # state.journal (dev, ino)
    j_end: int = 0  # offset after the last good record of journal ``jid``
    j_stale: bool = False  # the file holds records of another id (reset before appending)
    j_size: int = 0  # its size
    j_times: tuple[int, int] = (0, 0)  # its (mtime_ns, ctime_ns): an edit in place changes them


_CACHE: dict[str, _Cached] = {}


def _ident(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _decoded(data: bytes, source: str, ident: tuple[int, int, int, int] | None = None) -> _Cached:
    """A cache entry for snapshot bytes ``data`` (its journal not read yet). Raises StateError (5)."""
    state, journal = _decode_snapshot(data, source)
    jid, seq = journal if journal is not None else (None, 0)
    return _Cached(ident, len(data), jid, seq, state)


def _apply(state: NodeState, records: list[list[Any]]) -> None:
    """Apply the ops of journal records, in order, to ``state`` (ValueError/ValidationError
    when malformed). O(records): a put of a listed key updates that attachment in place
    (its position and identity stay), a new key is appended, a del unlists by identity."""
    atts = state.attachments
    index = atts.index()
    for ops in records:
        for op in ops:
            if "put" in op:
                att = Attachment.model_validate(op["put"])
                cur = index.get(att.key)
                if cur is None:
                    atts.append(att)
                else:  # same object, new fields: no TOUCHED entry, the list's order unchanged
                    cur.__dict__.update(att.__dict__)
                    object.__setattr__(cur, "__pydantic_fields_set__", set(att.__pydantic_fields_set__))
            elif "del" in op:
                cur = index.get(tuple(op["del"]))
                if cur is not None:
                    atts.remove(cur)
            elif "claims" in op:
                if op["value"] is None:
                    state.claims.pop(op["claims"], None)
                else:
                    state.claims[op["claims"]] = op["value"]
            elif "statusUpdates" in op:
                state.statusUpdates = op["statusUpdates"]
            elif "bootID" in op:
                state.bootID = op["bootID"]
            else:
                raise ValueError(f"unknown op {sorted(op)}")


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


def _write_synced(path: Path, data: bytes, flag: int) -> None:
    """Create ``path`` (0600, never through a symlink; ``flag``: O_EXCL or O_TRUNC), write
    ``data`` whole and fsync it. Raises OSError."""
    fd = fsio.open_write(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | flag)
    try:
        fsio.write_all(fd, data)
        fsio.fsync(fd)
    finally:
        os.close(fd)


def _decode_record(line: bytes) -> dict[str, Any] | None:
    """One journal line, verified; None when torn, not JSON or failing its checksum."""
    try:
        body = _unseal(line)
        obj = json.loads(body) if body is not None else None
    except (ValueError, UnicodeDecodeError):  # checksum mismatch, not JSON
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("ops"), list):
        return None
    return obj


def _put_op(att: Attachment) -> bytes:
    """The journal op that lists ``att`` (replacing the one with its key)."""
    return b'{"put":' + att.model_dump_json(exclude_none=True).encode() + b"}"


def _ids(items: list[Any]) -> tuple[int, ...]:
    return tuple(map(id, items))


class _Before:
    """What a transaction started from, to tell what it changed (module docstring): the
    attachment list's own log (:class:`~cni_dra.state.models.AttachmentList`), the
    attachments whose fields were assigned (:data:`~cni_dra.state.models.TOUCHED`), the
    identities of the prepared-claim lists and status records, and ``bootID``. O(change)
    except for the claims (O(pods with claims))."""

    def __init__(self, state: NodeState) -> None:
        self.list = state.attachments
        index = self.list.index()
        self.touched_outside = any(index.get(a.key) is a for a in TOUCHED.values())
        TOUCHED.clear()
        self.list.begin()
        self.claims = {uid: (id(lst), _ids(lst)) for uid, lst in state.claims.items()}
        self.status = (id(state.statusUpdates), _ids(state.statusUpdates))
        self.boot = state.bootID
        self.schema = state.schemaVersion

    def ops(self, state: NodeState) -> list[bytes] | None:
        """The encoded journal ops from this start to ``state``; None when they cannot say it
        (the list replaced or reordered, or another schema): write a snapshot then."""
        atts = state.attachments
        if atts is not self.list or atts.reordered or state.schemaVersion != self.schema:
            return None
        ops: list[bytes] = []
        added: set[int] = set()
        for is_add, att in atts.events:
            if is_add:
                added.add(id(att))
                ops.append(_put_op(att))
            else:
                ops.append(b'{"del":' + json.dumps(list(att.key)).encode() + b"}")
        index = atts.index()  # added ones were serialised just now, with their later changes
        for att in list(TOUCHED.values()):
            if id(att) not in added and index.get(att.key) is att:
                ops.append(_put_op(att))
        for uid in self.claims.keys() | state.claims.keys():
            lst = state.claims.get(uid)
            now = (id(lst), _ids(lst)) if lst is not None else None
            if now != self.claims.get(uid):
                ops.append(json.dumps({"claims": uid, "value": lst}, separators=(",", ":")).encode())
        if (id(state.statusUpdates), _ids(state.statusUpdates)) != self.status:
            ops.append(json.dumps({"statusUpdates": state.statusUpdates}, separators=(",", ":")).encode())
        if state.bootID != self.boot:
            ops.append(json.dumps({"bootID": state.bootID}).encode())
        return ops


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
        self._dir_ok = False  # stateDir checked (see _dir_exists)

    # -- the directory -------------------------------------------------------------------
    def _dir_exists(self) -> bool:
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

    def _ensure_dir(self) -> None:
        """Create ``stateDir`` (0700; missing parents with the default mode) unless it exists,
        then check it (:meth:`_dir_exists`). Raises StateError (5)."""
        if self._dir_exists():
            return
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"failed to create state directory {self.dir}: {exc.strerror}") from exc
        if not self._dir_exists():  # removed again at once
            raise StateError(f"failed to create state directory {self.dir}: it vanished")

    # -- locking -------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the state lock (bounded wait). Raises TryAgainLaterError (11), StateError (5).

        Threads of one process (the agent) first queue on an in-process lock per lock file,
        blocking instead of polling the file lock, then take the file lock as processes do."""
        with self._thread_lock(), self._file_locked():
            yield

    @contextlib.contextmanager
    def _thread_lock(self) -> Iterator[None]:
        """The in-process lock of this state directory (threads of the agent; the cache)."""
        with _THREAD_LOCKS_GUARD:
            tlock = _THREAD_LOCKS.setdefault(str(self.lock_path), threading.Lock())
        if not tlock.acquire(timeout=self.lock_timeout_s):
            raise TryAgainLaterError(
                f"failed to lock state {self.lock_path}: still held by another thread after {self.lock_timeout_s:g}s"
            )
        try:
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

    # -- reading -------------------------------------------------------------------------
    def _corrupt_journal(self, why: str) -> StateError:
        return StateError(
            f"failed to read state {self.journal_path}: journal is corrupt ({why}); it is not skipped. "
            "Run `cni-dra state repair` (see README \"Failure modes\")"
        )

    def _read_unlocked(self) -> NodeState:
        """The current state (snapshot + journal), through this process's cache."""
        key = str(self.path)
        entry = _CACHE.get(key)
        try:
            entry = self._refresh(entry)
        except _Reload:
            _CACHE.pop(key, None)
            entry = self._refresh(None)
        except BaseException:
            _CACHE.pop(key, None)
            raise
        _CACHE[key] = entry
        return entry.state

    def _refresh(self, entry: _Cached | None) -> _Cached:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self.backup_path.exists():
                raise StateError(
                    f"failed to read state {self.path}: the file is missing but {self.backup_path.name} "
                    "exists; it is not treated as empty. Run `cni-dra state repair`"
                ) from None
            if entry is not None and entry.snap_ident is None:
                return entry
            return _Cached(None, 0, None, 0, NodeState())
        except OSError as exc:
            raise StateError(f"failed to read state {self.path}: {exc.strerror}") from exc
        ident = _ident(st)
        if entry is None or entry.snap_ident != ident:
            try:
                data = self.path.read_bytes()
            except OSError as exc:
                raise StateError(f"failed to read state {self.path}: {exc.strerror}") from exc
            entry = _decoded(data, str(self.path), ident)
        if entry.jid is not None:
            self._replay(entry)
        return entry

    def _replay(self, entry: _Cached, *, strict: bool = True) -> StateError | None:
        """Apply the records of ``entry.jid`` appended since ``entry.j_end`` (module docstring).

        ``strict``: raise StateError (5) for a corrupt journal; else apply the good records
        before the bad one and return the error."""
        try:
            fd = os.open(self.journal_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            if entry.j_end:
                raise _Reload from None
            entry.j_ident, entry.j_stale, entry.j_size = None, False, 0
            return None
        except OSError as exc:
            raise StateError(f"failed to read state {self.journal_path}: {exc.strerror}") from exc
        try:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
            if entry.j_end and (ident != entry.j_ident or st.st_size < entry.j_end):
                raise _Reload
            if ident == entry.j_ident and st.st_size == entry.j_size:
                if (st.st_mtime_ns, st.st_ctime_ns) == entry.j_times:
                    return None  # nothing appended since
                raise _Reload  # same size, written since: edited in place, read it all again
            start = entry.j_end
            data = os.pread(fd, st.st_size - start, start) if st.st_size > start else b""
        except OSError as exc:
            raise StateError(f"failed to read state {self.journal_path}: {exc.strerror}") from exc
        finally:
            os.close(fd)
        records: list[list[Any]] = []
        pos, seq, stale = 0, entry.seq, False
        error: StateError | None = None
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                break  # torn tail: never committed
            line = data[pos : nl + 1]
            rec = _decode_record(line)
            if rec is None or rec.get("j") != entry.jid or rec.get("seq") != seq + 1:
                if rec is not None and rec.get("j") != entry.jid and start == 0 and not records:
                    stale = True  # records of another snapshot: ignored, reset at the next append
                    break
                if rec is None and data.find(b"\n", nl + 1) < 0 and not data[nl + 1 :].strip(b"\0"):
                    break  # a bad last record is a torn append
                if rec is None:
                    bad = self._corrupt_journal(f"bad record at byte {start + pos}")
                else:
                    bad = self._corrupt_journal(
                        f"record at byte {start + pos} is seq {rec.get('seq')!r} of journal {rec.get('j')!r}, "
                        f"expected seq {seq + 1} of {entry.jid!r}"
                    )
                if strict:
                    raise bad
                error = bad
                break
            records.append(rec["ops"])
            seq += 1
            pos = nl + 1
        if records:
            try:
                _apply(entry.state, records)
            except (ValidationError, ValueError, TypeError, KeyError) as exc:
                raise self._corrupt_journal(f"record does not match the schema: {exc}") from exc
        entry.seq = seq
        entry.j_end = start + pos if not stale else 0
        entry.j_ident, entry.j_stale, entry.j_size = ident, stale, st.st_size
        entry.j_times = (st.st_mtime_ns, st.st_ctime_ns)
        return error

    def change_stamp(self) -> tuple[Any, ...] | None:
        """A value that changes whenever the state may have (a new snapshot or a journal
        record); None when there is no state file. Costs two ``stat(2)``s, no read."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        try:
            journal: tuple[int, int, int, int] | None = _ident(os.stat(self.journal_path))
        except OSError:
            journal = None
        return (_ident(st), journal)

    def read_files(self) -> NodeState:
        """The state as a new process reads it from the files (snapshot + journal), bypassing
        and not touching this process's cache; no lock (hold :meth:`locked` for a consistent
        view). For tools and tests. Raises StateError (5)."""
        return self._refresh(None).state

    def peek(self) -> NodeState:
        """The state read without the file lock: safe because snapshots replace the file
        atomically and a half-appended journal record is ignored, but stale at once; for
        fast "anything to do?" checks only. May be this process's cached object: read-only.
        Raises StateError (5, also for an unsafe state directory, see :meth:`_dir_exists`)."""
        self._dir_exists()
        with self._thread_lock():
            return self._read_unlocked()

    def read(self) -> NodeState:
        """The state, read under the lock (a missing state directory reads as empty and is
        not created). May be this process's cached object: treat it as read-only.
        Raises StateError (5, also for a state directory that is unsafe to use, see
        :meth:`_dir_exists`), TryAgainLaterError (11)."""
        if not self._dir_exists():
            return NodeState()
        with self.locked():
            return self._read_unlocked()

    # -- writing -------------------------------------------------------------------------
    def _fsync_dir(self) -> None:
        fsio.fsync_dir(self.dir)

    def _write_unlocked(self, state: NodeState) -> None:
        """Write ``state`` as a new snapshot (with a new, empty journal) atomically, and a
        second copy as ``state.json.bak``. Raises StateError (5) when it was not committed.

        Both files are written and fsync'ed under temporary names first, so a full disk or
        an I/O error fails before anything changes. The rename over ``state.json`` is the
        commit point: every reader sees the new state from then on. What follows (the
        backup's rename, the directory's fsync, removing the old journal, which names
        another id now and is ignored) cannot be undone, so its failure is logged, not
        raised: the caller must not roll back a state every reader already sees."""
        key = str(self.path)
        _CACHE.pop(key, None)  # re-established below once the files are in place
        if state.bootID is None:  # a new or migrated state is written in this boot
            state.bootID = boot_id()
        seq = 0  # a new journal id: its records count from 1
        jid = os.urandom(8).hex()
        data = encode_state(state, (jid, seq))
        tmp = self.dir / f".{STATE_FILE}.{os.getpid()}.tmp"
        bak_tmp = self.dir / f".{BACKUP_FILE}.{os.getpid()}.tmp"
        try:
            # Writers hold the lock, so any other temp file is left by a writer that died.
            for leftover in self.dir.glob(f".{STATE_FILE}*.tmp"):  # .state.json.bak.*.tmp too
                with contextlib.suppress(FileNotFoundError):
                    fsio.unlink(leftover)
            _write_synced(tmp, data, os.O_EXCL)
            _write_synced(bak_tmp, data, os.O_TRUNC)
            fault_point("state:tmp-written")
            fsio.rename(tmp, self.path)
        except OSError as exc:
            for t in (tmp, bak_tmp):
                with contextlib.suppress(OSError):
                    os.unlink(t)
            raise StateWriteError(f"failed to write state {self.path}: {exc.strerror}; nothing was changed") from exc
        fault_point("state:renamed")
        for what, step in (
            ("rename the backup copy", lambda: fsio.rename(bak_tmp, self.backup_path)),
            ("sync the state directory", self._fsync_dir),
            ("remove the folded journal", lambda: fsio.unlink(self.journal_path)),
        ):
            try:
                step()
            except FileNotFoundError:
                pass
            except OSError as exc:
                _log.warning("state %s committed, but failed to %s: %s", self.path, what, exc.strerror)
        with contextlib.suppress(OSError):
            os.unlink(bak_tmp)
        st = os.stat(self.path)
        _CACHE[key] = _Cached(_ident(st), len(data), jid, seq, state)

    def _append(self, entry: _Cached, ops: list[bytes], durable: bool = True) -> None:
        """Commit ``ops`` (encoded) as the next journal record of ``entry`` (fdatasync'ed
        when ``durable``). A record is committed only when it was written whole and synced:
        on any failure it is cut off again (a truncate frees space, so it works on a full
        disk) and StateError (5) is raised; the caller then drops its cached view, so the
        process's view never runs ahead of the disk."""
        seq = entry.seq + 1
        head = b'{"j":' + json.dumps(entry.jid).encode() + b',"seq":' + str(seq).encode() + b',"ops":['
        record = _seal(head + b",".join(ops) + b"]}")
        try:
            fd = fsio.open_write(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise StateWriteError(f"failed to write state {self.journal_path}: {exc.strerror}; nothing was changed") from exc
        end = 0
        try:
            st = os.fstat(fd)
            created = st.st_size == 0 and entry.j_ident is None
            end = 0 if entry.j_stale or (st.st_dev, st.st_ino) != entry.j_ident else entry.j_end
            if st.st_size != end:  # a torn record of a writer that died, or a stale journal
                fsio.truncate(fd, end)
            half = len(record) // 2
            fsio.write_all(fd, record[:half], end)
            fault_point("state:tmp-written")  # half a record: torn, never committed
            fsio.write_all(fd, record[half:], end + half)
            fault_point("state:renamed")  # whole record, not yet synced
            if durable or created:
                fsio.fdatasync(fd)
            if created:
                self._fsync_dir()
            after = os.fstat(fd)
        except OSError as exc:
            try:  # what was written of the record is not committed: no reader may take it
                os.ftruncate(fd, end)
            except OSError as cut:
                _log.error("failed to cut an uncommitted record off %s: %s", self.journal_path, cut.strerror)
            raise StateWriteError(f"failed to write state {self.journal_path}: {exc.strerror}; nothing was changed") from exc
        finally:
            os.close(fd)
        entry.seq = seq
        entry.j_ident = (st.st_dev, st.st_ino)
        entry.j_end = entry.j_size = end + len(record)
        entry.j_times = (after.st_mtime_ns, after.st_ctime_ns)
        entry.j_stale = False

    @contextlib.contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[NodeState]:
        """Read-modify-write under the lock: yields the state; commits it when the block exits
        normally and the state changed (one journal record, or a new snapshot); writes
        nothing when it raises. Raises StateError (5) for a corrupt file or a failed write,
        TryAgainLaterError (11) on lock timeout.

        ``durable=False``: a journal record is appended but not ``fdatasync``'ed (the next
        durable commit flushes it). It survives the death of the process (the kernel holds
        it), not a kernel crash; for records that recovery can do without after a reboot
        (intent steps: :func:`cni_dra.verbs.recover.record_step`)."""
        key = str(self.path)
        with self.locked():
            state = self._read_unlocked()
            before = _Before(state)
            if before.touched_outside:  # changed outside a transaction: the cache is not the disk
                _CACHE.pop(key, None)
                state = self._read_unlocked()
                before = _Before(state)
            ok = False
            try:
                yield state
                ok = True
            finally:
                if not ok:
                    _CACHE.pop(key, None)
                    TOUCHED.clear()
            try:
                self._commit(state, before, durable)
            except BaseException:
                _CACHE.pop(key, None)
                raise
            finally:
                TOUCHED.clear()

    def _commit(self, state: NodeState, before: _Before, durable: bool = True) -> None:
        key = str(self.path)
        entry = _CACHE.get(key)
        ops = before.ops(state)
        if ops is not None and not ops:
            return
        if (
            ops is None
            or entry is None
            or entry.state is not state
            or entry.jid is None
            or entry.snap_ident is None
            or self.journal_limit_bytes <= 0
        ):
            self._write_unlocked(state)
        else:
            self._append(entry, ops, durable)
            if entry.j_end > max(self.journal_limit_bytes, entry.snap_size):
                try:  # compaction: the record above is committed whatever happens here
                    self._write_unlocked(state)
                except StateError as exc:
                    _log.warning("state compaction postponed: %s", exc)
        if os.environ.get(VERIFY_ENV) == "1":
            self._verify(state)

    def _verify(self, state: NodeState) -> None:
        """``CNI_DRA_STATE_VERIFY=1``: the files, read from scratch, must equal ``state``."""
        if self.read_files().model_dump(mode="json") != state.model_dump(mode="json"):
            raise StateError(
                f"failed to write state {self.path}: the journal does not reproduce the state in memory "
                "(a change made without assigning a field?)"
            )

    # -- repair --------------------------------------------------------------------------
    def _with_good_records(self, data: bytes, source: str) -> NodeState:
        """Snapshot bytes (``state.json`` or its copy) plus the journal's records before a bad
        one (a bad one is reported by the main read). Raises StateError (5) for a bad snapshot."""
        entry = _decoded(data, source)
        if entry.jid is not None:
            self._replay(entry, strict=False)
        return entry.state

    def _read_snapshot_with_good_records(self) -> NodeState | None:
        """The snapshot plus the journal's records before a bad one; None if the snapshot is bad."""
        try:
            return self._with_good_records(self.path.read_bytes(), str(self.path))
        except (OSError, StateError):
            return None

    def _read_backup_unlocked(self) -> NodeState | None:
        try:
            data = self.backup_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError(f"failed to read state backup {self.backup_path}: {exc.strerror}") from exc
        return self._with_good_records(data, str(self.backup_path))

    def read_backup(self) -> NodeState | None:
        """The backup (the second copy of the snapshot, plus its journal's good records),
        verified; None when there is none. Raises StateError (5) when the backup is corrupt too."""
        with self.locked():
            return self._read_backup_unlocked()

    @contextlib.contextmanager
    def replace(self) -> Iterator[RepairView]:
        """Hold the lock for ``cni-dra state repair``; yields a :class:`RepairView`.

        An unreadable ``state.json`` is moved aside first as ``state.json.corrupt-<unix s>``
        (so it never overwrites the backup), and its journal as ``state.journal.corrupt-<unix s>``. Write the result with :meth:`RepairView.write`.
        """
        with self.locked():
            _CACHE.pop(str(self.path), None)  # repair reads the files, not what this process remembers
            view = RepairView(self)
            stamp = int(time.time())  # of the files moved aside
            try:
                view.current = self._read_unlocked()
            except StateError as exc:
                view.error = exc
                view.current = self._read_snapshot_with_good_records()
                if view.current is None and self.path.exists():
                    view.aside = self.dir / f"{STATE_FILE}.corrupt-{stamp}"
                    fsio.rename(self.path, view.aside)
            try:
                view.backup = self._read_backup_unlocked()
            except StateError as exc:
                view.backup_error = exc
            if view.error is not None and self.journal_path.exists():
                # kept for the operator (the backup took its good records first); the repaired
                # snapshot starts a new journal
                view.journal_aside = self.dir / f"{JOURNAL_FILE}.corrupt-{stamp}"
                fsio.rename(self.journal_path, view.journal_aside)
            yield view


class RepairView:
    """What :meth:`StateStore.replace` found (under the lock): ``current`` state (None when
    the snapshot is unreadable or absent; with a bad journal, the snapshot plus the records
    before the bad one), its ``error``, where the unreadable snapshot went (``aside``) and the
    journal (``journal_aside``), the verified ``backup`` (None when absent or unreadable) and
    ``backup_error``."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.current: NodeState | None = None
        self.error: StateError | None = None
        self.aside: Path | None = None
        self.journal_aside: Path | None = None
        self.backup: NodeState | None = None
        self.backup_error: StateError | None = None

    def write(self, state: NodeState) -> None:
        """Write the repaired state as a new snapshot (and its backup copy)."""
        self.store._write_unlocked(state)
