"""CNI specification versions: parsing, support checks, per-verb gates and VERSION.

Source: CNI spec 1.1.0, sections "CNI operations" (VERSION, CHECK, STATUS, GC) and
"Error" (code 1 "incompatible CNI version", code 6 "failed to decode content").

Facts followed (from the spec and libcni's ``pkg/skel`` / ``pkg/version``):

* a config version is supported only if it is *exactly* one of the listed strings;
* CHECK exists from 0.4.0 on, STATUS and GC from 1.1.0 on; a config of an older
  version asking for them gets code 1;
* VERSION reads ``{"cniVersion": X}`` on stdin and answers
  ``{"cniVersion": X, "supportedVersions": [...]}``; runtimes that send nothing get
  the newest version echoed.

Stdlib only: imported on every CNI call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from cni_dra.errors import DecodeError, IncompatibleVersionError

__all__ = [
    "SUPPORTED_VERSIONS",
    "LATEST_VERSION",
    "VERB_MIN_VERSION",
    "parse_version",
    "version_at_least",
    "check_supported",
    "require_verb_version",
    "version_request",
    "version_result",
]

SUPPORTED_VERSIONS: tuple[str, ...] = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
"""Every CNI spec version cni-dra accepts in a network config, oldest first."""

LATEST_VERSION: str = SUPPORTED_VERSIONS[-1]
"""The newest supported spec version; results are built in its schema."""

VERB_MIN_VERSION: Mapping[str, str] = {"CHECK": "0.4.0", "STATUS": "1.1.0", "GC": "1.1.0"}
"""The first spec version that defines each verb (verbs not listed exist in every version)."""

# One to three dot-separated ASCII decimal numbers, as libcni's ParseVersion accepts.
_VERSION_RE = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9}){0,2}")


def parse_version(version: object) -> tuple[int, int, int]:
    """Parse a CNI version string ``"MAJOR[.MINOR[.PATCH]]"`` into ``(major, minor, patch)``.

    Missing parts count as 0 (``"1"`` is ``(1, 0, 0)``), as libcni does. This only
    checks the syntax; use :func:`check_supported` to check that cni-dra speaks it.

    Raises:
        DecodeError: (code 6) ``version`` is not a string or not of that form
            (empty, non-numeric, more than three parts, signs, spaces).
    """
    if not isinstance(version, str) or not _VERSION_RE.fullmatch(version):
        raise DecodeError(
            f"failed to parse CNI version {version!r}", "expected MAJOR.MINOR.PATCH, e.g. 1.1.0"
        )
    parts = [int(p) for p in version.split(".")]
    parts += [0] * (3 - len(parts))
    return parts[0], parts[1], parts[2]


def version_at_least(version: str, minimum: str) -> bool:
    """Whether ``version`` >= ``minimum`` by numeric comparison.

    Raises:
        DecodeError: (code 6) either string is not a version (see :func:`parse_version`).
    """
    return parse_version(version) >= parse_version(minimum)


def check_supported(version: str) -> str:
    """Return ``version`` if it is one of :data:`SUPPORTED_VERSIONS`.

    Matching is on the exact string (CNI spec "Version"; libcni's reconciler does the
    same), so ``"1.1"`` is not ``"1.1.0"``.

    Raises:
        DecodeError: (code 6) ``version`` is not a version string.
        IncompatibleVersionError: (code 1) a well-formed version cni-dra does not
            support; ``details`` lists the supported versions.
    """
    parse_version(version)
    if version not in SUPPORTED_VERSIONS:
        raise IncompatibleVersionError(
            f"incompatible CNI version {version}",
            f"config is {version!r}, plugin supports {', '.join(SUPPORTED_VERSIONS)}",
        )
    return version


def require_verb_version(command: str, cni_version: str) -> None:
    """Check that ``command`` exists in spec version ``cni_version``.

    CHECK needs >= 0.4.0; STATUS and GC need >= 1.1.0 (CNI spec 1.1.0 "CNI operations";
    libcni's skel gates them the same way). Other verbs pass.

    Raises:
        DecodeError: (code 6) ``cni_version`` is not a version string.
        IncompatibleVersionError: (code 1) the config's version predates the verb.
    """
    minimum = VERB_MIN_VERSION.get(command)
    if minimum is None:
        return
    if not version_at_least(cni_version, minimum):
        raise IncompatibleVersionError(
            f"config version {cni_version} does not allow {command}",
            f"{command} needs cniVersion {minimum} or newer",
        )


def version_request(stdin: bytes | str) -> str:
    """The ``cniVersion`` a runtime sent on stdin with the VERSION verb.

    CNI spec 1.1.0 "VERSION": the input is ``{"cniVersion": X}``. Empty or
    whitespace-only stdin (runtimes before 1.0 send nothing), or an object without
    ``cniVersion``, gives :data:`LATEST_VERSION`. The version need not be supported:
    the answer lists what is.

    Raises:
        DecodeError: (code 6) stdin is not a JSON object, or ``cniVersion`` is not a
            version string.
    """
    text = stdin.decode("utf-8", "replace") if isinstance(stdin, bytes) else stdin
    if not text.strip():
        return LATEST_VERSION
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise DecodeError("failed to decode VERSION request", str(exc)) from exc
    except RecursionError as exc:  # nested deeper than the interpreter recurses
        raise DecodeError("failed to decode VERSION request: JSON nested too deeply", str(exc)) from exc
    if not isinstance(obj, dict):
        raise DecodeError("failed to decode VERSION request", "expected a JSON object")
    requested = obj.get("cniVersion")
    if requested is None or requested == "":
        return LATEST_VERSION
    parse_version(requested)
    return str(requested)


def version_result(cni_version: str = LATEST_VERSION) -> dict[str, object]:
    """The VERSION verb's output object.

    Shape (CNI spec 1.1.0 "VERSION"): ``{"cniVersion": cni_version,
    "supportedVersions": [every supported version, oldest first]}``; ``cni_version``
    is the one the runtime asked for (see :func:`version_request`). Raises nothing.
    """
    return {"cniVersion": cni_version, "supportedVersions": list(SUPPORTED_VERSIONS)}
