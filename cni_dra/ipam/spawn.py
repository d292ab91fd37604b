"""Starting an IPAM plugin: glibc's ``posix_spawn`` through ctypes, ``subprocess`` as the fallback.

:class:`Child` is a running plugin (:meth:`Child.start`): its pipes, :meth:`Child.communicate`,
:meth:`Child.wait`, :meth:`Child.kill_group`. Stdlib only; ``subprocess`` is imported only
for the fallback (an in-process plugin, which starts one IPAM plugin, does not pay for it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

__all__ = ["Child", "Timeout"]


class Timeout(Exception):
    """The plugin did not finish within the time given to :meth:`Child.communicate`."""


class _Spawn:
    """glibc's ``posix_spawn`` through ctypes, which releases the GIL while the child starts.

    ``subprocess`` holds the GIL from ``vfork`` until the child has exec'd (the parent
    thread is suspended meanwhile): in the agent, every other worker thread of the process
    then waits too, for milliseconds when the CPUs are busy (≈ 6 ms per IPAM call, median,
    in a burst of 200 ADDs). The child is made as ``subprocess`` makes it: a new session,
    stdin/stdout/stderr on pipes, no other descriptor, default signal dispositions, an empty
    signal mask. None when the C library lacks ``posix_spawn_file_actions_addclosefrom_np``
    (glibc < 2.34): :class:`Child` then uses ``subprocess``."""

    # <spawn.h> (glibc): posix_spawnattr_setflags flags
    SETSIGDEF, SETSIGMASK, SETSID = 0x04, 0x08, 0x80
    _ATTR_BYTES, _ACTIONS_BYTES, _SIGSET_BYTES = 512, 256, 256  # ≥ glibc's 336, 80 and 128

    def __init__(self) -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        self.ctypes = ctypes
        self.libc = libc
        self.closefrom: Any = libc.posix_spawn_file_actions_addclosefrom_np  # AttributeError: too old
        self.attr = ctypes.create_string_buffer(self._ATTR_BYTES)
        empty = ctypes.create_string_buffer(self._SIGSET_BYTES)
        full = ctypes.create_string_buffer(self._SIGSET_BYTES)
        libc.sigemptyset(empty)
        libc.sigfillset(full)
        # sigfillset leaves out glibc's own signals (32, 33), which its posix_spawn would
        # then leave ignored in the child, and an exec keeps that: set them by hand (bit
        # s - 1 of the set's first word).
        word = ctypes.c_uint64.from_buffer(full)
        word.value |= (1 << 31) | (1 << 32)
        calls: tuple[Callable[[], int], ...] = (
            lambda: libc.posix_spawnattr_init(self.attr),  # each returns an error number, 0: done
            lambda: libc.posix_spawnattr_setflags(
                self.attr, ctypes.c_short(self.SETSIGDEF | self.SETSIGMASK | self.SETSID)
            ),
            lambda: libc.posix_spawnattr_setsigmask(self.attr, empty),
            lambda: libc.posix_spawnattr_setsigdefault(self.attr, full),
        )
        for call in calls:
            err = call()
            if err != 0:
                raise OSError(err, os.strerror(err))

    def spawn(self, path: str, env: Mapping[str, str], fds: tuple[int, int, int]) -> int:
        """Start ``path`` with ``fds`` as its stdin, stdout, stderr; returns its pid. Raises OSError."""
        ctypes, libc = self.ctypes, self.libc
        actions = ctypes.create_string_buffer(self._ACTIONS_BYTES)
        err = libc.posix_spawn_file_actions_init(actions)
        if err != 0:
            raise OSError(err, os.strerror(err))
        try:
            for target, fd in enumerate(fds):
                err = libc.posix_spawn_file_actions_adddup2(actions, fd, target)
                if err != 0:
                    raise OSError(err, os.strerror(err))
            err = self.closefrom(actions, 3)
            if err != 0:
                raise OSError(err, os.strerror(err))
            encoded = [os.fsencode(path)]
            argv = (ctypes.c_char_p * 2)(encoded[0], None)
            pairs = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]
            envp = (ctypes.c_char_p * (len(pairs) + 1))(*pairs, None)
            pid = ctypes.c_int()
            err = libc.posix_spawn(ctypes.byref(pid), encoded[0], actions, self.attr, argv, envp)
            if err != 0:
                raise OSError(err, os.strerror(err), path)
            return int(pid.value)
        finally:
            libc.posix_spawn_file_actions_destroy(actions)


_SPAWN: _Spawn | None = None
_SPAWN_CHECKED = False


def _spawner() -> _Spawn | None:
    global _SPAWN, _SPAWN_CHECKED
    if not _SPAWN_CHECKED:
        _SPAWN_CHECKED = True
        try:
            _SPAWN = _Spawn()
        except (AttributeError, OSError):
            _SPAWN = None
    return _SPAWN


class Child:
    """A running IPAM plugin: started by :class:`_Spawn` (or ``subprocess``), its pipes, its exit."""

    def __init__(
        self, pid: int, stdin: int, stdout: int, stderr: int, proc: subprocess.Popen[bytes] | None
    ) -> None:
        self.pid = pid
        self.fds = {"stdin": stdin, "stdout": stdout, "stderr": stderr}
        self.proc = proc
        self.code: int | None = None

    @classmethod
    def start(cls, path: str, env: Mapping[str, str]) -> Child:
        """Raises OSError when it cannot be executed."""
        spawner = _spawner()
        pipes = [os.pipe() for _ in range(3)] if spawner is not None else []
        if spawner is None or min(fd for pair in pipes for fd in pair) < 3:
            # (a pipe on 0-2, when this process runs without them: subprocess orders the dup2s)
            import subprocess

            for r, w in pipes:
                os.close(r)
                os.close(w)
            proc = subprocess.Popen(
                [path],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env),
                close_fds=True,
                start_new_session=True,
            )
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            return cls(proc.pid, proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno(), proc)
        # the pipes are non-inheritable: only the dup2'd ends reach the child
        try:
            pid = spawner.spawn(path, env, (pipes[0][0], pipes[1][1], pipes[2][1]))
        except BaseException:
            for r, w in pipes:
                os.close(r)
                os.close(w)
            raise
        for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
            os.close(fd)
        return cls(pid, pipes[0][1], pipes[1][0], pipes[2][0], None)

    def communicate(self, data: bytes, timeout_s: float) -> tuple[bytes, bytes]:
        """Write ``data`` to its stdin, read stdout and stderr to their end. Raises
        :class:`Timeout` past ``timeout_s`` (the pipes stay open)."""
        if self.proc is not None:
            import subprocess

            try:
                out, err = self.proc.communicate(data, timeout=timeout_s)
            except subprocess.TimeoutExpired as exc:
                raise Timeout(f"ipam did not finish within {timeout_s:g} s") from exc
            return out, err
        import selectors

        deadline = time.monotonic() + timeout_s
        chunks: dict[int, list[bytes]] = {self.fds["stdout"]: [], self.fds["stderr"]: []}
        view = memoryview(data)
        with selectors.DefaultSelector() as sel:
            if view:
                os.set_blocking(self.fds["stdin"], False)
                sel.register(self.fds["stdin"], selectors.EVENT_WRITE)
            else:
                self._close("stdin")
            for fd in chunks:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(f"ipam did not finish within {timeout_s:g} s")
                for key, _ in sel.select(left):
                    fd = key.fd
                    if fd == self.fds["stdin"]:
                        try:
                            view = view[os.write(fd, view[: 1 << 16]) :]
                        except BrokenPipeError:
                            view = view[:0]
                        if not view:
                            sel.unregister(fd)
                            self._close("stdin")
                        continue
                    chunk = os.read(fd, 1 << 16)
                    if chunk:
                        chunks[fd].append(chunk)
                    else:
                        sel.unregister(fd)
        out, err = (b"".join(chunks[self.fds[name]]) for name in ("stdout", "stderr"))
        self._close("stdout")
        self._close("stderr")
        return out, err

    def _close(self, name: str) -> None:
        fd = self.fds.get(name, -1)
        if fd >= 0 and self.proc is None:
            os.close(fd)
        self.fds[name] = -1

    def wait(self) -> int:
        """Reap it; its exit code (negative: the signal that ended it)."""
        if self.proc is not None:
            return self.proc.wait()
        if self.code is None:
            _, status = os.waitpid(self.pid, 0)
            self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def kill_group(self) -> None:
        """Kill its process group (it leads its own session) and reap it.

        A descendant that left the group could keep the pipes open; the pipes are then
        closed rather than drained, so this never blocks for long."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None:
            import subprocess

            try:
                self.proc.communicate(timeout=2.0)
            except subprocess.TimeoutExpired:
                for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                    if pipe is not None:
                        pipe.close()
                self.proc.wait()
            return
        for name in ("stdin", "stdout", "stderr"):
            self._close(name)
        self.wait()
