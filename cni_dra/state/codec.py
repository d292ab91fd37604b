"""The state's bytes: file names, the checksum seal, snapshot and journal record encoding.

A snapshot (``state.json``) is compact JSON whose last keys are ``"journal": {"id":
"<hex>", "seq": N}`` (the journal that continues it; absent in schema 1 and 2) and
``"checksum": "sha256:<hex>"``, the SHA-256 of the same bytes without the checksum key.
A journal record (one line of ``state.journal``) is ``{"j": "<journal id>", "seq": N,
"ops": [...], "checksum": "sha256:<hex>"}``; its ops are encoded by :mod:`cni_dra.state.ops`
(``put``, ``del``, ``claims``, ``statusUpdates``, ``bootID``). Older snapshot schemas are
migrated on decode (:func:`cni_dra.state.migrations.migrate`). No I/O here.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from pydantic import ValidationError

from cni_dra.errors import StateError
from cni_dra.state import ops
from cni_dra.state.migrations import migrate
from cni_dra.state.schema import SCHEMA_VERSION, NodeState

__all__ = [
    "STATE_FILE",
    "BACKUP_FILE",
    "JOURNAL_FILE",
    "LOCK_FILE",
    "REPAIR_HINT",
    "seal",
    "unseal",
    "encode_state",
    "decode_state",
    "decode_snapshot",
    "folded_from",
    "encode_record",
    "decode_record",
    "apply_records",
]

STATE_FILE = "state.json"
BACKUP_FILE = "state.json.bak"
JOURNAL_FILE = "state.journal"
LOCK_FILE = "state.lock"

_CHECKSUM_TAIL = re.compile(rb',"checksum":"sha256:([0-9a-f]{64})"\}\n?\Z')


def seal(body: bytes) -> bytes:
    """``body`` (a JSON object) with ``"checksum": "sha256:<hex of body>"`` as its last key, plus a newline."""
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + b',"checksum":"sha256:' + digest.encode() + b'"}\n'


def unseal(data: bytes) -> bytes | None:
    """The inverse of :func:`seal`: the body when ``data`` ends in its checksum, None when it
    has none. Raises ValueError when the checksum does not match."""
    m = _CHECKSUM_TAIL.search(data)
    if m is None:
        return None
    body = data[: m.start()] + b"}"
    if hashlib.sha256(body).hexdigest() != m.group(1).decode():
        raise ValueError("checksum mismatch")
    return body


def encode_state(
    state: NodeState,
    journal: tuple[str, int] | None = None,
    folded: tuple[str, int, list[bytes]] | None = None,
) -> bytes:
    """The snapshot bytes for ``state``: compact JSON ending in ``"checksum": "sha256:<hex>"``.

    ``journal``: (journal id, last seq folded in) when a journal continues this snapshot.
    ``folded`` (with ``journal``): (id, seq, lines of its last records) of the journal this
    snapshot folds (a compaction); written as the journal reference's ``from``, ``{"id",
    "seq", "ops": [the ops of each of those records]}`` (:func:`folded_from`)."""
    body = state.model_dump_json(exclude_none=True).encode()
    if journal is not None:
        ref = b'{"id":' + json.dumps(journal[0]).encode() + b',"seq":' + str(journal[1]).encode()
        if folded is not None:
            fid, fseq, lines = folded
            tail = b",".join(line[line.index(_OPS) + len(_OPS) : line.rindex(_SEAL)] for line in lines)
            ref += b',"from":{"id":' + json.dumps(fid).encode() + b',"seq":' + str(fseq).encode()
            ref += b',"ops":[' + tail + b"]}"
        body = body[:-1] + _JOURNAL + ref + b"}}"
    return seal(body)


_JOURNAL = b',"journal":'
_OPS = b',"ops":'
_SEAL = b',"checksum":'


def folded_from(data: bytes) -> tuple[str, int, list[list[Any]], str, int] | None:
    """What snapshot bytes ``data`` say they fold (:func:`encode_state`): (the folded
    journal's id, its last seq, the ops of its last records, in order, ending with that
    seq; the new journal's id, its seq); None when they fold none, or do not verify (their
    checksum, read whole: :func:`decode_state` says why)."""
    at = data.rfind(_JOURNAL)  # the snapshot's own: written last, and no JSON string holds it
    if at < 0 or b'"from":' not in data[at:]:
        return None
    try:
        body = unseal(data)
        ref = json.loads(body[at + len(_JOURNAL) : -1]) if body is not None else None
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(ref, dict) or not isinstance(ref.get("from"), dict):
        return None
    origin = ref["from"]
    fid, fseq, tail, jid, seq = (
        origin.get("id"),
        origin.get("seq"),
        origin.get("ops"),
        ref.get("id"),
        ref.get("seq"),
    )
    if not (
        isinstance(fid, str)
        and type(fseq) is int
        and isinstance(tail, list)
        and all(isinstance(r, list) for r in tail)
        and isinstance(jid, str)
        and type(seq) is int
    ):
        return None
    return fid, fseq, tail, jid, seq


#: What a corrupt snapshot's error says after its cause: the operator's next step (``state
#: repair``, which quotes the cause alone).
REPAIR_HINT = '; it is not treated as empty. Run `cni-dra state repair` (see README "Failure modes")'


def decode_state(data: bytes, source: str = STATE_FILE) -> NodeState:
    """Verify and decode snapshot bytes (migrating an older schema); the journal is not read.

    Raises StateError (5) naming ``source`` when the bytes are empty, truncated, not JSON,
    fail the checksum, lack a checksum (schema ≥ 2), or come from a newer schema.
    """
    return decode_snapshot(data, source)[0]


def decode_snapshot(data: bytes, source: str = STATE_FILE) -> tuple[NodeState, tuple[str, int] | None]:
    """:func:`decode_state` plus the snapshot's journal reference (id, seq), if any."""

    def corrupt(why: str, details: str = "") -> StateError:
        return StateError(
            f"failed to read state {source}: file is corrupt ({len(data)} bytes, {why}){REPAIR_HINT}", details
        )

    try:
        sealed = unseal(data)
    except ValueError:
        raise corrupt("checksum mismatch") from None
    body = data if sealed is None else sealed
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise corrupt("not valid JSON", str(exc)) from exc
    if not isinstance(obj, dict):
        raise corrupt("top level is not an object")
    version = obj.get("schemaVersion", 1)
    if sealed is None and version != 1:
        raise corrupt("checksum missing")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise StateError(
            f"failed to read state {source}: schemaVersion {version} is newer than this cni-dra ({SCHEMA_VERSION})"
        )
    jref = obj.pop("journal", None)
    journal: tuple[str, int] | None = None
    if jref is not None:
        if not (isinstance(jref, dict) and isinstance(jref.get("id"), str) and type(jref.get("seq")) is int):
            raise corrupt("journal reference is malformed")
        journal = (jref["id"], jref["seq"])
    try:
        return NodeState.model_validate(migrate(obj)), journal
    except (ValidationError, ValueError) as exc:
        raise corrupt("does not match the schema", str(exc)) from exc


def encode_record(jid: str | None, seq: int, ops: list[bytes]) -> bytes:
    """Journal record ``seq`` of journal ``jid`` holding the encoded ``ops``, sealed, one line."""
    head = b'{"j":' + json.dumps(jid).encode() + b',"seq":' + str(seq).encode() + b',"ops":['
    return seal(head + b",".join(ops) + b"]}")


def decode_record(line: bytes) -> dict[str, Any] | None:
    """One journal line, verified; None when torn, not JSON or failing its checksum."""
    try:
        body = unseal(line)
        obj = json.loads(body) if body is not None else None
    except (ValueError, UnicodeDecodeError):  # checksum mismatch, not JSON
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("ops"), list):
        return None
    return obj


def apply_records(state: NodeState, records: list[list[Any]]) -> None:
    """Apply the ops of journal records, in order, to ``state`` (ValueError/ValidationError
    when malformed), through :func:`cni_dra.state.ops.apply` as a transaction does. O(records)."""
    for record in records:
        for obj in record:
            if not isinstance(obj, dict):
                raise ValueError("an op is not an object")
            ops.apply(state, ops.decode(obj))
