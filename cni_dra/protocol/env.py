"""The CNI environment: ``CNI_COMMAND`` and friends, and ``CNI_ARGS``.

Source: CNI spec 1.1.0, section "Parameters" (the ``CNI_*`` variables, which verb needs
which, container ID and interface name rules) and "Error" (code 4 "invalid necessary
environment variables", code 2 "unsupported field"). Runtimes' ``CNI_ARGS`` follow the
CNI "CONVENTIONS.md" keys (``IgnoreUnknown``, ``K8S_POD_*``, ``MAC``).

Which variable each verb requires is one table, :data:`REQUIRED_ENV`, as in libcni's
skel. A variable set to the empty string counts as missing.

Stdlib only: imported on every CNI call.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NewType

from cni_dra import iface
from cni_dra.errors import InvalidEnvironmentError, UnsupportedFieldError
from cni_dra.iface import MAX_IFNAME_BYTES, IfName

__all__ = [
    "COMMANDS",
    "REQUIRED_ENV",
    "KNOWN_ARGS",
    "MAX_ARGS_BYTES",
    "MAX_ARG_VALUE_BYTES",
    "MAX_IFNAME_BYTES",
    "ContainerID",
    "IfName",
    "CniArgs",
    "CniEnv",
    "parse_env",
    "parse_cni_args",
    "validate_container_id",
    "validate_ifname",
    "validate_netns",
]

ContainerID = NewType("ContainerID", str)
"""The runtime's container ID (``CNI_CONTAINERID``)."""

COMMANDS: tuple[str, ...] = ("ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION")
"""Every ``CNI_COMMAND`` of CNI spec 1.1.0."""

_BASE = ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH")

REQUIRED_ENV: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "ADD": _BASE,
        "CHECK": _BASE,
        "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),  # CNI_NETNS optional on DEL
        "GC": ("CNI_PATH",),
        "STATUS": ("CNI_PATH",),
        "VERSION": (),
    }
)
"""Variables each verb requires besides ``CNI_COMMAND`` (CNI spec 1.1.0 "Parameters")."""

KNOWN_ARGS: Mapping[str, str] = MappingProxyType(
    {
        "K8S_POD_NAMESPACE": "pod_namespace",
        "K8S_POD_NAME": "pod_name",
        "K8S_POD_INFRA_CONTAINER_ID": "pod_infra_container_id",
        "K8S_POD_UID": "pod_uid",
        "MAC": "mac",
    }
)
"""``CNI_ARGS`` keys with their own :class:`CniArgs` field (besides ``IgnoreUnknown``)."""

MAX_ARGS_BYTES = 4096
"""Largest ``CNI_ARGS`` accepted, in UTF-8 bytes (our limit; Kubernetes' values fit many times)."""

MAX_ARG_VALUE_BYTES = 1024
"""Largest single ``CNI_ARGS`` value accepted, in UTF-8 bytes (our limit)."""

_CONTAINER_ID_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")


def _utf8_len(value: str, what: str) -> int:
    """Length in UTF-8 bytes; env values decoded with surrogateescape fail here."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidEnvironmentError(f"invalid {what}: not valid UTF-8", str(exc)) from exc


def validate_container_id(container_id: str) -> ContainerID:
    """Return ``container_id`` if it matches ``^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$``.

    Source: CNI spec 1.1.0 "Parameters" (``CNI_CONTAINERID``).

    Raises:
        InvalidEnvironmentError: (code 4) empty or with other characters.
    """
    if not _CONTAINER_ID_RE.fullmatch(container_id):
        raise InvalidEnvironmentError(
            f"invalid CNI_CONTAINERID {container_id!r}",
            "must start with a letter or digit, followed by letters, digits, '_', '.' or '-'",
        )
    return ContainerID(container_id)


def validate_ifname(ifname: str) -> IfName:
    """Return ``ifname`` if it is a valid Linux interface name (``CNI_IFNAME``).

    The rule is :func:`cni_dra.iface.validate_ifname`'s, the one the netlink layer applies
    to the links it creates (CNI spec 1.1.0 "Parameters": not empty, at most 15 bytes, not
    ``.`` or ``..``, no ``/``, ``:`` or whitespace; and what else the kernel would not keep
    as sent: NUL, ``%``).

    Raises:
        InvalidEnvironmentError: (code 4) any rule broken; the message says which.
    """
    return iface.validate_ifname(ifname, var="CNI_IFNAME")


def validate_netns(netns: str) -> str:
    """Return ``netns`` if it is an absolute path.

    CNI spec 1.1.0 "Parameters" gives ``CNI_NETNS`` as a path such as
    ``/run/netns/[nsname]``. A relative path names whatever the plugin's working directory
    holds: an ADD and the DEL of the same attachment, run from different directories,
    would act on different namespaces (the DEL then leaves the pod's link behind). The
    path is stored as given and used again by DEL, GC and recovery, so it is refused here.

    Raises:
        InvalidEnvironmentError: (code 4) a relative path.
    """
    if not netns.startswith("/"):
        raise InvalidEnvironmentError(
            f"invalid CNI_NETNS {netns!r}: not an absolute path",
            "a relative path means another namespace from another working directory",
        )
    return netns


@dataclass(frozen=True)
class CniArgs:
    """Parsed ``CNI_ARGS`` (``KEY=VALUE;KEY=VALUE``).

    ``extra`` holds the keys that have no field here: the ``extra_known`` keys given to
    :func:`parse_cni_args`, and unknown keys accepted because of ``IgnoreUnknown``.
    Missing keys are ``None``.
    """

    ignore_unknown: bool = False
    pod_namespace: str | None = None
    pod_name: str | None = None
    pod_infra_container_id: str | None = None
    pod_uid: str | None = None
    mac: str | None = None
    extra: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)


def _parse_bool(key: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true"):
        return True
    if lowered in ("0", "false"):
        return False
    raise InvalidEnvironmentError(
        f"invalid CNI_ARGS: {key}={value!r} is not a boolean", "use 1, true, 0 or false"
    )


def parse_cni_args(raw: str, extra_known: Iterable[str] = ()) -> CniArgs:
    """Parse ``CNI_ARGS`` into :class:`CniArgs`.

    Rules (CNI spec 1.1.0 "Parameters"; libcni's ``LoadArgs`` for the details):

    * segments are separated by ``;``; empty segments are skipped;
    * each segment is split at its first ``=`` into key and value (the value may
      contain ``=`` and may be empty); a repeated key keeps its last value;
    * ``IgnoreUnknown`` is a boolean: ``1``/``true`` or ``0``/``false``, any case,
      and applies wherever it appears in the string;
    * known keys are :data:`KNOWN_ARGS` plus ``extra_known``.

    Limits (ours): the whole string at most :data:`MAX_ARGS_BYTES` UTF-8 bytes, each
    value at most :data:`MAX_ARG_VALUE_BYTES`.

    Raises:
        InvalidEnvironmentError: (code 4) invalid UTF-8, over a limit, a segment
            without ``=`` or with an empty key, or a non-boolean ``IgnoreUnknown``.
        UnsupportedFieldError: (code 2) unknown keys without ``IgnoreUnknown``; the
            message names them.
    """
    size = _utf8_len(raw, "CNI_ARGS")
    if size > MAX_ARGS_BYTES:
        raise InvalidEnvironmentError(f"invalid CNI_ARGS: {size} bytes, more than {MAX_ARGS_BYTES}")
    extra_known = frozenset(extra_known)
    pairs: dict[str, str] = {}
    for segment in raw.split(";"):
        if segment == "":
            continue
        key, sep, value = segment.partition("=")
        if not sep:
            raise InvalidEnvironmentError(f"invalid CNI_ARGS: segment {segment!r} has no '='")
        if not key:
            raise InvalidEnvironmentError(f"invalid CNI_ARGS: segment {segment!r} has an empty key")
        if len(value.encode("utf-8")) > MAX_ARG_VALUE_BYTES:
            raise InvalidEnvironmentError(
                f"invalid CNI_ARGS: value of {key} is longer than {MAX_ARG_VALUE_BYTES} bytes"
            )
        pairs.pop(key, None)  # keep insertion order of the last occurrence
        pairs[key] = value

    ignore_unknown = (
        _parse_bool("IgnoreUnknown", pairs.pop("IgnoreUnknown")) if "IgnoreUnknown" in pairs else False
    )
    fields: dict[str, str] = {}
    extra: dict[str, str] = {}
    unknown: list[str] = []
    for key, value in pairs.items():
        if key in KNOWN_ARGS:
            fields[KNOWN_ARGS[key]] = value
        elif key in extra_known:
            extra[key] = value
        else:
            unknown.append(key)
            extra[key] = value
    if unknown and not ignore_unknown:
        raise UnsupportedFieldError(
            f"unknown CNI_ARGS key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}",
            "set IgnoreUnknown=1 to ignore unknown keys",
        )
    return CniArgs(ignore_unknown=ignore_unknown, extra=MappingProxyType(extra), **fields)


@dataclass(frozen=True)
class CniEnv:
    """The validated CNI environment of one call.

    Variables a verb does not require are ``""`` when unset (``netns`` on DEL, all but
    ``path`` on GC and STATUS). ``path`` is ``CNI_PATH`` split on ``os.pathsep`` with
    empty entries dropped. ``raw`` is a read-only copy of the whole environment given
    (IPAM delegation passes it on).
    """

    command: str
    container_id: ContainerID = ContainerID("")
    netns: str = ""
    ifname: IfName = IfName("")
    path: tuple[str, ...] = ()
    args: CniArgs = field(default_factory=CniArgs)
    raw: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), compare=False, hash=False)


def parse_env(env: Mapping[str, str], extra_known_args: Iterable[str] = ()) -> CniEnv:
    """Read and validate the CNI variables of ``env`` (normally ``os.environ``).

    Checks, in order (CNI spec 1.1.0 "Parameters"):

    1. ``CNI_COMMAND`` is one of :data:`COMMANDS` (exact, upper case);
    2. every variable :data:`REQUIRED_ENV` lists for it is set and not empty (all
       missing ones are named together);
    3. for ADD, CHECK and DEL: the container ID and interface name rules
       (:func:`validate_container_id`, :func:`validate_ifname`), and ``CNI_NETNS``, when
       set, is an absolute path (:func:`validate_netns`);
    4. ``CNI_ARGS`` (:func:`parse_cni_args`, with ``extra_known_args``), except for
       VERSION, which reads nothing else.

    Raises:
        InvalidEnvironmentError: (code 4) missing/unknown ``CNI_COMMAND``, a missing
            required variable, an invalid container ID, interface name, netns path or
            ``CNI_ARGS``.
        UnsupportedFieldError: (code 2) unknown ``CNI_ARGS`` keys without ``IgnoreUnknown``.
    """
    command = env.get("CNI_COMMAND", "")
    if not command:
        raise InvalidEnvironmentError(
            "required env variable CNI_COMMAND missing", f"one of {', '.join(COMMANDS)}"
        )
    if command not in REQUIRED_ENV:
        raise InvalidEnvironmentError(f"unknown CNI_COMMAND {command!r}", f"one of {', '.join(COMMANDS)}")
    raw = MappingProxyType(dict(env))
    if command == "VERSION":
        return CniEnv(command=command, raw=raw)

    missing = [name for name in REQUIRED_ENV[command] if not env.get(name)]
    if missing:
        raise InvalidEnvironmentError(
            f"required env variable{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing for {command}"
        )

    container_id = ContainerID(env.get("CNI_CONTAINERID", ""))  # validated below where the verb requires it
    ifname = IfName(env.get("CNI_IFNAME", ""))
    netns = env.get("CNI_NETNS", "")
    if command in ("ADD", "CHECK", "DEL"):
        validate_container_id(container_id)
        validate_ifname(ifname)
        if netns:
            validate_netns(netns)
    path = tuple(p for p in env.get("CNI_PATH", "").split(os.pathsep) if p)
    return CniEnv(
        command=command,
        container_id=container_id,
        netns=netns,
        ifname=ifname,
        path=path,
        args=parse_cni_args(env.get("CNI_ARGS", ""), extra_known_args),
        raw=raw,
    )
