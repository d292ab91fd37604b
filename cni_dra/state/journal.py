"""The journal: replaying records onto a cached state, appending one, and compaction.

The state is the snapshot plus the records of the journal it names, in order. A reader
verifies each record; the last record may be torn (a writer died while appending: it was
never committed, and is ignored, then cut off by the next writer); a bad record followed
by more records, or a gap in ``seq``, is corruption. A journal whose records name another
id is stale (left by a crash between a compaction's snapshot and the journal's removal, or
by a snapshot written by someone else) and is ignored.

A commit appends one record and ``fdatasync``s it (unless not durable; the transaction layer
may leave the sync to :func:`sync`, once for the records of several transactions, and
:func:`cut` them off again when it fails); when the journal
has grown past ``max(journal_limit_bytes, size of the snapshot)`` it is folded into a new
snapshot (compaction, :func:`write_snapshot`), so the amortised cost per commit stays flat.

Every write, sync, rename, truncate and unlink goes through :mod:`cni_dra.state.fsio`.
A record is committed only once written whole and synced: a failed append is cut off
again and raises :class:`~cni_dra.errors.StateWriteError`. A snapshot is committed by its
rename; what follows it (the backup's rename, the directory's fsync, removing the folded
journal) is only logged when it fails.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cni_dra.errors import StateError, StateWriteError
from cni_dra.faults import fault_point
from cni_dra.state import fsio, ops
from cni_dra.state.cache import CACHE, RECENT, Cached, Reload, ident, remember
from cni_dra.state.codec import (
    BACKUP_FILE,
    STATE_FILE,
    apply_records,
    decode_record,
    encode_record,
    encode_state,
)
from cni_dra.state.files import StateFiles
from cni_dra.state.owner import boot_id
from cni_dra.state.schema import NodeState

__all__ = ["replay", "append", "sync", "cut", "write_snapshot", "write_synced"]

_log = logging.getLogger("cni_dra.state.store")


def write_synced(path: Path, data: bytes, flag: int) -> None:
    """Create ``path`` (0600, never through a symlink; ``flag``: O_EXCL or O_TRUNC), write
    ``data`` whole and fsync it. Raises OSError."""
    fd = fsio.open_write(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | flag)
    try:
        fsio.write_all(fd, data)
        fsio.fsync(fd)
    finally:
        os.close(fd)


def corrupt_journal(files: StateFiles, why: str) -> StateError:
    return StateError(
        f"failed to read state {files.journal_path}: journal is corrupt ({why}); it is not skipped. "
        'Run `cni-dra state repair` (see README "Failure modes")'
    )


def replay(files: StateFiles, entry: Cached, *, strict: bool = True) -> StateError | None:
    """Apply the records of ``entry.jid`` appended since ``entry.j_end`` (module docstring).

    ``strict``: raise StateError (5) for a corrupt journal; else apply the good records
    before the bad one and return the error."""
    try:
        fd = os.open(files.journal_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        if entry.j_end:
            raise Reload from None
        entry.j_ident, entry.j_stale, entry.j_size = None, False, 0
        return None
    except OSError as exc:
        raise StateError(f"failed to read state {files.journal_path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        found = (st.st_dev, st.st_ino)
        if entry.j_end and (found != entry.j_ident or st.st_size < entry.j_end):
            raise Reload
        if found == entry.j_ident and st.st_size == entry.j_size:
            if (st.st_mtime_ns, st.st_ctime_ns) == entry.j_times:
                return None  # nothing appended since
            raise Reload  # same size, written since: edited in place, read it all again
        start = entry.j_end
        data = os.pread(fd, st.st_size - start, start) if st.st_size > start else b""
    except OSError as exc:
        raise StateError(f"failed to read state {files.journal_path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    records: list[list[Any]] = []
    lines: list[tuple[int, bytes]] = []
    pos, seq, stale = 0, entry.seq, False
    error: StateError | None = None
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # torn tail: never committed
        line = data[pos : nl + 1]
        rec = decode_record(line)
        if rec is None or rec.get("j") != entry.jid or rec.get("seq") != seq + 1:
            if rec is not None and rec.get("j") != entry.jid and start == 0 and not records:
                stale = True  # records of another snapshot: ignored, reset at the next append
                break
            if rec is None and data.find(b"\n", nl + 1) < 0 and not data[nl + 1 :].strip(b"\0"):
                break  # a bad last record is a torn append
            if rec is None:
                bad = corrupt_journal(files, f"bad record at byte {start + pos}")
            else:
                bad = corrupt_journal(
                    files,
                    f"record at byte {start + pos} is seq {rec.get('seq')!r} of journal {rec.get('j')!r}, "
                    f"expected seq {seq + 1} of {entry.jid!r}",
                )
            if strict:
                raise bad
            error = bad
            break
        records.append(rec["ops"])
        seq += 1
        lines.append((seq, line))
        pos = nl + 1
    if records:
        try:  # onto a copy: a state another thread reads is never changed under it
            state = entry.state.changeable_copy()
            apply_records(state, records)
            entry.state = state
        except (ValidationError, ValueError, TypeError, KeyError) as exc:
            raise corrupt_journal(files, f"record does not match the schema: {exc}") from exc
    for n, line in lines[-RECENT:]:
        remember(entry, n, line)
    entry.seq = seq
    entry.j_end = start + pos if not stale else 0
    entry.j_ident, entry.j_stale, entry.j_size = found, stale, st.st_size
    entry.j_times = (st.st_mtime_ns, st.st_ctime_ns)
    return error


def write_snapshot(files: StateFiles, state: NodeState, folded: Cached | None = None) -> None:
    """Write ``state`` as a new snapshot (with a new, empty journal) atomically, and a
    second copy as ``state.json.bak``. Raises StateError (5) when it was not committed.

    ``folded``: the cache entry whose snapshot and journal ``state`` is (a compaction):
    the new snapshot names that journal and the seq it folded, with the ops of its last
    records (:func:`cni_dra.state.codec.folded_from`), so that another process that read
    up to one of them continues with its own state instead of decoding this one.

    Both files are written and fsync'ed under temporary names first, so a full disk or
    an I/O error fails before anything changes. The rename over ``state.json`` is the
    commit point: every reader sees the new state from then on. What follows (the
    backup's rename, the directory's fsync, removing the old journal, which names
    another id now and is ignored) cannot be undone, so its failure is logged, not
    raised: the caller must not roll back a state every reader already sees."""
    key = str(files.path)
    CACHE.pop(key, None)  # re-established below once the files are in place
    if state.bootID is None:  # a new or migrated state is written in this boot
        ops.apply(state, ops.SetBootID(boot_id()))
        folded = None  # a change no journal record holds
    seq = 0  # a new journal id: its records count from 1
    jid = os.urandom(8).hex()
    origin = None
    if folded is not None and folded.jid is not None:
        tail = [line for n, line in folded.recent if n > folded.seq - RECENT]
        if not folded.recent or folded.recent[-1][0] != folded.seq:
            tail = []
        origin = (folded.jid, folded.seq, tail)
    data = encode_state(state, (jid, seq), origin)
    tmp = files.dir / f".{STATE_FILE}.{os.getpid()}.tmp"
    bak_tmp = files.dir / f".{BACKUP_FILE}.{os.getpid()}.tmp"
    try:
        # Writers hold the lock, so any other temp file is left by a writer that died.
        for leftover in files.dir.glob(f".{STATE_FILE}*.tmp"):  # .state.json.bak.*.tmp too
            with contextlib.suppress(FileNotFoundError):
                fsio.unlink(leftover)
        write_synced(tmp, data, os.O_EXCL)
        write_synced(bak_tmp, data, os.O_TRUNC)
        fault_point("state:tmp-written")
        fsio.rename(tmp, files.path)
    except OSError as exc:
        for t in (tmp, bak_tmp):
            with contextlib.suppress(OSError):
                os.unlink(t)
        raise StateWriteError(
            f"failed to write state {files.path}: {exc.strerror}; nothing was changed"
        ) from exc
    fault_point("state:renamed")
    after: tuple[tuple[str, Callable[[], None]], ...] = (
        ("rename the backup copy", lambda: fsio.rename(bak_tmp, files.backup_path)),
        ("sync the state directory", lambda: fsio.fsync_dir(files.dir)),
        ("remove the folded journal", lambda: fsio.unlink(files.journal_path)),
    )
    for what, step in after:
        try:
            step()
        except FileNotFoundError:
            pass
        except OSError as exc:
            _log.warning("state %s committed, but failed to %s: %s", files.path, what, exc.strerror)
    with contextlib.suppress(OSError):
        os.unlink(bak_tmp)
    st = os.stat(files.path)
    CACHE[key] = Cached(ident(st), len(data), jid, seq, state)


def append(files: StateFiles, entry: Cached, ops: list[bytes], durable: bool = True) -> tuple[int, bool]:
    """Commit ``ops`` (encoded) as the next journal record of ``entry`` (fdatasync'ed
    when ``durable``, and when it creates the journal). A record is committed only when it was
    written whole and synced: on any failure it is cut off again (a truncate frees space, so
    it works on a full disk) and StateError (5) is raised; the caller then drops its cached
    view, so the process's view never runs ahead of the disk.

    Returns where the record starts (what :func:`cut` cuts back to) and whether it was synced."""
    seq = entry.seq + 1
    record = encode_record(entry.jid, seq, ops)
    try:
        fd = fsio.open_write(files.journal_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _write_error(files, exc) from exc
    end = 0
    synced = False
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
            synced = True
        if created:
            fsio.fsync_dir(files.dir)
        after = os.fstat(fd)
    except OSError as exc:
        try:  # what was written of the record is not committed: no reader may take it
            os.ftruncate(fd, end)
        except OSError as cut_exc:
            _log.error("failed to cut an uncommitted record off %s: %s", files.journal_path, cut_exc.strerror)
        raise _write_error(files, exc) from exc
    finally:
        os.close(fd)
    remember(entry, seq, record)
    entry.seq = seq
    entry.j_ident = (st.st_dev, st.st_ino)
    entry.j_end = entry.j_size = end + len(record)
    entry.j_times = (after.st_mtime_ns, after.st_ctime_ns)
    entry.j_stale = False
    return end, synced


def _write_error(files: StateFiles, exc: OSError) -> StateWriteError:
    return StateWriteError(f"failed to write state {files.journal_path}: {exc.strerror}; nothing was changed")


def _open_journal(files: StateFiles, j_ident: tuple[int, int] | None, flags: int) -> int | None:
    """The journal opened with ``flags`` when it is still the file ``j_ident`` names, else None."""
    try:
        fd = os.open(files.journal_path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != j_ident:
        os.close(fd)
        return None
    return fd


def sync(files: StateFiles, j_ident: tuple[int, int] | None) -> None:
    """``fdatasync`` the journal ``j_ident`` (the identity :func:`append` recorded): every
    record appended to it so far is committed. Nothing to do when it is no longer there (a
    snapshot, itself synced, replaced it). Raises StateWriteError (5)."""
    try:
        fd = _open_journal(files, j_ident, os.O_RDONLY)
        if fd is None:
            return
        try:
            fsio.fdatasync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _write_error(files, exc) from exc


def cut(files: StateFiles, j_ident: tuple[int, int] | None, offset: int) -> None:
    """Cut the journal ``j_ident`` back to ``offset`` (records appended after it were never
    committed: their sync failed) and drop this process's cached view. Raises OSError."""
    CACHE.pop(str(files.path), None)
    fd = _open_journal(files, j_ident, os.O_WRONLY)
    if fd is None:
        return
    try:
        os.ftruncate(fd, offset)
    finally:
        os.close(fd)
