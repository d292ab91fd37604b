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
  version, retries once with ``cniVersion`` (and ``prevResult``) rewritten to it. The
  process remembers that version for that binary (its path and identity: device, inode,
  size, mtime, ctime) and the config's version, and sends it at once from then on: one
  run of the plugin per call instead of three (the agent serves every ADD, CHECK and
  DEL of a node). A replaced binary is asked again; so is one that refuses the version
  it took before;
* they do not know STATUS or GC (they fail the env check with code 3).
  :func:`ipam_status` and :func:`ipam_gc` therefore skip plugins whose VERSION
  answer lacks a version >= 1.1.0.

No shell is involved; the plugin is run from its absolute path, in a session of its own,
with only its stdin, stdout and stderr (pipes) and default signal dispositions. It is
started with glibc's ``posix_spawn`` through ctypes, which, unlike ``subprocess``, lets the
agent's other threads run while the child starts (:mod:`cni_dra.ipam.spawn`; ``subprocess``
when the C library lacks what that needs). Stdlib only.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cni_dra.errors import (
    CniError,
    DecodeError,
    InvalidConfigError,
    IpamError,
    TryAgainLaterError,
)
from cni_dra.ipam.spawn import Child, Timeout
from cni_dra.protocol.versions import SUPPORTED_VERSIONS, parse_version, version_at_least

if TYPE_CHECKING:
    from cni_dra.protocol.results import Result

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
_NEGOTIATED = ("ADD", "DEL", "CHECK")  # the verbs retried with an older version (module docstring)

_DOWNGRADES: dict[tuple[str, tuple[int, ...], str], str] = {}
"""(plugin path, its identity, the config's cniVersion) -> the older version that binary
took after refusing the config's (module docstring). Bounded by :data:`_DOWNGRADES_MAX`."""
_DOWNGRADES_MAX = 64


def _binary_identity(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _config_version(netconf: bytes) -> str | None:
    try:
        version = json.loads(netconf).get("cniVersion")
    except (ValueError, AttributeError):
        return None
    return version if isinstance(version, str) else None


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
            child = Child.start(path, env)
            break
        except OSError as exc:
            if exc.errno == errno.ETXTBSY and attempt < _TXTBSY_RETRIES:
                time.sleep(0.05 * (2**attempt))
                continue
            raise IpamError(f"failed to {what}: cannot execute {path}", str(exc)) from exc
    try:
        out, err = child.communicate(stdin, timeout_s)
    except Timeout as exc:
        child.kill_group()
        raise TryAgainLaterError(f"failed to {what}: timed out after {timeout_s:g} s") from exc
    return child.wait(), out, err


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
        from cni_dra.protocol.results import parse_result, result_to_dict

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
    of code 1 to ADD/DEL/CHECK it retries once with an older version both support, and
    sends that version at once to the same binary from then on (see the module docstring).

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
    key = None
    if _DOWNGRADES and command in _NEGOTIATED:
        ident, version = _binary_identity(path), _config_version(netconf)
        if ident is not None and version is not None:
            key = (path, ident, version)
    remembered = _DOWNGRADES.get(key) if key is not None else None
    sent = _downgrade(netconf, remembered) if remembered is not None else netconf
    rc, out, err = _run(path, sent, child_env, timeout_s, what)
    if rc != 0:
        error = _error_from(what, rc, out, err)
        if error.code != 1 or command not in _NEGOTIATED:
            raise error
        if key is not None and remembered is not None:  # it refuses the version it took before: ask again
            _DOWNGRADES.pop(key, None)
            return ipam_exec(command, ipam_type, netconf, env, cni_path, timeout_s=timeout_s)
        # read before the VERSION call: a binary replaced meanwhile is not remembered
        ident = _binary_identity(path)
        target = _negotiated_version(ipam_type, env, cni_path, netconf, timeout_s)
        if target is None:
            raise error
        rc, out, err = _run(path, _downgrade(netconf, target), child_env, timeout_s, what)
        if rc != 0:
            raise _error_from(what, rc, out, err)
        version = _config_version(netconf)
        if ident is not None and version is not None and ident == _binary_identity(path):
            if len(_DOWNGRADES) >= _DOWNGRADES_MAX:
                _DOWNGRADES.clear()
            _DOWNGRADES[(path, ident, version)] = target
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
    from cni_dra.protocol.results import parse_result  # lazy: DEL, CHECK, STATUS, GC parse no result

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
