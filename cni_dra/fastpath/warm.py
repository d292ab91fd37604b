"""What a serving process imports before its first request (the agent's process and its
fast-path worker processes): every module an ADD, CHECK or DEL touches, pyroute2's messages
and tc's, and the calling thread's kept rtnetlink socket, so that the first pod does not pay
for them. A plugin run in-process imports less, and only on first use (:mod:`cni_dra.main`).
"""

from __future__ import annotations

__all__ = ["warm_imports"]


def warm_imports() -> None:
    """Import everything an ADD/DEL touches, so the first request does not pay for it."""
    import cni_dra.allocator.capacity  # (an in-process DEL does not need these three: loaded on first use)
    import cni_dra.allocator.select
    import cni_dra.attach.intent
    import cni_dra.attach.release
    import cni_dra.cni
    import cni_dra.dra.inventory
    import cni_dra.ipam
    import cni_dra.protocol.config
    import cni_dra.protocol.results
    import cni_dra.verbs.add
    import cni_dra.verbs.check
    import cni_dra.verbs.delete  # noqa: F401 (imported to be loaded, not called)
    from cni_dra.netlink import info, sockets  # the package loads every netlink module
    from cni_dra.state import books

    books.serving()  # a serving process asks the books again: count them at the first question

    info.host_link("lo")  # loads pyroute2 and opens the main thread's kept socket
    sockets.load_tc()  # shaping's messages: else each process's first shaped ADD loads them
