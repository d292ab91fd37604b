"""Migrations of the state file from older ``schemaVersion`` s to :data:`cni_dra.state.schema.SCHEMA_VERSION`:
one function per version step, on the raw decoded object, before the model validates it.
No I/O here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cni_dra.state.schema import SCHEMA_VERSION

__all__ = ["MIGRATIONS", "migrate"]


def _v1_to_v2(obj: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 → 2: adds ``bootID`` (unknown: None) and per-attachment intents (none).

    Schema 1 had no checksum and allowed an attachment without ``consumedCapacity`` (or
    with ``null``): such a record keeps naming no amount, which every capacity sum reads
    as the whole device (:meth:`Attachment.charged`), never as zero.
    """
    out = dict(obj)
    out["schemaVersion"] = 2
    out.setdefault("bootID", None)
    atts = out.get("attachments")
    if isinstance(atts, list):
        out["attachments"] = [
            {k: v for k, v in a.items() if k != "consumedCapacity"}
            if isinstance(a, dict) and a.get("consumedCapacity", {}) is None
            else a
            for a in atts
        ]
    return out


def _v2_to_v3(obj: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 → 3: the state may continue in a journal (``state.journal``, named by the
    file's ``journal`` key, see :mod:`cni_dra.state.journal`); a schema-2 file has none."""
    out = dict(obj)
    out["schemaVersion"] = 3
    return out


def _v3_to_v4(obj: dict[str, Any]) -> dict[str, Any]:
    """Schema 3 → 4: an attachment's parent NIC is ``parent`` (it was ``ifName``, too close
    to the CNI ``ifname`` beside it). Journal ops of schema 3 still say ``ifName``: the
    model accepts both names on input."""
    out = dict(obj)
    out["schemaVersion"] = 4
    atts = out.get("attachments")
    if isinstance(atts, list):
        out["attachments"] = [
            {("parent" if k == "ifName" else k): v for k, v in a.items()} if isinstance(a, dict) else a
            for a in atts
        ]
    return out


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4}
"""``{from version: function(raw dict) -> raw dict of version + 1}``."""


def migrate(obj: dict[str, Any]) -> dict[str, Any]:
    """Bring a decoded state object of an older ``schemaVersion`` up to :data:`SCHEMA_VERSION`.

    A missing ``schemaVersion`` counts as 1. Raises ``ValueError`` for a version newer than
    this code or without a migration path.
    """
    version = obj.get("schemaVersion", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"schemaVersion {version!r} is not a positive integer")
    if version > SCHEMA_VERSION:
        raise ValueError(f"schemaVersion {version} is newer than this cni-dra ({SCHEMA_VERSION})")
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:  # pragma: no cover - every version has a step
            raise ValueError(f"no migration from schemaVersion {version}")
        obj = step(obj)
        version = obj["schemaVersion"]
    return obj
