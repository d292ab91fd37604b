"""Quantity: parsing, canonical strings (apimachinery resource.Quantity), arithmetic."""

from __future__ import annotations

import pickle
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from cni_dra.quantity import Quantity, QuantityField, parse_quantity

Q = Quantity.parse


@pytest.mark.parametrize(
    ("text", "canonical", "value", "fmt"),
    [
        ("4G", "4G", Fraction(4 * 10**9), "DecimalSI"),
        ("10G", "10G", Fraction(10**10), "DecimalSI"),
        ("0", "0", Fraction(0), "DecimalSI"),
        ("500m", "500m", Fraction(1, 2), "DecimalSI"),
        ("1Gi", "1Gi", Fraction(2**30), "BinarySI"),
        ("1500M", "1500M", Fraction(15 * 10**8), "DecimalSI"),
        ("1.5G", "1500M", Fraction(15 * 10**8), "DecimalSI"),
        ("1000", "1k", Fraction(1000), "DecimalSI"),
        ("1024", "1024", Fraction(1024), "DecimalSI"),
        ("1e9", "1e9", Fraction(10**9), "DecimalExponent"),
        ("1E3", "1e3", Fraction(1000), "DecimalExponent"),
        ("12e6", "12e6", Fraction(12 * 10**6), "DecimalExponent"),
        ("1.5e9", "1500e6", Fraction(15 * 10**8), "DecimalExponent"),
        ("1e-3", "1e-3", Fraction(1, 1000), "DecimalExponent"),
        ("1536Mi", "1536Mi", Fraction(1536 * 2**20), "BinarySI"),
        ("1.5Ki", "1536", Fraction(1536), "BinarySI"),
        ("1.1Ki", "1126400m", Fraction(11264, 10), "BinarySI"),
        ("0.5Gi", "512Mi", Fraction(2**29), "BinarySI"),
        ("0.5Ki", "512", Fraction(512), "BinarySI"),
        ("-1Gi", "-1Gi", Fraction(-(2**30)), "BinarySI"),
        ("-500m", "-500m", Fraction(-1, 2), "DecimalSI"),
        ("+2k", "2k", Fraction(2000), "DecimalSI"),
        (".5", "500m", Fraction(1, 2), "DecimalSI"),
        ("1.", "1", Fraction(1), "DecimalSI"),
        ("0.1", "100m", Fraction(1, 10), "DecimalSI"),
        ("100u", "100u", Fraction(1, 10**4), "DecimalSI"),
        ("1n", "1n", Fraction(1, 10**9), "DecimalSI"),
        ("1k", "1k", Fraction(1000), "DecimalSI"),
        ("1M", "1M", Fraction(10**6), "DecimalSI"),
        ("1T", "1T", Fraction(10**12), "DecimalSI"),
        ("1P", "1P", Fraction(10**15), "DecimalSI"),
        ("1E", "1E", Fraction(10**18), "DecimalSI"),
        ("1Ki", "1Ki", Fraction(1024), "BinarySI"),
        ("1Mi", "1Mi", Fraction(2**20), "BinarySI"),
        ("1Ti", "1Ti", Fraction(2**40), "BinarySI"),
        ("1Pi", "1Pi", Fraction(2**50), "BinarySI"),
        ("1Ei", "1Ei", Fraction(2**60), "BinarySI"),
        ("1024Ki", "1Mi", Fraction(2**20), "BinarySI"),
        ("-0", "0", Fraction(0), "DecimalSI"),
        ("007", "7", Fraction(7), "DecimalSI"),
        (" 10G ", "10G", Fraction(10**10), "DecimalSI"),
        # Finer than 1n rounds up, away from zero (apimachinery ParseQuantity).
        ("0.0000000001", "1n", Fraction(1, 10**9), "DecimalSI"),
        ("-1.5n", "-2n", Fraction(-2, 10**9), "DecimalSI"),
        # BinarySI is capped at 2^63-1 (apimachinery maxAllowed).
        ("8Ei", "9223372036854775807", Fraction(2**63 - 1), "BinarySI"),
    ],
)
def test_parse_and_canonical(text: str, canonical: str, value: Fraction, fmt: str) -> None:
    q = Q(text)
    assert str(q) == canonical
    assert q.as_fraction() == value
    assert q.format == fmt


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "   ",
        "-",
        "+",
        ".",
        "1K",
        "1 G",
        "abc",
        "1.5.5",
        "1e",
        "1e1.5",
        "1Gb",
        "G",
        "1Gi1",
        "--1",
        "1e99999",
        "٣",
    ],
)
def test_parse_rejects_bad_strings(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        Q(bad)


@pytest.mark.parametrize("bad", [1.5, True, None, b"1G", [1]])
def test_parse_rejects_other_types(bad: object) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        Q(bad)  # type: ignore[arg-type]


def test_parse_int_and_quantity() -> None:
    assert str(Q(1000)) == "1k"
    assert Q(5).as_fraction() == 5
    q = Q("1Gi")
    assert Q(q) is q
    assert parse_quantity("2k") == Q(2000)


def test_equality_ignores_format_and_hash_agrees() -> None:
    assert Q("1Gi") == Q("1073741824")
    assert Q("1G") == Q("1e9") == Q("1000M")
    assert hash(Q("1G")) == hash(Q("1e9"))
    assert len({Q("1G"), Q("1000M"), Q("1Gi")}) == 2
    assert Q("1G") != "1G"


def test_ordering() -> None:
    assert Q("999M") < Q("1G") <= Q("1G") < Q("1Gi")
    assert Q("1Gi") > Q("1G") >= Q("1e9")
    assert sorted([Q("1Gi"), Q("500m"), Q("-1"), Q("1G")]) == [Q("-1"), Q("500m"), Q("1G"), Q("1Gi")]
    with pytest.raises(TypeError):
        _ = Q("1") < 1  # type: ignore[operator]


def test_sum_keeps_left_format() -> None:
    assert str(Q("1Gi") + Q("1Gi")) == "2Gi"
    assert str(Q("1Gi") + Q("1G")) == "2073741824"
    assert str(Q("1G") + Q("1Gi")) == "2073741824"
    assert str(Q("1G") + Q("500M")) == "1500M"
    assert str(Q("4G") + Q("6G")) == "10G"
    assert str(Q("1e9") + Q("1G")) == "2e9"
    assert str(Q("2Gi") - Q("1Gi")) == "1Gi"
    assert str(Q("10G") - Q("7G")) == "3G"
    assert str(Q("1G") - Q("1G")) == "0"


def test_sum_with_zero_left_takes_right_format() -> None:
    assert str(Quantity.ZERO + Q("1Gi")) == "1Gi"
    assert str(Q("0") + Q("2Gi")) == "2Gi"
    assert str(Quantity.ZERO - Q("1Gi")) == "-1Gi"


def test_misc_arithmetic() -> None:
    assert str(-Q("1G")) == "-1G"
    assert str(Q("500m") * 3) == "1500m"
    assert str(3 * Q("1Gi")) == "3Gi"
    assert not Quantity.ZERO
    assert Q("1n")
    assert Q("1.5").value() == 2
    assert Q("-1.5").value() == -2
    assert Q("1.0001").milli_value() == 1001
    assert Q("1G").sign() == 1 and Q("-1").sign() == -1 and Quantity.ZERO.sign() == 0


def test_immutable_and_picklable() -> None:
    q = Q("1Gi")
    with pytest.raises(AttributeError):
        q._nanos = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(q)) == q
    assert str(pickle.loads(pickle.dumps(q))) == "1Gi"
    assert repr(q) == "Quantity('1Gi')"


class _Model(BaseModel):
    q: QuantityField
    opt: QuantityField | None = None


def test_pydantic_field() -> None:
    m = _Model.model_validate({"q": "1.5G", "opt": 7})
    assert m.q == Q("1500M")
    assert m.model_dump() == {"q": "1500M", "opt": "7"}
    assert m.model_dump_json() == '{"q":"1500M","opt":"7"}'
    assert _Model.model_validate_json('{"q": "1Gi"}').q.as_fraction() == 2**30
    with pytest.raises(ValidationError, match="invalid quantity"):
        _Model.model_validate({"q": "1K"})
    with pytest.raises(ValidationError, match="invalid quantity"):
        _Model.model_validate({"q": 1.5})


# -- properties -------------------------------------------------------------------------

_suffix = st.sampled_from(
    ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "e3", "e-2", "E6"]
)


@st.composite
def quantity_strings(draw: st.DrawFn) -> str:
    sign = draw(st.sampled_from(["", "+", "-"]))
    whole = draw(st.integers(min_value=0, max_value=10**12))
    frac = draw(st.one_of(st.just(""), st.from_regex(r"\.[0-9]{0,6}", fullmatch=True)))
    return f"{sign}{whole}{frac}{draw(_suffix)}"


@given(quantity_strings())
def test_canonical_string_round_trips(text: str) -> None:
    q = Q(text)
    again = Q(str(q))
    assert again == q
    assert str(again) == str(q)


@given(quantity_strings(), quantity_strings())
def test_add_sub_exact(a: str, b: str) -> None:
    qa, qb = Q(a), Q(b)
    assert (qa + qb).as_fraction() == qa.as_fraction() + qb.as_fraction()
    assert (qa + qb) - qb == qa
    assert (qa < qb) == (qa.as_fraction() < qb.as_fraction())


@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_ints_exact(n: int) -> None:
    assert Q(n).as_fraction() == n
    assert Q(str(n)).as_fraction() == n
