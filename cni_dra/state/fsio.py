"""Every write the state store makes goes through here: whole writes, syncs, renames,
truncates, unlinks, creating opens and directory syncs, with an I/O fault-injection seam.

The product needs only the whole-write rule: :func:`write_all` loops until every byte is
written, since a write on a nearly full filesystem may write part of its buffer and return
the short count instead of raising ENOSPC; a write that makes no progress raises ENOSPC.
Everything else is a thin wrapper of :mod:`os`.

The seam (for tests; stdlib only, one global lookup per call when off): a *plan* makes the
Nth call of one operation (or the Nth call of any, ``any``) fail once:

* ``ENOSPC`` / ``EIO``: raise that :class:`OSError` (nothing done);
* ``short``: a write writes half its bytes (at least one) and returns that count, as a
  write on a nearly full filesystem does (``write@3=short,write@4=ENOSPC`` is a disk that
  fills up within a record); for an operation that writes nothing, ENOSPC.

Operations (:data:`OPS`): ``open`` (creating or truncating open), ``write``, ``fsync``,
``fdatasync``, ``rename``, ``truncate``, ``unlink``, ``fsync_dir``. In a process a plan is
set with :func:`inject` (unit tests); a plugin or agent process reads it from the
environment variable :data:`FAULT_ENV` (``CNI_DRA_IO_FAULT``, e.g. ``write@3=short`` or
``any@5=EIO``, comma-separated) only while the root-owned test switch of
:mod:`cni_dra.faults` exists, so a runtime that controls the plugin's environment alone
cannot make it fail. :func:`counting` records the calls made (to enumerate a matrix); a
process started with :data:`LOG_ENV` (``CNI_DRA_IO_FAULT_LOG``, a file path, same switch)
appends the name of each call to that file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from cni_dra.faults import switch_on

__all__ = [
    "FAULT_ENV",
    "LOG_ENV",
    "OPS",
    "KINDS",
    "Plan",
    "parse_plan",
    "inject",
    "counting",
    "open_write",
    "write_all",
    "fsync",
    "fdatasync",
    "rename",
    "truncate",
    "unlink",
    "fsync_dir",
]

FAULT_ENV = "CNI_DRA_IO_FAULT"
LOG_ENV = "CNI_DRA_IO_FAULT_LOG"
OPS = ("open", "write", "fsync", "fdatasync", "rename", "truncate", "unlink", "fsync_dir")
KINDS = ("ENOSPC", "EIO", "short")

_PLAN_RE = re.compile(r"^(any|" + "|".join(OPS) + r")@([1-9][0-9]*)=(" + "|".join(KINDS) + r")$")


@dataclass
class Plan:
    """Faults to make (``(op, n, kind)``: the ``n``-th call of ``op``, counted from 1, or of
    any operation for ``op == "any"``) and the calls made so far (``log``)."""

    faults: list[tuple[str, int, str]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    log_path: str | None = None

    def hit(self, op: str) -> str | None:
        """Count a call of ``op``; the fault kind to make now, if any."""
        self.log.append(op)
        if self.log_path:
            with open(self.log_path, "a", encoding="ascii") as f:
                f.write(op + "\n")
        n = self.counts[op] = self.counts.get(op, 0) + 1
        for fop, fn, kind in self.faults:
            if (fop == op and fn == n) or (fop == "any" and fn == len(self.log)):
                return kind
        return None


def parse_plan(text: str) -> Plan:
    """A plan from ``op@n=kind[,...]``. Raises ValueError naming a malformed item."""
    plan = Plan()
    for item in filter(None, (s.strip() for s in text.split(","))):
        m = _PLAN_RE.match(item)
        if m is None:
            raise ValueError(
                f"{FAULT_ENV}: {item!r} is not op@n=kind (op: any, {', '.join(OPS)}; kind: {', '.join(KINDS)})"
            )
        plan.faults.append((m.group(1), int(m.group(2)), m.group(3)))
    return plan


_PLAN: Plan | None = None
_ENV_READ = False
_GUARD = threading.Lock()


def _plan() -> Plan | None:
    global _PLAN, _ENV_READ
    if _PLAN is None and not _ENV_READ:
        _ENV_READ = True
        text, log_path = os.environ.get(FAULT_ENV), os.environ.get(LOG_ENV)
        if (text or log_path) and switch_on():
            _PLAN = parse_plan(text or "")
            _PLAN.log_path = log_path
    return _PLAN


@contextlib.contextmanager
def inject(spec: str | Plan) -> Iterator[Plan]:
    """Within the block, this process's state I/O follows ``spec`` (a :class:`Plan` or its
    text); yields the plan (its ``log`` lists the calls made)."""
    global _PLAN
    plan = parse_plan(spec) if isinstance(spec, str) else spec
    with _GUARD:
        previous, _PLAN = _PLAN, plan
    try:
        yield plan
    finally:
        with _GUARD:
            _PLAN = previous


def counting() -> contextlib.AbstractContextManager[Plan]:
    """A plan without faults: what calls a block makes, in order (``plan.log``)."""
    return inject(Plan())


def _fault(op: str) -> str | None:
    plan = _PLAN if _ENV_READ else _plan()
    if plan is None:
        return None
    with _GUARD:
        kind = plan.hit(op)
    if kind is not None and (kind != "short" or op != "write"):
        code = errno.EIO if kind == "EIO" else errno.ENOSPC
        raise OSError(code, f"{os.strerror(code)} (injected at {op} #{plan.counts[op]})")
    return kind


def open_write(path: str | os.PathLike[str], flags: int, mode: int = 0o600) -> int:
    """``os.open`` for writing (``O_WRONLY``/``O_RDWR`` and ``O_CREAT`` given by the caller)."""
    _fault("open")
    return os.open(path, flags, mode)


def write_all(fd: int, data: bytes, offset: int | None = None) -> None:
    """Write all of ``data`` at ``offset`` (``pwrite``) or at the file position; a write
    that writes nothing raises ENOSPC. Raises OSError."""
    view = memoryview(data)
    while view:
        chunk = view[: max(1, len(view) // 2)] if _fault("write") == "short" else view
        n = os.write(fd, chunk) if offset is None else os.pwrite(fd, chunk, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]
        if offset is not None:
            offset += n


def fsync(fd: int) -> None:
    _fault("fsync")
    os.fsync(fd)


def fdatasync(fd: int) -> None:
    _fault("fdatasync")
    os.fdatasync(fd)


def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """``os.replace``: atomic within one filesystem."""
    _fault("rename")
    os.replace(src, dst)


def truncate(fd: int, length: int) -> None:
    _fault("truncate")
    os.ftruncate(fd, length)


def unlink(path: str | os.PathLike[str]) -> None:
    _fault("unlink")
    os.unlink(path)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory (its entries: a rename or a new file in it)."""
    _fault("fsync_dir")
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
