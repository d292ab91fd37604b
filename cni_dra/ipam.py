"""Delegation to the IPAM plugin named by ``ipam.type``.

Source: CNI spec 1.1.0, section "Delegated plugins (IPAM)": the delegating plugin
finds the IPAM binary on ``CNI_PATH``, executes it with the same environment (only
``CNI_COMMAND`` set to the verb) and the *whole* network configuration on stdin, and
reads a result (ADD) or an error JSON from stdout. It forwards ADD, DEL, CHECK, STATUS
and GC. Facts as in libcni's ``pkg/invoke``: the binary is the first regular file of
that name on the path; a non-zero exit carries ``{"code","msg","details"}`` on stdout
(else stderr says why); "text file busy" on exec is transient and retried.

Two measured facts about the reference IPAM plugins on Debian 12
(containernetworking-plugins 1.1.1) shape the version handling here:

* they support spec versions up to 1.0.0 and refuse a 1.1.0 config with code 1
  ("incompatible CNI versions"). On that answer :func:`ipam_exec` asks the plugin for
  its versions (VERSION verb) and, when one it supports is at most the config's
  version, retries once with ``cniVersion`` (and ``prevResult``) rewritten to it;
* they do not know STATUS or GC (they fail the env check with code 3).
  :func:`ipam_status` and :func:`ipam_gc` therefore skip plugins whose VERSION
  answer lacks a version >= 1.1.0.

No shell is involved; the plugin is run from its absolute path, in a session of its own,
with only its stdin, stdout and stderr (pipes) and default signal dispositions. It is
started with glibc's ``posix_spawn`` through ctypes, which, unlike ``subprocess``, lets the
agent's other threads run while the child starts (``subprocess`` when the C library lacks
what that needs). Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cni_dra.errors import (
    CniError,
    DecodeError,
    InvalidConfigError,
    IpamError,
    TryAgainLaterError,
)
from cni_dra.protocol.results import Result, parse_result, result_to_dict
from cni_dra.protocol.versions import SUPPORTED_VERSIONS, parse_version, version_at_least

__all__ = [
    "DEFAULT_IPAM_TIMEOUT_S",
    "find_plugin",
    "ipam_exec",
    "plugin_versions",
    "ipam_add",
    "ipam_del",
    "ipam_check",
    "ipam_status",
    "ipam_gc",
]

DEFAULT_IPAM_TIMEOUT_S = 60.0
"""How long an IPAM call may take, in seconds (dhcp waits for a lease; host-local takes ms)."""

_VERBS = {
    "ADD": "add",
    "DEL": "delete",
    "CHECK": "check",
    "STATUS": "get status of",
    "GC": "garbage-collect",
    "VERSION": "query version of",
}
_TXTBSY_RETRIES = 5


def find_plugin(name: str, cni_path: Sequence[str]) -> str:
    """Absolute path of the plugin binary ``name`` in the directories ``cni_path``.

    Returns the first regular, executable file called ``name``, in path order (CNI spec
    1.1.0 "Delegated plugins"; libcni's ``FindInPath``). Relative directories are made
    absolute against the current directory.

    Raises:
        InvalidConfigError: (code 7) ``name`` is empty, ``.``/``..`` or contains ``/``
            or NUL, or no directory holds such a file; the message names ``name`` and
            the directories searched.
    """
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise InvalidConfigError(
            f"invalid IPAM plugin name {name!r}", "a plugin type is a file name, without '/'"
        )
    for directory in cni_path:
        if not directory:
            continue
        candidate = os.path.join(os.path.abspath(directory), name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise InvalidConfigError(
        f"failed to find IPAM plugin {name!r} in path {list(cni_path)}",
        "install the plugin in a CNI_PATH directory or fix ipam.type",
    )


def _run(
    path: str, stdin: bytes, env: Mapping[str, str], timeout_s: float, what: str
) -> tuple[int, bytes, bytes]:
    """Run ``path`` once; returns (exit code, stdout, stderr). Kills its process group on timeout."""
    if any("\0" in k or "\0" in v or "=" in k for k, v in env.items()):
        raise IpamError(
            f"failed to {what}: cannot execute {path}", "environment contains a NUL byte or a bad name"
        )
    for attempt in range(_TXTBSY_RETRIES + 1):
        try:
            child = _Child.start(path, env)
            break
        except OSError as exc:
            if exc.errno == errno.ETXTBSY and attempt < _TXTBSY_RETRIES:
                time.sleep(0.05 * (2**attempt))
                continue
            raise IpamError(f"failed to {what}: cannot execute {path}", str(exc)) from exc
    try:
        out, err = child.communicate(stdin, timeout_s)
    except subprocess.TimeoutExpired as exc:
        child.kill_group()
        raise TryAgainLaterError(f"failed to {what}: timed out after {timeout_s:g} s") from exc
    return child.wait(), out, err


class _Spawn:
    """glibc's ``posix_spawn`` through ctypes, which releases the GIL while the child starts.

    ``subprocess`` holds the GIL from ``vfork`` until the child has exec'd (the parent
    thread is suspended meanwhile): in the agent, every other worker thread of the process
    then waits too, for milliseconds when the CPUs are busy (≈ 6 ms per IPAM call, median,
    in a burst of 200 ADDs). The child is made as ``subprocess`` makes it: a new session,
    stdin/stdout/stderr on pipes, no other descriptor, default signal dispositions, an empty
    signal mask. None when the C library lacks ``posix_spawn_file_actions_addclosefrom_np``
    (glibc < 2.34): :class:`_Child` then uses ``subprocess``."""

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


class _Child:
    """A running IPAM plugin: started by :class:`_Spawn` (or ``subprocess``), its pipes, its exit."""

    def __init__(
        self, pid: int, stdin: int, stdout: int, stderr: int, proc: subprocess.Popen[bytes] | None
    ) -> None:
        self.pid = pid
        self.fds = {"stdin": stdin, "stdout": stdout, "stderr": stderr}
        self.proc = proc
        self.code: int | None = None

    @classmethod
    def start(cls, path: str, env: Mapping[str, str]) -> _Child:
        """Raises OSError when it cannot be executed."""
        spawner = _spawner()
        pipes = [os.pipe() for _ in range(3)] if spawner is not None else []
        if spawner is None or min(fd for pair in pipes for fd in pair) < 3:
            # (a pipe on 0-2, when this process runs without them: subprocess orders the dup2s)
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
        subprocess.TimeoutExpired past ``timeout_s`` (the pipes stay open)."""
        if self.proc is not None:
            out, err = self.proc.communicate(data, timeout=timeout_s)
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
                    raise subprocess.TimeoutExpired("ipam", timeout_s)
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


def _error_from(what: str, rc: int, out: bytes, err: bytes) -> IpamError:
    """The IpamError for a failed call: the plugin's own code/msg/details when it printed them."""
    stderr = err.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(out)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("code"), int) and not isinstance(obj.get("code"), bool):
        msg = obj.get("msg") if isinstance(obj.get("msg"), str) else ""
        details = obj.get("details") if isinstance(obj.get("details"), str) else ""
        return IpamError(
            f"failed to {what}: {msg or 'error code ' + str(obj['code'])}",
            details or stderr,
            code=obj["code"],
        )
    return IpamError(f"failed to {what}: exit status {rc}", stderr or out.decode("utf-8", "replace").strip())


def _search_path(env: Mapping[str, str], cni_path: Sequence[str] | None) -> Sequence[str]:
    """``cni_path`` when given (e.g. :attr:`CniEnv.path`), else ``env["CNI_PATH"]`` split on ``os.pathsep``."""
    if cni_path is not None:
        return cni_path
    return [p for p in env.get("CNI_PATH", "").split(os.pathsep) if p]


def _child_env(env: Mapping[str, str], command: str) -> dict[str, str]:
    child = dict(env)
    child["CNI_COMMAND"] = command
    return child


def plugin_versions(
    ipam_type: str,
    env: Mapping[str, str],
    cni_path: Sequence[str] | None = None,
    *,
    cni_version: str = "",
    timeout_s: float = DEFAULT_IPAM_TIMEOUT_S,
) -> tuple[str, ...]:
    """The spec versions the IPAM plugin ``ipam_type`` supports (its VERSION answer).

    Sends ``{"cniVersion": cni_version}`` (CNI spec 1.1.0 "VERSION"; empty sends
    ``{}``). An answer without ``supportedVersions`` but with ``cniVersion`` 0.1.0 or
    0.2.0 means ("0.1.0", "0.2.0"), as libcni reads pre-0.3.0 plugins.

    Raises:
        InvalidConfigError: (code 7) the plugin is not on ``CNI_PATH``.
        IpamError: the plugin failed or could not be executed.
        DecodeError: (code 6) the answer is not a VERSION object.
        TryAgainLaterError: (code 11) the plugin did not answer within ``timeout_s``.
    """
    what = f"{_VERBS['VERSION']} IPAM {ipam_type}"
    path = find_plugin(ipam_type, _search_path(env, cni_path))
    stdin = json.dumps({"cniVersion": cni_version} if cni_version else {}).encode()
    rc, out, err = _run(path, stdin, _child_env(env, "VERSION"), timeout_s, what)
    if rc != 0:
        raise _error_from(what, rc, out, err)
    try:
        obj = json.loads(out)
    except ValueError as exc:
        raise DecodeError(f"failed to decode the VERSION answer of IPAM {ipam_type}", str(exc)) from exc
    if not isinstance(obj, dict):
        raise DecodeError(
            f"failed to decode the VERSION answer of IPAM {ipam_type}", "expected a JSON object"
        )
    versions = obj.get("supportedVersions")
    if versions is None and obj.get("cniVersion") in ("0.1.0", "0.2.0"):
        return ("0.1.0", "0.2.0")
    if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
        raise DecodeError(
            f"failed to decode the VERSION answer of IPAM {ipam_type}",
            "supportedVersions must be a list of strings",
        )
    return tuple(versions)


def _downgrade(netconf: bytes, target: str) -> bytes:
    """``netconf`` with ``cniVersion`` set to ``target`` and ``prevResult`` converted to it
    (dropped when it cannot be expressed there)."""
    conf = json.loads(netconf)
    original = conf.get("cniVersion")
    conf["cniVersion"] = target
    if "prevResult" in conf:
        try:
            conf["prevResult"] = result_to_dict(parse_result(conf["prevResult"], original), target)
        except CniError:
            del conf["prevResult"]
    return json.dumps(conf).encode()


def _negotiated_version(
    ipam_type: str, env: Mapping[str, str], cni_path: Sequence[str] | None, netconf: bytes, timeout_s: float
) -> str | None:
    """The newest version both sides support and not newer than the config's, if it differs."""
    try:
        conf = json.loads(netconf)
        current = conf["cniVersion"]
        parse_version(current)
    except (ValueError, KeyError, TypeError, CniError):
        return None
    try:
        theirs = plugin_versions(ipam_type, env, cni_path, cni_version=current, timeout_s=timeout_s)
    except CniError:
        return None
    candidates = []
    for v in theirs:
        if v in SUPPORTED_VERSIONS and v != current and version_at_least(current, v):
            candidates.append(v)
    return max(candidates, key=parse_version) if candidates else None


def ipam_exec(
    command: str,
    ipam_type: str,
    netconf: bytes | str,
    env: Mapping[str, str],
    cni_path: Sequence[str] | None = None,
    *,
    timeout_s: float = DEFAULT_IPAM_TIMEOUT_S,
) -> dict[str, Any] | None:
    """Execute IPAM plugin ``ipam_type`` for ``command`` and return its stdout object.

    The plugin is found on ``cni_path`` (default: ``env["CNI_PATH"]`` split; see
    :func:`find_plugin`), run without a
    shell with ``env`` plus ``CNI_COMMAND=command`` and ``netconf`` (the whole network
    config, bytes; ``str`` is UTF-8 encoded) on stdin (CNI spec 1.1.0 "Delegated plugins (IPAM)"). On an answer
    of code 1 to ADD/DEL/CHECK it retries once with an older version both support (see
    the module docstring).

    Returns:
        For ADD the decoded JSON object; for other verbs ``None`` (their stdout is
        ignored, as libcni does).

    Raises:
        InvalidConfigError: (code 7) the plugin is not on ``CNI_PATH`` or ``ipam_type``
            is not a file name.
        IpamError: non-zero exit. With a CNI error JSON on stdout it carries the
            plugin's ``code``, ``msg`` (as "failed to <verb> IPAM <type>: <msg>") and
            ``details``; without one, code 103 and stderr in ``details``. Also for a
            binary that cannot be executed.
        DecodeError: (code 6) ADD succeeded but stdout is not a JSON object.
        TryAgainLaterError: (code 11) no answer within ``timeout_s`` seconds (the
            plugin's process group is killed).
    """
    if isinstance(netconf, str):
        netconf = netconf.encode("utf-8")
    what = f"{_VERBS.get(command, command.lower())} IPAM {ipam_type}"
    path = find_plugin(ipam_type, _search_path(env, cni_path))
    child_env = _child_env(env, command)
    rc, out, err = _run(path, netconf, child_env, timeout_s, what)
    if rc != 0:
        error = _error_from(what, rc, out, err)
        if error.code != 1 or command not in ("ADD", "DEL", "CHECK"):
            raise error
        target = _negotiated_version(ipam_type, env, cni_path, netconf, timeout_s)
        if target is None:
            raise error
        rc, out, err = _run(path, _downgrade(netconf, target), child_env, timeout_s, what)
        if rc != 0:
            raise _error_from(what, rc, out, err)
    if command != "ADD":
        return None
    try:
        obj = json.loads(out)
    except ValueError as exc:
        raise DecodeError(f"failed to decode the result of IPAM {ipam_type}", str(exc)) from exc
    if not isinstance(obj, dict):
        raise DecodeError(f"failed to decode the result of IPAM {ipam_type}", "expected a JSON object")
    return obj


def _conf_version(netconf: bytes | str) -> str | None:
    try:
        version = json.loads(netconf).get("cniVersion")
    except (ValueError, AttributeError):
        return None
    return version if isinstance(version, str) else None


def ipam_add(
    ipam_type: str,
    netconf: bytes | str,
    env: Mapping[str, str],
    cni_path: Sequence[str] | None = None,
    *,
    timeout_s: float = DEFAULT_IPAM_TIMEOUT_S,
    require_ips: bool = True,
) -> Result:
    """IPAM ADD: allocate addresses; returns them as a spec 1.1.0 :class:`Result`.

    The plugin's output is parsed with :func:`parse_result` (its own ``cniVersion``,
    else the config's). IPAM output has no interfaces and no ``interface`` indexes;
    :func:`~cni_dra.protocol.results.merge_prev_result` fills those in.

    Raises:
        everything :func:`ipam_exec` raises;
        DecodeError: (code 6) the output is not a valid result;
        IpamError: (code 103) ``require_ips`` and the plugin returned no address.
    """
    obj = ipam_exec("ADD", ipam_type, netconf, env, cni_path, timeout_s=timeout_s)
    result = parse_result(obj, _conf_version(netconf))
    if require_ips and not result.ips:
        raise IpamError(f"failed to add IPAM {ipam_type}: the plugin returned no IP address")
    return result


def ipam_del(
    ipam_type: str,
    netconf: bytes | str,
    env: Mapping[str, str],
    cni_path: Sequence[str] | None = None,
    *,
    timeout_s: float = DEFAULT_IPAM_TIMEOUT_S,
) -> None:
    """IPAM DEL: release the addresses of (network, ``CNI_CONTAINERID``, ``CNI_IFNAME``).

    The reference IPAM plugins treat a release of nothing as success.

    Raises: as :func:`ipam_exec`.
    """
    ipam_exec("DEL", ipam_type, netconf, env, cni_path, timeout_s=timeout_s)


def ipam_check(
    ipam_type: str,
    netconf: bytes | str,
    env: Mapping[str, str],
    cni_path: Sequence[str] | None = None,
    *,
    timeout_s: float = DEFAULT_IPAM_TIMEOUT_S,
) -> None:
    """IPAM CHECK: the plugin verifies its allocation (``netconf`` carries ``prevResult``).

    Raises: as :func:`ipam_exec`.
    """
    ipam_exec("CHECK", ipam_type, netconf, env, cni_path, timeout_s=timeout_s)


def _supports_v11(
    ipam_type: str, env: Mapping[str, str], cni_path: Sequence[str] | None, timeout_s: float
) -> bool:
    versions = plugin_versions(ipam_type, env, cni_path, cni_version="1.1.0", timeout_s=timeout_s)
    good = []
    for v in versions:
        try:
            good.append(version_at_least(v, "1.1.0"))
        except CniError:
            continue
    return any(good)


def ipam_status(
    ipam_type: str,
    netconf: bytes | str,
    env: Mapping[str, str],
    cni_path: Sequence[str] | None = None,
    *,
    timeout_s: float = DEFAULT_IPAM_TIMEOUT_S,
) -> bool:
    """IPAM STATUS: whether the plugin is ready to ADD (CNI spec 1.1.0 "STATUS").

    Returns ``True`` when the plugin answered STATUS successfully, ``False`` when it was
    skipped because it predates spec 1.1.0 (no STATUS verb; nothing to ask).

    Raises: as :func:`ipam_exec` and :func:`plugin_versions`; an IpamError carries the
    plugin's code (50/51 when it reports itself unavailable).
    """
    if not _supports_v11(ipam_type, env, cni_path, timeout_s):
        return False
    ipam_exec("STATUS", ipam_type, netconf, env, cni_path, timeout_s=timeout_s)
    return True


def ipam_gc(
    ipam_type: str,
    netconf: bytes | str,
    env: Mapping[str, str],
    cni_path: Sequence[str] | None = None,
    *,
    timeout_s: float = DEFAULT_IPAM_TIMEOUT_S,
) -> bool:
    """IPAM GC: the plugin releases what ``cni.dev/valid-attachments`` in ``netconf`` does
    not list (CNI spec 1.1.0 "GC").

    Returns ``True`` when the plugin ran GC, ``False`` when it was skipped because it
    predates spec 1.1.0.

    Raises: as :func:`ipam_exec` and :func:`plugin_versions`.
    """
    if not _supports_v11(ipam_type, env, cni_path, timeout_s):
        return False
    ipam_exec("GC", ipam_type, netconf, env, cni_path, timeout_s=timeout_s)
    return True
