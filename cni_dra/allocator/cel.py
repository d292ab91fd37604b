"""CEL device selectors in the Kubernetes DRA environment (evaluation is pure).

A selector is a CEL expression over one variable, ``device``, shaped as the DRA CEL
environment shapes it (KEP-4381 "CEL environment"; KEP-5075 adds
``allowMultipleAllocations``):

* ``device.driver`` — the driver name (string);
* ``device.attributes["<domain>"].<name>`` — attribute values; names without a
  domain belong to the driver's domain (string, int, bool; versions are semver
  values);
* ``device.capacity["<domain>"].<name>`` — the capacity's total ``value`` (a
  quantity; not what remains);
* ``device.allowMultipleAllocations`` — bool.

Quantity functions (Kubernetes CEL quantity library): ``quantity("10G")``,
``isQuantity(s)``, and members ``q.compareTo(q2)``, ``q.isGreaterThan(q2)``,
``q.isLessThan(q2)``, ``q.add(q2|int)``, ``q.sub(q2|int)``, ``q.sign()``,
``q.isInteger()``, ``q.asInteger()``; semver: ``semver("1.2.3")``,
``isSemver(s)``, ``v.compareTo(v2)``, ``v.isGreaterThan(v2)``, ``v.isLessThan(v2)``,
``v.major()``, ``v.minor()``, ``v.patch()``.

Looking up an attribute the device lacks is a CEL runtime error, as upstream; guard
with ``"name" in device.attributes["domain"]``. A domain no attribute uses reads as
an empty map.

The CEL library (PyPI ``common-expression-language``, import name ``cel``) is
imported only when the first selector is compiled, so paths without selectors do not
pay for it. Compiled programs are cached per expression.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

from cni_dra.dra.objects import Device, split_qualified_name
from cni_dra.errors import InvalidConfigError
from cni_dra.quantity import Quantity

__all__ = ["compile_selector", "device_matches", "device_variable", "SELECTOR_ERROR_PREFIX"]

SELECTOR_ERROR_PREFIX = "CEL"

_Q = "__quantity_nanos__"
_V = "__semver__"
_DOMAIN_RE = re.compile(r"\.(?:attributes|capacity)\s*\[\s*[\"']([^\"']+)[\"']\s*\]")
_SEMVER_RE = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?",
    re.ASCII,
)


# -- value encodings ----------------------------------------------------------------------


def _q(q: Quantity) -> dict[str, str]:
    return {_Q: str(q.nanos)}


def _as_quantity(v: Any) -> Quantity:
    if isinstance(v, dict) and _Q in v:
        return Quantity.from_nanos(int(v[_Q]))
    if isinstance(v, int) and not isinstance(v, bool):
        return Quantity.from_int(v)
    raise ValueError(f"expected a quantity, got {v!r}")


def _semver_key(v: Any) -> tuple[Any, ...]:
    if not (isinstance(v, dict) and _V in v):
        raise ValueError(f"expected a semver value, got {v!r}")
    m = _SEMVER_RE.fullmatch(v[_V])
    if m is None:  # pragma: no cover - constructed values are validated
        raise ValueError(f"invalid semver {v[_V]!r}")
    major, minor, patch, pre = int(m[1]), int(m[2]), int(m[3]), m[4]
    if pre is None:
        pre_key: tuple[Any, ...] = (1,)
    else:
        parts = []
        for ident in pre.split("."):
            parts.append((0, int(ident), "") if ident.isdigit() else (1, 0, ident))
        pre_key = (0, tuple(parts))
    return (major, minor, patch, pre_key)


def _cmp(a: Any, b: Any) -> int:
    if isinstance(a, dict) and _V in a:
        va, vb = _semver_key(a), _semver_key(b)
        return (va > vb) - (va < vb)
    qa, qb = _as_quantity(a), _as_quantity(b)
    return (qa > qb) - (qa < qb)


def _quantity(s: str) -> dict[str, str]:
    return _q(Quantity.parse(s))


def _is_quantity(s: str) -> bool:
    try:
        Quantity.parse(s)
    except ValueError:
        return False
    return True


def _semver(s: str) -> dict[str, str]:
    if not isinstance(s, str) or _SEMVER_RE.fullmatch(s) is None:
        raise ValueError(f"invalid semver {s!r}")
    return {_V: s}


def _semver_part(i: int) -> Any:
    def part(v: Any) -> int:
        key = _semver_key(v)
        return int(key[i])

    return part


def _add(a: Any, b: Any) -> dict[str, str]:
    return _q(_as_quantity(a) + _as_quantity(b))


def _sub(a: Any, b: Any) -> dict[str, str]:
    return _q(_as_quantity(a) - _as_quantity(b))


def _as_integer(a: Any) -> int:
    q = _as_quantity(a)
    if q.nanos % 10**9:
        raise ValueError(f"quantity {q} is not an integer")
    return q.nanos // 10**9


_FUNCTIONS: dict[str, Any] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": lambda s: isinstance(s, str) and _SEMVER_RE.fullmatch(s) is not None,
    "compareTo": _cmp,
    "isGreaterThan": lambda a, b: _cmp(a, b) > 0,
    "isLessThan": lambda a, b: _cmp(a, b) < 0,
    "add": _add,
    "sub": _sub,
    "sign": lambda a: _as_quantity(a).sign(),
    "isInteger": lambda a: _as_quantity(a).nanos % 10**9 == 0,
    "asInteger": _as_integer,
    "major": _semver_part(0),
    "minor": _semver_part(1),
    "patch": _semver_part(2),
}


# -- compile & evaluate -------------------------------------------------------------------


class _Selector:
    __slots__ = ("expression", "program", "domains")

    def __init__(self, expression: str, program: Any, domains: frozenset[str]) -> None:
        self.expression = expression
        self.program = program
        self.domains = domains


@functools.lru_cache(maxsize=256)
def compile_selector(expression: str) -> _Selector:
    """Compile (once, cached) a CEL selector. Raises InvalidConfigError (code 7)."""
    import cel  # lazy: only configurations/claims with selectors load the CEL library

    try:
        program = cel.compile(expression)
    except ValueError as exc:
        raise InvalidConfigError(f"failed to compile CEL selector {expression!r}: {exc}", str(exc)) from exc
    return _Selector(expression, program, frozenset(_DOMAIN_RE.findall(expression)))


def device_variable(
    device: Device, driver: str, extra_domains: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The ``device`` CEL variable for ``device`` published by ``driver``."""
    attrs: dict[str, dict[str, Any]] = {d: {} for d in extra_domains}
    attrs.setdefault(driver, {})
    for name, attr in device.attributes.items():
        domain, ident = split_qualified_name(name)
        value: Any = attr.value if attr.version_value is None else {_V: attr.version_value}
        attrs.setdefault(domain or driver, {})
        if domain is None and ident in attrs[driver]:
            continue  # the driver-qualified spelling takes precedence
        attrs[domain or driver][ident] = value
    caps: dict[str, dict[str, Any]] = {d: {} for d in extra_domains}
    caps.setdefault(driver, {})
    for name, cap in device.capacity.items():
        domain, ident = split_qualified_name(name)
        caps.setdefault(domain or driver, {})
        if domain is None and ident in caps[driver]:
            continue
        caps[domain or driver][ident] = _q(cap.value)
    return {
        "driver": driver,
        "attributes": attrs,
        "capacity": caps,
        "allowMultipleAllocations": bool(device.allow_multiple_allocations),
    }


def device_matches(selectors: Sequence[str], device: Device, driver: str) -> bool:
    """True when every selector evaluates to true for ``device`` (empty → True).

    Raises InvalidConfigError (code 7) for a selector that does not compile, fails
    at run time (e.g. a missing attribute), or does not yield a bool; the message
    names the selector and the device.
    """
    if not selectors:
        return True
    import cel

    for expression in selectors:
        sel = compile_selector(expression)
        ctx = cel.Context(
            variables={"device": device_variable(device, driver, sel.domains)}, functions=_FUNCTIONS
        )
        try:
            result = sel.program.execute(ctx)
        except (KeyError, RuntimeError, ValueError, TypeError) as exc:
            why = f"no such key: {exc}" if isinstance(exc, KeyError) else str(exc)
            raise InvalidConfigError(
                f"failed to evaluate CEL selector {expression!r} on device {device.name}: {why}", why
            ) from exc
        if not isinstance(result, bool):
            raise InvalidConfigError(
                f"failed to evaluate CEL selector {expression!r} on device {device.name}: "
                f"result {result!r} is not a bool"
            )
        if not result:
            return False
    return True
