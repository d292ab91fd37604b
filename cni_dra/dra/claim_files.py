"""Reading ResourceClaims (and the simple consumed-capacity file) for ``cni-dra allocate``.

A claim file holds one resource.k8s.io/v1 ResourceClaim, or several as a YAML
multi-document stream or a JSON list / ``kind: List``; only the fields the
allocator uses are read (:mod:`cni_dra.dra.claims`).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter, ValidationError

from cni_dra.dra.claims import ResourceClaim
from cni_dra.errors import InvalidConfigError, IOFailureError
from cni_dra.quantity import Quantity, QuantityField

__all__ = ["parse_claim_objects", "load_claims", "parse_claims", "load_consumed", "parse_consumed"]

_CONSUMED = TypeAdapter(dict[str, dict[str, QuantityField]])


def _read(path: str, what: str) -> str:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise IOFailureError(f"failed to read {what} {path}: {exc.strerror or exc}", str(exc)) from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidConfigError(f"failed to load {what} {path}: not UTF-8 text", str(exc)) from exc


def _documents(text: str, source: str, what: str) -> list[Any]:
    stripped = text.lstrip()
    if source.endswith(".json") or stripped.startswith(("{", "[")):
        try:
            return [json.loads(text)]
        except json.JSONDecodeError as exc:
            raise InvalidConfigError(
                f"failed to load {what} {source}: invalid JSON: {exc}", str(exc)
            ) from exc
    import yaml  # lazy

    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise InvalidConfigError(f"failed to load {what} {source}: invalid YAML: {exc}", str(exc)) from exc


def parse_claim_objects(text: str, source: str = "<claim>") -> list[dict[str, Any]]:
    """The ResourceClaim objects of JSON or YAML text, as written (one claim, a JSON list,
    a ``kind: List``, or several YAML documents), each validated as a resource.k8s.io/v1
    ResourceClaim. Raises InvalidConfigError (code 7)."""
    claims = parse_claims(text, source)
    items = _items(text, source)
    return [item for item, _ in zip(items, claims, strict=True)]


def _items(text: str, source: str) -> list[Any]:
    items: list[Any] = []
    for doc in _documents(text, source, "claim"):
        if isinstance(doc, list):
            items.extend(doc)
        elif isinstance(doc, dict) and doc.get("kind") in ("List", "ResourceClaimList"):
            items.extend(doc.get("items") or [])
        else:
            items.append(doc)
    return items


def parse_claims(text: str, source: str = "<claim>") -> list[ResourceClaim]:
    """Parse ResourceClaims from JSON or YAML text. Raises InvalidConfigError (code 7)."""
    items = _items(text, source)
    if not items:
        raise InvalidConfigError(f"failed to load claim {source}: no ResourceClaim found")
    claims = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or item.get("kind", "ResourceClaim") != "ResourceClaim":
            raise InvalidConfigError(f"failed to load claim {source}: item #{i} is not a ResourceClaim")
        try:
            claims.append(ResourceClaim.model_validate(item))
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in err["loc"])
            msg = str(err["msg"]).removeprefix("Value error, ")
            raise InvalidConfigError(
                f"failed to load claim {source}: item #{i}: {where}: {msg}", str(exc)
            ) from exc
    return claims


def load_claims(path: str) -> list[ResourceClaim]:
    """Read the ResourceClaim(s) in ``path``.

    Raises IOFailureError (code 5) when unreadable, InvalidConfigError (code 7) when invalid.
    """
    return parse_claims(_read(path, "claim"), source=path)


def parse_consumed(text: str, source: str = "<consumed>") -> dict[str, dict[str, Quantity]]:
    """Parse ``{"<device>": {"<capacity>": "<quantity>"}}`` (JSON or YAML). Raises InvalidConfigError."""
    docs = _documents(text, source, "consumed-capacity file")
    data = docs[0] if docs else {}
    try:
        return _CONSUMED.validate_python(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise InvalidConfigError(
            f"failed to load consumed-capacity file {source}: {where}: {msg} "
            '(expected {"<device>": {"<capacity>": "<quantity>"}})',
            str(exc),
        ) from exc


def load_consumed(path: str) -> dict[str, dict[str, Quantity]]:
    """Read a ``--consumed`` file. Raises IOFailureError (5) or InvalidConfigError (7)."""
    return parse_consumed(_read(path, "consumed-capacity file"), source=path)
