"""One network namespace path opened once, pinned for the thread, entered in one scope.

:class:`NetnsHandle` is the pod's namespace of one plugin invocation, as the reference
plugins' ``ns.GetNS(path)`` handed to one ``netns.Do(func)``: :meth:`~NetnsHandle.fd` opens
the path on first use (codes 3/4 as :func:`cni_dra.netlink.netns.open_netns`) and keeps the
descriptor until :meth:`~NetnsHandle.close`; :meth:`~NetnsHandle.identity` is read from it
(``fstat``). While :meth:`~NetnsHandle.pinned` holds, every ``open_netns`` of the same path
by the calling thread (each netlink call that names the namespace) gets a duplicate of that
one descriptor; while :meth:`~NetnsHandle.entered` holds, the thread is in the namespace and
every ``in_netns_fd`` into it inside the block switches nothing, so the pod-side work of a
verb enters it once. A handle is used by one thread at a time. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from cni_dra.netlink.netns import (
    NetnsIdentity,
    entered_handle,
    in_netns_fd,
    open_netns,
    pin_table,
    set_entered_handle,
)

__all__ = ["NetnsHandle"]


class NetnsHandle:
    """The network namespace at ``path`` (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._identity: NetnsIdentity | None = None

    def fd(self) -> int:
        """The namespace's descriptor (opened on first use). Raises as ``open_netns``."""
        if self._fd is None:
            table = pin_table()
            mine = table.get(self.path) is self
            if mine:
                del table[self.path]  # open the path itself, then pin again
            try:
                self._fd = open_netns(self.path)
            finally:
                if mine:
                    table[self.path] = self
        return self._fd

    def identity(self) -> NetnsIdentity:
        """``(st_dev, st_ino)`` of the namespace (codes 3/4 as ``netns_identity``)."""
        if self._identity is None:
            st = os.fstat(self.fd())
            self._identity = (st.st_dev, st.st_ino)
        return self._identity

    def refers_to(self, fd: int) -> bool:
        """Whether descriptor ``fd`` is this namespace (one ``fstat``)."""
        if self._identity is None:
            return False
        try:
            st = os.fstat(fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    @contextmanager
    def pinned(self) -> Iterator[NetnsHandle]:
        """Let the calling thread's ``open_netns`` of this path reuse :meth:`fd`."""
        table = pin_table()
        before = table.get(self.path)
        table[self.path] = self
        try:
            yield self
        finally:
            if before is None:
                table.pop(self.path, None)
            else:
                table[self.path] = before

    @contextmanager
    def entered(self) -> Iterator[None]:
        """The ``with`` body in this namespace (``in_netns_fd``: one ``setns`` in and one
        out); nested entries, and ``in_netns_fd`` into it inside, switch nothing."""
        if entered_handle() is self:
            yield
            return
        fd = self.fd()
        self.identity()
        with in_netns_fd(fd, self.path):
            before = entered_handle()
            set_entered_handle(self)
            try:
                yield
            finally:
                set_entered_handle(before)

    def close(self) -> None:
        """Close the descriptor (the namespace is no longer kept alive by it)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
