"""The agent side of the fast path: serve plugin invocations from warm imports.

:func:`start_fastpath` listens on a unix socket (the file 0600, in a directory 0700, both
owned by the agent's euid) and runs each request in one of a few worker threads: exactly
:func:`cni_dra.cni.run` on the caller's environment and stdin, so the agent decides nothing
the plugin would not decide itself on the same input. Network namespace switches are per
thread (:mod:`cni_dra.netlink.netns`); the state file lock serialises agent threads with
each other and with in-process invocations.

A request is *declined* (the client then runs it in-process) when:

* the peer's uid (``SO_PEERCRED``) is not the agent's euid (the connection is just closed);
* the caller's mount namespace, network namespace or root directory differ from the
  serving process's, or its working directory does: paths in the input could then name
  other objects;
* the request is malformed or larger than :data:`~cni_dra.fastpath.wire.MAX_MESSAGE_BYTES`.

An agent in a container serves from worker processes only (:mod:`cni_dra.fastpath.workers`).

Wire format: :mod:`cni_dra.fastpath.wire`. ``cni-dra agent`` runs it as one of its services
(:class:`cni_dra.agent.fastpath.FastpathService`). Logging goes through the ``cni_dra`` logger of
the hosting process (``CNI_DRA_LOG_FILE`` of a request is not honoured). Run standalone (tests, ``make bench``): ``python -m cni_dra.fastpath.server --socket PATH``
(:func:`main`, a thin click command; importing this module does not import click).
"""

from __future__ import annotations

import io
import logging
import os
import queue
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

from cni_dra.fastpath.activation import bind_listener
from cni_dra.fastpath.warm import warm_imports
from cni_dra.fastpath.wire import (
    DEFAULT_SOCKET,
    MAX_MESSAGE_BYTES,
    REQUEST_FRAMES,
    STATUS_DECLINED,
    STATUS_OK,
    caller_identity,
    decode_environment,
    decode_frames,
    encode_frames,
)

__all__ = [
    "DEFAULT_WORKERS",
    "DEFAULT_PROCESSES",
    "FastpathServer",
    "start_fastpath",
    "serve",
    "main",
]

log = logging.getLogger("cni_dra.fastpath")

_REQUEST_READ_TIMEOUT_S = 30.0

DEFAULT_WORKERS = 8
"""Worker threads of :func:`start_fastpath` (invocations served at once), per process."""

DEFAULT_PROCESSES = max(1, min(os.cpu_count() or 1, 4))
"""Processes accepting on the socket for ``cni-dra agent`` (one per CPU, at most 4): the
Python work of one invocation holds the GIL, so one process serves a burst on one CPU.
Worker processes share the listening socket; the state lock and each process's cache
(validated by file identity) keep them coherent."""


@dataclass
class FastpathServer:
    """A running fast-path listener; :meth:`stop` closes it and removes the socket file."""

    socket_path: str
    _sock: socket.socket
    _thread: threading.Thread | None = None
    _queue: queue.SimpleQueue[socket.socket | None] = field(default_factory=queue.SimpleQueue)
    _workers: list[threading.Thread] = field(default_factory=list)
    _stopped: threading.Event = field(default_factory=threading.Event)
    _count_lock: threading.Lock = field(default_factory=threading.Lock)
    _children: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _lifeline: int | None = None  # write end of the pipe worker processes watch
    _lifeline_r: int | None = None  # its read end, for the worker processes started later
    _spawn: Callable[[], subprocess.Popen[bytes]] | None = None  # starts one worker process
    _monitor: threading.Thread | None = None
    _owns_path: bool = True
    _inherited: bool = False  # systemd's socket (cni_dra.fastpath.activation): never shut down
    served: int = 0
    declined: int = 0

    @property
    def pids(self) -> list[int]:
        """This process and its worker processes (counts ``served``/``declined`` are this
        process's own)."""
        return [os.getpid()] + [p.pid for p in self._children]

    def drain(self) -> None:
        """A worker process's stop: stop accepting (the socket stays open for the agent),
        let each serving thread finish its request, at most 30 s each."""
        self._stopped.set()
        for _ in self._workers:
            self._queue.put(None)
        for worker in self._workers:
            worker.join(timeout=30)

    def stop(self) -> None:
        """Stop accepting (in-flight requests finish in their threads); stop the worker
        processes (they finish theirs first, at most 30 s); remove the socket file."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._monitor is not None:
            self._monitor.join()  # starts no worker process after this
        for fd in (self._lifeline, self._lifeline_r):
            if fd is not None:
                os.close(fd)  # the write end: EOF, the worker processes stop accepting and exit
        self._lifeline = self._lifeline_r = None
        for child in self._children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if not self._inherited:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._sock.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for _ in self._workers:
            self._queue.put(None)
        if not self._owns_path:
            return
        try:
            if stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    def _watch_children(self) -> None:
        """Start another worker process for each that exits while the server runs (a fault,
        the OOM killer): with ``join_mount_ns`` they are the only ones serving, and a socket
        nobody accepts on would hold every caller until its timeout."""
        while not self._stopped.wait(1.0):
            for i, child in enumerate(self._children):
                if child.poll() is not None and self._spawn is not None and not self._stopped.is_set():
                    log.error(
                        "fastpath: worker process %d exited (status %s); starting another",
                        child.pid,
                        child.returncode,
                    )
                    self._children[i] = self._spawn()

    def _serve(self) -> None:
        import select

        poller = select.poll()
        poller.register(self._sock.fileno(), select.POLLIN)
        while not self._stopped.is_set():
            # systemd's socket is never shut down: look every 0.5 s whether to stop (what
            # arrives after that waits for the next agent, which systemd starts for it)
            if self._inherited and not poller.poll(500):
                continue
            if self._stopped.is_set():
                return
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._stopped.is_set():
                    return
                time.sleep(0.05)  # e.g. the shared socket was shut down by the agent
                continue
            self._queue.put(conn)

    def _work(self) -> None:
        from cni_dra.errors import CniError
        from cni_dra.netlink.info import host_link
        from cni_dra.netlink.sockets import keep_host_socket

        with keep_host_socket():  # one host rtnetlink socket per worker, not one per request
            try:
                host_link("lo")  # open it now, not on the first request
            except CniError as exc:
                log.warning("fastpath: cannot open a host rtnetlink socket yet: %s", exc.msg)
            while True:
                conn = self._queue.get()
                if conn is None:
                    return
                self._handle(conn)

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                pid, uid, _gid = struct.unpack(
                    "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                )
                if uid != os.geteuid():
                    log.warning("fastpath: refused connection from pid %d uid %d", pid, uid)
                    return
                conn.settimeout(_REQUEST_READ_TIMEOUT_S)
                request = _recv_all(conn)
                status, stdout = self._answer(request)
                conn.settimeout(None)
                conn.sendall(encode_frames(status, stdout))
            except OSError as exc:
                log.warning("fastpath: connection failed: %s", exc)
            except Exception:  # keep the worker; the client sees EOF and runs it in-process
                log.exception("fastpath: internal error; the caller falls back to in-process")

    def _answer(self, request: bytes | None) -> tuple[bytes, bytes]:
        if request is None:
            return self._decline("request too large")
        try:
            ident, cwd, env_block, stdin = decode_frames(request, REQUEST_FRAMES)
            environ = decode_environment(env_block)
        except ValueError as exc:
            return self._decline(f"malformed request: {exc}")
        mine = caller_identity()
        if ident != mine:
            return self._decline(f"caller sees {ident.decode(errors='replace')}, agent {mine.decode()}")
        if os.fsdecode(cwd) != os.getcwd():
            return self._decline("caller's working directory differs from the agent's")
        from cni_dra.cni import run

        out = io.StringIO()
        t0, c0 = time.perf_counter(), time.thread_time()
        code = run(environ, stdin, out)
        with self._count_lock:
            self.served += 1
        log.debug(
            "fastpath: %s exit %d in %.1f ms (%.1f ms CPU in this thread)",
            environ.get("CNI_COMMAND"),
            code,
            (time.perf_counter() - t0) * 1e3,
            (time.thread_time() - c0) * 1e3,
        )
        return STATUS_OK + f" {code}".encode(), out.getvalue().encode()

    def _decline(self, reason: str) -> tuple[bytes, bytes]:
        log.info("fastpath: declined: %s", reason)
        with self._count_lock:
            self.declined += 1
        return STATUS_DECLINED + f" {reason}".encode(), b""


def _recv_all(conn: socket.socket) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_MESSAGE_BYTES:
            return None
        chunks.append(chunk)


def start_fastpath(
    socket_path: str,
    *,
    warm: bool = True,
    workers: int = DEFAULT_WORKERS,
    processes: int = 1,
    join_mount_ns: str | None = None,
    listener: socket.socket | None = None,
) -> FastpathServer:
    """Listen on ``socket_path`` and serve plugin invocations in ``workers`` threads; returns the handle.

    ``processes`` > 1: that many processes accept on the socket, this one and
    ``processes - 1`` worker processes (the same interpreter and package, started now,
    each with ``workers`` threads), so a burst uses more than one CPU. They exit when
    this process stops the server or dies (a pipe they watch closes); one that exits
    before is replaced.

    ``join_mount_ns`` (an agent in a container, module docstring): ``processes`` worker
    processes (at least one) join that mount namespace, then serve; this process does not.

    Connections beyond ``workers`` wait in a queue (the kernel backlog, then in-process):
    a few threads finish a burst of 200 ADDs sooner than 200 threads contending for the
    GIL and the state lock.

    The parent directory is created 0700 (an existing one must be owned by our euid and
    closed to group and others, else ``PermissionError``); a stale socket file is replaced;
    the socket is 0600. ``warm``: import the ADD/DEL path (pydantic, pyroute2) now
    rather than on the first request. Call ``.stop()`` on the handle to close it.

    ``listener``: a listening socket bound to ``socket_path`` that systemd handed over
    (:func:`cni_dra.fastpath.activation.take_listener`): served as it is (its file and
    directory are systemd's, checked there), never shut down, and its file is left in
    place at stop. The worker processes accept on it too.

    The serving processes must share the node's mount and network namespaces and root, and
    run with working directory ``/`` (where runtimes run plugins): requests from callers
    that differ in any of these are declined (they then run in-process).
    Raises ``OSError`` when the socket cannot be bound.
    """
    socket_path = os.path.abspath(socket_path)
    if warm and not join_mount_ns:
        warm_imports()
    if listener is not None:
        server = FastpathServer(socket_path=socket_path, _sock=listener, _owns_path=False, _inherited=True)
    else:
        server = FastpathServer(socket_path=socket_path, _sock=bind_listener(socket_path))
    if join_mount_ns:
        _spawn_worker_processes(server, max(1, processes), workers, join_mount_ns)
        return server
    if processes > 1:
        _spawn_worker_processes(server, processes - 1, workers, "")
    run_threads(server, workers)
    return server


def run_threads(server: FastpathServer, workers: int) -> None:
    for i in range(max(1, workers)):
        worker = threading.Thread(target=server._work, name=f"cni-dra-fastpath-{i}", daemon=True)
        worker.start()
        server._workers.append(worker)
    server._thread = threading.Thread(target=server._serve, name="cni-dra-fastpath-accept", daemon=True)
    server._thread.start()


def _spawn_worker_processes(server: FastpathServer, count: int, workers: int, join_mount_ns: str) -> None:
    """Start ``count`` processes accepting on ``server``'s socket (:func:`cni_dra.fastpath.workers.worker_process_main`),
    each joining ``join_mount_ns`` first when it is not empty, and the thread that replaces
    one that exits."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (
        f"import sys; sys.path.insert(0, {package_root!r}); "
        "from cni_dra.fastpath.workers import worker_process_main as m; raise SystemExit(m(sys.argv[1:]))"
    )
    rfd, wfd = os.pipe()  # neither inheritable (PEP 446); rfd is passed to each worker process
    listen_fd = server._sock.fileno()
    argv = [
        *interpreter_command(),
        "-c",
        code,
        str(listen_fd),
        str(rfd),
        str(workers),
        server.socket_path,
        join_mount_ns,
    ]
    cwd = os.getcwd()
    level = logging.getLevelName(logging.getLogger("cni_dra").getEffectiveLevel())
    env = {**os.environ, "CNI_DRA_LOG_LEVEL": level}  # they log what this process logs

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, pass_fds=(listen_fd, rfd), stdin=subprocess.DEVNULL, cwd=cwd, env=env)

    server._lifeline, server._lifeline_r, server._spawn = wfd, rfd, spawn
    server._children.extend(spawn() for _ in range(count))
    server._monitor = threading.Thread(
        target=server._watch_children, name="cni-dra-fastpath-monitor", daemon=True
    )
    server._monitor.start()


def interpreter_command() -> list[str]:
    """The command that starts this Python again. The plugin tree's interpreter runs through
    the tree's own dynamic loader and libraries (README "Install layout"): when this process
    was started that way (``/proc/self/exe`` is a loader, not ``sys.executable``), the same
    loader with the libraries beside it; else ``sys.executable``."""
    try:
        exe = os.readlink("/proc/self/exe")
    except OSError:
        return [sys.executable]
    if os.path.basename(exe).startswith("ld-linux") and os.path.realpath(sys.executable) != exe:
        return [exe, "--library-path", os.path.dirname(exe), sys.executable]
    return [sys.executable]


def serve(
    socket_path: str | None,
    *,
    workers: int,
    processes: int,
    cwd: str,
    log_level: str,
    join_mount_ns: str | None = None,
) -> int:
    """Serve on ``socket_path`` (default: the client's) until SIGTERM/SIGINT; returns 0.

    Changes to ``cwd`` first (``/`` is where a runtime usually runs plugins; requests from
    another working directory are declined). ``join_mount_ns``: see :func:`start_fastpath`.
    Serves on the socket systemd passed when there is one (:mod:`cni_dra.fastpath.activation`). Prints ``ready <socket> pids=<pid>,...``
    (this process, then its worker processes) on stdout once listening.
    """
    import signal

    path = os.path.abspath(socket_path or DEFAULT_SOCKET)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("cni_dra").setLevel(log_level.upper())  # not pyroute2's debug chatter
    os.chdir(cwd)
    done = threading.Event()
    from cni_dra.fastpath.activation import take_listener

    server = start_fastpath(
        path, workers=workers, processes=processes, join_mount_ns=join_mount_ns, listener=take_listener(path)
    )
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(f"ready {path} pids={','.join(map(str, server.pids))}", flush=True)
    done.wait()
    server.stop()
    return 0


def main(argv: list[str] | None = None) -> NoReturn:
    """``python -m cni_dra.fastpath.server [--socket PATH] [--workers N] [--processes N]
    [--cwd DIR] [--log-level L] [--join-mount-ns PATH]``: :func:`serve` as a standalone process (tests, ``make bench``).

    Exits: 0 after SIGTERM/SIGINT, 2 on a usage error.

    A thin click command, built here: click is imported only by this entry, not by the
    module (the agent's worker processes import this module and never need click).
    """
    import click

    @click.command(context_settings={"help_option_names": ["-h", "--help"]})
    @click.option("--socket", "socket_path", default=None, help="socket path (default: the client's default)")
    @click.option(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        show_default=True,
        help="invocations served at once, per process",
    )
    @click.option(
        "--processes",
        type=int,
        default=DEFAULT_PROCESSES,
        show_default=True,
        help="processes accepting on the socket",
    )
    @click.option("--cwd", default="/", show_default=True, help="working directory of the agent")
    @click.option(
        "--log-level",
        envvar="CNI_DRA_LOG_LEVEL",
        default="WARNING",
        show_default=True,
        help="level of the cni_dra loggers",
    )
    @click.option(
        "--join-mount-ns",
        default=None,
        help="serve only from worker processes that joined this mount namespace (e.g. /proc/1/ns/mnt)",
    )
    def command(
        socket_path: str | None,
        workers: int,
        processes: int,
        cwd: str,
        log_level: str,
        join_mount_ns: str | None,
    ) -> None:
        """Serve plugin invocations on a unix socket until SIGTERM/SIGINT."""
        serve(
            socket_path,
            workers=workers,
            processes=processes,
            cwd=cwd,
            log_level=log_level,
            join_mount_ns=join_mount_ns,
        )

    command.main(args=argv, prog_name="python -m cni_dra.fastpath.server")
    raise SystemExit(0)  # not reached: click's standalone mode exits


if __name__ == "__main__":
    main()
