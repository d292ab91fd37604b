"""The state's operations: the only way the state changes, in memory and in the journal alike.

A transaction (:class:`cni_dra.state.txn.Txn`) makes each change as one of these typed
operations, applies it to the state at once (:func:`apply`) and keeps it; its commit
writes them, encoded (:func:`encode`), as one journal record. Replaying a record decodes
each op (:func:`decode`) and applies it with the same :func:`apply`, so what a process
holds after a commit and what any reader rebuilds from the files cannot differ.

Encoded form (one JSON object per op, in a record's ``ops`` list)::

    {"put": <attachment>}                        Put
    {"del": [network, containerID, ifname]}      Delete
    {"claims": "<pod UID>", "value": [...]|null} SetClaims
    {"statusUpdates": [...]}                     SetStatusUpdates
    {"bootID": "..."}                            SetBootID
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cni_dra.state import books
from cni_dra.state.frozen import FrozenDict, FrozenList, deep_freeze
from cni_dra.state.schema import Attachment, NodeState

__all__ = ["Put", "Delete", "SetClaims", "SetStatusUpdates", "SetBootID", "Op", "apply", "encode", "decode"]


@dataclass(frozen=True, slots=True)
class Put:
    """Record ``att``: it replaces the attachment with its key, in place, or goes last."""

    att: Attachment


@dataclass(frozen=True, slots=True)
class Delete:
    """Unlist the attachment with ``key`` (network, containerID, ifname); none: no change."""

    key: tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class SetClaims:
    """Set the prepared claims of pod ``pod_uid`` (None: the pod holds none)."""

    pod_uid: str
    claims: FrozenList[Any] | None


@dataclass(frozen=True, slots=True)
class SetStatusUpdates:
    """Set the pending ResourceClaim status records."""

    records: FrozenList[Any]


@dataclass(frozen=True, slots=True)
class SetBootID:
    """Set the boot id the state was last reconciled in."""

    boot: str | None


Op = Put | Delete | SetClaims | SetStatusUpdates | SetBootID


def apply(state: NodeState, op: Op) -> None:
    """Apply ``op`` to ``state``, in place: the one writer of a :class:`NodeState`."""
    if type(op) is Put:
        state.attachments._put(op.att)  # noqa: SLF001 - this is the one writer the mutators are kept for
        books.put(state, op.att)
    elif type(op) is Delete:
        state.attachments._drop(op.key)  # noqa: SLF001 - as above
        books.drop(state, op.key)
    elif type(op) is SetClaims:  # a new mapping: a read-only value is never changed once made
        claims = dict(state.claims)
        if op.claims is None:
            claims.pop(op.pod_uid, None)
        else:
            claims[op.pod_uid] = op.claims
        state.__dict__["claims"] = FrozenDict(claims)
        books.set_claims(state, op.pod_uid)
    elif type(op) is SetStatusUpdates:
        state.__dict__["statusUpdates"] = op.records
    elif type(op) is SetBootID:
        state.__dict__["bootID"] = op.boot
    else:  # pragma: no cover - Op is closed
        raise TypeError(f"not a state operation: {op!r}")


def encode(op: Op) -> bytes:
    """``op`` as it is written in a journal record (module docstring)."""
    if type(op) is Put:
        return b'{"put":' + op.att.model_dump_json(exclude_none=True).encode() + b"}"
    if type(op) is Delete:
        return b'{"del":' + json.dumps(list(op.key)).encode() + b"}"
    if type(op) is SetClaims:
        return json.dumps({"claims": op.pod_uid, "value": op.claims}, separators=(",", ":")).encode()
    if type(op) is SetStatusUpdates:
        return json.dumps({"statusUpdates": op.records}, separators=(",", ":")).encode()
    if type(op) is SetBootID:
        return json.dumps({"bootID": op.boot}).encode()
    raise TypeError(f"not a state operation: {op!r}")  # pragma: no cover - Op is closed


def decode(obj: dict[str, Any]) -> Op:
    """One op of a journal record. Raises ValueError (or pydantic's ValidationError) when
    it is malformed."""
    if "put" in obj:
        return Put(Attachment.model_validate(obj["put"]))
    if "del" in obj:
        key = obj["del"]
        if not (isinstance(key, list) and len(key) == 3 and all(isinstance(k, str) for k in key)):
            raise ValueError(f"malformed del op {key!r}")
        return Delete((key[0], key[1], key[2]))
    if "claims" in obj:
        value = obj["value"]
        if value is not None and not isinstance(value, list):
            raise ValueError("malformed claims op")
        return SetClaims(str(obj["claims"]), None if value is None else deep_freeze(value))
    if "statusUpdates" in obj:
        if not isinstance(obj["statusUpdates"], list):
            raise ValueError("malformed statusUpdates op")
        return SetStatusUpdates(deep_freeze(obj["statusUpdates"]))
    if "bootID" in obj:
        return SetBootID(obj["bootID"])
    raise ValueError(f"unknown op {sorted(obj)}")
