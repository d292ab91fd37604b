"""The agent's fast-path worker processes: each accepts on the listening socket the agent
passed it (:func:`cni_dra.fastpath.server.start_fastpath` starts them), joins the node's mount
namespace first when told to, and serves until the agent's lifeline pipe closes or SIGTERM.

An agent in a container (its own mount namespace and root; the node's network and PID
namespaces) passes ``join_mount_ns`` (``/proc/1/ns/mnt``): it then serves only from worker
processes that joined that mount namespace before their first thread started
(:mod:`cni_dra.fastpath.join`), and its own process, which cannot (it runs threads),
serves nothing. A worker that cannot join logs why and declines every caller (the
server's rule: another mount namespace and root than the caller's).
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from cni_dra.fastpath.server import FastpathServer, run_threads
from cni_dra.fastpath.warm import warm_imports
from cni_dra.fastpath.wire import caller_identity

log = logging.getLogger("cni_dra.fastpath")

__all__ = ["worker_process_main"]


def worker_process_main(argv: list[str]) -> int:
    """A worker process: join the mount namespace ``argv[4]`` names, if any (before any
    thread starts); accept on the inherited listening socket until the agent's pipe closes
    (it stopped or died) or SIGTERM; in-flight requests finish first."""
    import signal

    listen_fd, lifeline, workers, path = int(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("cni_dra").setLevel(os.environ.get("CNI_DRA_LOG_LEVEL", "WARNING").upper())
    warm_imports()
    if len(argv) > 4 and argv[4]:
        _join(argv[4])
    server = FastpathServer(socket_path=path, _sock=socket.socket(fileno=listen_fd), _owns_path=False)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())

    def watch() -> None:
        while os.read(lifeline, 64):
            pass
        done.set()

    threading.Thread(target=watch, name="cni-dra-fastpath-lifeline", daemon=True).start()
    run_threads(server, workers)
    while not done.wait(1.0):  # a timeout keeps the main thread responsive to SIGTERM
        pass
    server.drain()
    return 0


def _join(target: str) -> None:
    """Join the mount namespace ``target`` (:func:`cni_dra.fastpath.join.join_mount_namespace`),
    or log why not: this process then declines every caller of the node (another mount
    namespace and root than theirs)."""
    from cni_dra.fastpath.join import join_mount_namespace

    try:
        joined = join_mount_namespace(target)
    except OSError as exc:
        log.error(
            "fastpath: worker process %d cannot join the mount namespace %s, so it declines every caller: %s",
            os.getpid(),
            target,
            exc,
        )
        return
    log.info(
        "fastpath: worker process %d %s the mount namespace %s (%d libraries loaded first); serving as %s "
        "in %s",
        os.getpid(),
        "joined" if joined.moved else "is already in",
        target,
        joined.libraries,
        caller_identity().decode(),
        joined.cwd,
    )
