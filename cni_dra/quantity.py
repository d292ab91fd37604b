"""Exact Kubernetes resource quantities (``k8s.io/apimachinery/pkg/api/resource.Quantity``).

A :class:`Quantity` holds its value as an integer number of nano-units (the finest
precision apimachinery keeps: ``ParseQuantity`` rounds anything finer *up*, away from
zero, to the next ``1n``) plus the *format* the string it came from was written in
(``DecimalSI``, ``BinarySI`` or ``DecimalExponent``). Arithmetic is exact integer
arithmetic; floats are never used or accepted.

Grammar (apimachinery ``quantity.go``; the OpenAPI pattern of ``resource.Quantity``)::

    <quantity>  ::= <sign>? <number> <suffix>?
    <number>    ::= <digits> | <digits> "." <digits>? | "." <digits>
    <suffix>    ::= Ki | Mi | Gi | Ti | Pi | Ei          (BinarySI, powers of 1024)
                  | n | u | m | "" | k | M | G | T | P | E   (DecimalSI, powers of 1000)
                  | (e | E) <sign>? <digits>              (DecimalExponent)

Canonical string (``Quantity.String()``/``CanonicalizeBytes``): ``0`` for zero;
BinarySI values that are integral and at least 1024 in magnitude print as
``<integer><binary suffix>`` with all factors of 1024 moved into the suffix (``1Gi``,
``1536Mi``); every other value prints as ``<integer><decimal suffix>`` with the
exponent the largest multiple of 3 that keeps the mantissa an integer (``4G``,
``10G``, ``1500M``, ``500m``), using ``e<exp>`` instead of an SI suffix for the
DecimalExponent format (``1e9``, ``1500e6``). ``a + b`` and ``a - b`` keep the format
of ``a`` unless ``a`` is zero, in which case they take the format of ``b``
(``Quantity.Add``/``Sub``).

Deviations, both outside anything a NIC inventory holds: exponents are limited to
``|e| <= 1000``, and values beyond the largest suffix (``E``/``Ei``) keep the largest
suffix with a larger mantissa instead of apimachinery's suffix-less output.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Annotated, Any, Literal

__all__ = ["Quantity", "QuantityField", "Format", "parse_quantity"]

Format = Literal["DecimalSI", "BinarySI", "DecimalExponent"]

_NANO = 10**9
_MAX_INT64 = 2**63 - 1
_MAX_EXPONENT = 1000

# Suffix → (base, exponent). DecimalSI exponents are powers of ten, BinarySI powers of two.
_DECIMAL_SUFFIXES: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SUFFIXES: dict[str, int] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_BY_EXP = {exp: suf for suf, exp in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_EXP = {exp // 10: suf for suf, exp in _BINARY_SUFFIXES.items()}

_QUANTITY_RE = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]*)(?:\.(?P<frac>[0-9]*))?(?P<suffix>[A-Za-z][A-Za-z0-9+-]*)?",
    re.ASCII,
)
_EXPONENT_RE = re.compile(r"[eE](?P<exp>[+-]?[0-9]+)", re.ASCII)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Quantity:
    """An immutable, hashable, totally ordered Kubernetes quantity.

    Equality, ordering and hashing use the value only (``1Gi == 1073741824``), never
    the format. ``str()`` gives the canonical Kubernetes string. Build one with
    :meth:`parse`, :meth:`from_int` or :meth:`from_nanos`.
    """

    __slots__ = ("_nanos", "_format")

    ZERO: Quantity  # set below the class body

    _nanos: int
    _format: Format

    def __init__(self, nanos: int, format: Format = "DecimalSI") -> None:  # noqa: A002
        if not isinstance(nanos, int) or isinstance(nanos, bool):
            raise ValueError(f"Quantity nanos must be an int, got {type(nanos).__name__}")
        if format not in ("DecimalSI", "BinarySI", "DecimalExponent"):
            raise ValueError(f"unknown quantity format {format!r}")
        object.__setattr__(self, "_nanos", nanos)
        object.__setattr__(self, "_format", format)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Quantity is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Quantity, (self._nanos, self._format))

    # -- construction -------------------------------------------------------------

    @classmethod
    def from_nanos(cls, nanos: int, format: Format = "DecimalSI") -> Quantity:  # noqa: A002
        """The quantity ``nanos × 10⁻⁹`` in ``format``."""
        return cls(nanos, format)

    @classmethod
    def from_int(cls, value: int, format: Format = "DecimalSI") -> Quantity:  # noqa: A002
        """An integer quantity, like apimachinery's ``NewQuantity(value, format)``."""
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"expected an int, got {type(value).__name__}")
        return cls(value * _NANO, format)

    @classmethod
    def parse(cls, v: str | int | Quantity) -> Quantity:
        """Parse a Kubernetes quantity string (or an int, or return a Quantity as is).

        Accepts every form of apimachinery's ``ParseQuantity``: decimal SI suffixes
        ``n u m k M G T P E``, binary SI ``Ki Mi Gi Ti Pi Ei``, decimal exponents
        ``1e9``/``1E-3``, a leading ``+``/``-``, fractions (``1.5G``, ``.5``, ``1.``).
        Surrounding whitespace is ignored, as apimachinery's JSON decoding does.
        Values finer than ``1n`` round up (away from zero) to the next nano-unit; a
        BinarySI value above 2⁶³-1 is capped there, as apimachinery does. Ints are
        taken as DecimalSI, like ``NewQuantity(v, DecimalSI)``.

        Raises ``ValueError`` naming the input and what is wrong with it (bools,
        floats and other types included).
        """
        if isinstance(v, Quantity):
            return v
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise ValueError(
                f"invalid quantity {v!r}: expected a string or an integer, got {type(v).__name__}"
            )
        if isinstance(v, int):
            return cls.from_int(v)
        return _parse_string(v)

    # -- accessors ------------------------------------------------------------------

    @property
    def nanos(self) -> int:
        """The exact value in nano-units (``Quantity('1')`` has 10⁹)."""
        return self._nanos

    @property
    def format(self) -> Format:
        """The apimachinery format: ``DecimalSI``, ``BinarySI`` or ``DecimalExponent``."""
        return self._format

    def as_fraction(self) -> Fraction:
        """The exact value as a :class:`fractions.Fraction`."""
        return Fraction(self._nanos, _NANO)

    def value(self) -> int:
        """The value rounded up (away from zero) to an integer, like apimachinery ``Value()``."""
        sign = -1 if self._nanos < 0 else 1
        return sign * _ceil_div(abs(self._nanos), _NANO)

    def milli_value(self) -> int:
        """The value in milli-units rounded up (away from zero), like ``MilliValue()``."""
        sign = -1 if self._nanos < 0 else 1
        return sign * _ceil_div(abs(self._nanos), 10**6)

    def is_zero(self) -> bool:
        return self._nanos == 0

    def sign(self) -> int:
        """-1, 0 or 1."""
        return (self._nanos > 0) - (self._nanos < 0)

    def with_format(self, format: Format) -> Quantity:  # noqa: A002
        """The same value in another format."""
        return Quantity(self._nanos, format)

    # -- arithmetic -----------------------------------------------------------------

    def __add__(self, other: object) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        fmt = other._format if self._nanos == 0 else self._format
        return Quantity(self._nanos + other._nanos, fmt)

    def __sub__(self, other: object) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        fmt = other._format if self._nanos == 0 else self._format
        return Quantity(self._nanos - other._nanos, fmt)

    def __neg__(self) -> Quantity:
        return Quantity(-self._nanos, self._format)

    def __abs__(self) -> Quantity:
        return Quantity(abs(self._nanos), self._format)

    def __mul__(self, other: object) -> Quantity:
        if isinstance(other, bool) or not isinstance(other, int):
            return NotImplemented
        return Quantity(self._nanos * other, self._format)

    __rmul__ = __mul__

    def __bool__(self) -> bool:
        return self._nanos != 0

    # -- comparison -----------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self._nanos == other._nanos
        return NotImplemented

    def __hash__(self) -> int:
        return hash(("Quantity", self._nanos))

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._nanos < other._nanos

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._nanos <= other._nanos

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._nanos > other._nanos

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._nanos >= other._nanos

    # -- formatting -----------------------------------------------------------------

    def __str__(self) -> str:
        return _canonical(self._nanos, self._format)

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"

    # -- pydantic -------------------------------------------------------------------

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(
            cls.parse,
            serialization=core_schema.plain_serializer_function_ser_schema(
                str, return_schema=core_schema.str_schema()
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        return {
            "anyOf": [{"type": "string"}, {"type": "integer"}],
            "description": "Kubernetes resource quantity, e.g. 10G, 500m, 1Gi",
        }


Quantity.ZERO = Quantity(0, "DecimalSI")

#: Pydantic v2 field type: validates from ``str``/``int``/:class:`Quantity` via
#: :meth:`Quantity.parse`, serialises (python and JSON mode) as the canonical string.
QuantityField = Annotated[Quantity, "kubernetes-quantity"]


def parse_quantity(v: str | int | Quantity) -> Quantity:
    """Function form of :meth:`Quantity.parse`. Raises ``ValueError``."""
    return Quantity.parse(v)


def _parse_string(text: str) -> Quantity:
    s = text.strip()
    if not s:
        raise ValueError(f"invalid quantity {text!r}: empty string")
    m = _QUANTITY_RE.fullmatch(s)
    if m is None:
        raise ValueError(
            f"invalid quantity {text!r}: expected <sign><number><suffix>, e.g. 10G, 1.5Gi, 500m, 1e9"
        )
    num, frac, suffix = m.group("num"), m.group("frac") or "", m.group("suffix") or ""
    if not num and not frac:
        raise ValueError(f"invalid quantity {text!r}: no digits")
    negative = m.group("sign") == "-"

    fmt: Format
    numerator = int(num + frac or "0")
    denominator = 10 ** len(frac)
    if suffix in _BINARY_SUFFIXES:
        fmt = "BinarySI"
        numerator <<= _BINARY_SUFFIXES[suffix]
    elif suffix in _DECIMAL_SUFFIXES:
        fmt = "DecimalSI"
        exp = _DECIMAL_SUFFIXES[suffix]
        if exp >= 0:
            numerator *= 10**exp
        else:
            denominator *= 10**-exp
    else:
        em = _EXPONENT_RE.fullmatch(suffix)
        if em is None:
            raise ValueError(
                f"invalid quantity {text!r}: unknown suffix {suffix!r} "
                "(use n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or e<exponent>)"
            )
        exp = int(em.group("exp"))
        if abs(exp) > _MAX_EXPONENT:
            raise ValueError(f"invalid quantity {text!r}: exponent {exp} out of range ±{_MAX_EXPONENT}")
        fmt = "DecimalExponent"
        if exp >= 0:
            numerator *= 10**exp
        else:
            denominator *= 10**-exp

    # Magnitude rounded up to whole nano-units (apimachinery: Round(Nano, RoundUp)).
    nanos = _ceil_div(numerator * _NANO, denominator)
    if fmt == "BinarySI":
        if nanos > _MAX_INT64 * _NANO:
            nanos = _MAX_INT64 * _NANO
        if 0 < nanos < _NANO:
            fmt = "DecimalSI"
    return Quantity(-nanos if negative else nanos, fmt)


def _remove_factors(value: int, base: int) -> tuple[int, int]:
    times = 0
    while value != 0 and value % base == 0:
        value //= base
        times += 1
    return value, times


def _canonical(nanos: int, fmt: Format) -> str:
    if nanos == 0:
        return "0"
    if fmt == "BinarySI" and abs(nanos) >= 1024 * _NANO and nanos % _NANO == 0:
        mantissa, exp = _remove_factors(nanos // _NANO, 1024)
        if exp > 6:
            mantissa, exp = mantissa * 1024 ** (exp - 6), 6
        return f"{mantissa}{_BINARY_BY_EXP[exp] if exp else ''}"
    # Decimal: mantissa × 10^exp with the exponent a multiple of 3.
    mantissa, times = _remove_factors(nanos, 10)
    exp = times - 9
    while exp % 3:
        mantissa *= 10
        exp -= 1
    if fmt == "DecimalExponent":
        return f"{mantissa}e{exp}" if exp else str(mantissa)
    if exp > 18:
        mantissa, exp = mantissa * 10 ** (exp - 18), 18
    return f"{mantissa}{_DECIMAL_BY_EXP[exp]}"
