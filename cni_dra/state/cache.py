"""The process cache: what a process knows of each state directory it read or wrote.

An entry is keyed by the snapshot's path and holds the decoded state, the snapshot's
identity (inode, size, mtime, ctime) and the journal's (inode, end of the last record
read), so the resident agent parses the snapshot once and then only the records other
processes appended (:mod:`cni_dra.state.journal`). Any failure drops the entry: the
process's view never runs ahead of the disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from cni_dra.state.codec import decode_snapshot
from cni_dra.state.schema import NodeState

__all__ = ["Reload", "Cached", "CACHE", "RECENT", "ident", "decoded", "remember"]


class Reload(Exception):
    """The cached state cannot be continued from the files: read them from scratch."""


@dataclass
class Cached:
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
    # the last records read or written (seq, the record's line), at most RECENT: a snapshot
    # folded from them carries their ops, so that a process a few records behind takes it
    # up without decoding it (cni_dra.state.reading)
    recent: list[tuple[int, bytes]] = field(default_factory=list)


CACHE: dict[str, Cached] = {}

RECENT = 8
"""Records a cache entry remembers (:attr:`Cached.recent`)."""


def remember(entry: Cached, seq: int, line: bytes) -> None:
    """Keep record ``seq`` (its verified ``line``) among ``entry``'s last :data:`RECENT`."""
    recent = entry.recent
    if recent and recent[-1][0] != seq - 1:
        recent.clear()
    recent.append((seq, line))
    if len(recent) > RECENT:
        del recent[0]


def ident(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def decoded(data: bytes, source: str, ident: tuple[int, int, int, int] | None = None) -> Cached:
    """A cache entry for snapshot bytes ``data`` (its journal not read yet). Raises StateError (5)."""
    state, journal = decode_snapshot(data, source)
    jid, seq = journal if journal is not None else (None, 0)
    return Cached(ident, len(data), jid, seq, state)
