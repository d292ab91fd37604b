"""Tests for cni_dra.protocol.versions (CNI spec 1.1.0 "VERSION", verb gates)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_dra.errors import DecodeError, IncompatibleVersionError
from cni_dra.protocol.versions import (
    LATEST_VERSION,
    SUPPORTED_VERSIONS,
    check_supported,
    parse_version,
    require_verb_version,
    version_at_least,
    version_request,
    version_result,
)


def test_supported_versions_are_the_spec_releases() -> None:
    assert SUPPORTED_VERSIONS == ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
    assert LATEST_VERSION == "1.1.0"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.1.0", (1, 1, 0)),
        ("0.3.1", (0, 3, 1)),
        ("1", (1, 0, 0)),
        ("1.2", (1, 2, 0)),
        ("10.20.30", (10, 20, 30)),
    ],
)
def test_parse_version(text: str, expected: tuple[int, int, int]) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize(
    "junk",
    ["", "1.1.0.0", "v1.1.0", "1.x.0", " 1.1.0", "1.1.0\n", "-1.0.0", "1..0", "١.١.٠", None, 110, ["1.1.0"]],
)
def test_parse_version_rejects_junk_with_code_6(junk: object) -> None:
    with pytest.raises(DecodeError) as info:
        parse_version(junk)
    assert info.value.code == 6


@given(st.tuples(st.integers(0, 999), st.integers(0, 999), st.integers(0, 999)))
def test_parse_version_inverts_formatting(parts: tuple[int, int, int]) -> None:
    assert parse_version(".".join(map(str, parts))) == parts


@given(
    st.tuples(st.integers(0, 99), st.integers(0, 99), st.integers(0, 99)),
    st.tuples(st.integers(0, 99), st.integers(0, 99), st.integers(0, 99)),
)
def test_version_at_least_is_numeric_not_lexical(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    assert version_at_least(".".join(map(str, a)), ".".join(map(str, b))) == (a >= b)


def test_version_at_least_example_where_strings_mislead() -> None:
    assert version_at_least("0.10.0", "0.4.0")
    assert not version_at_least("0.4.0", "0.10.0")


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_check_supported_accepts_each(version: str) -> None:
    assert check_supported(version) == version


@pytest.mark.parametrize("version", ["1.1", "2.0.0", "0.5.0", "1.0.1"])
def test_check_supported_rejects_with_code_1_naming_supported(version: str) -> None:
    with pytest.raises(IncompatibleVersionError) as info:
        check_supported(version)
    assert info.value.code == 1
    assert version in info.value.msg
    assert "0.1.0" in info.value.details and "1.1.0" in info.value.details


def test_check_supported_rejects_junk_with_code_6() -> None:
    with pytest.raises(DecodeError):
        check_supported("latest")


@pytest.mark.parametrize(
    ("command", "version", "allowed"),
    [
        ("CHECK", "0.3.1", False),
        ("CHECK", "0.4.0", True),
        ("CHECK", "1.0.0", True),
        ("STATUS", "1.0.0", False),
        ("STATUS", "1.1.0", True),
        ("GC", "0.4.0", False),
        ("GC", "1.1.0", True),
        ("ADD", "0.1.0", True),
        ("DEL", "0.1.0", True),
        ("VERSION", "0.1.0", True),
    ],
)
def test_require_verb_version(command: str, version: str, allowed: bool) -> None:
    if allowed:
        require_verb_version(command, version)
    else:
        with pytest.raises(IncompatibleVersionError) as info:
            require_verb_version(command, version)
        assert info.value.code == 1
        assert command in info.value.msg


def test_require_verb_version_junk_version() -> None:
    with pytest.raises(DecodeError):
        require_verb_version("CHECK", "new")


@pytest.mark.parametrize(
    ("stdin", "expected"),
    [
        (b"", "1.1.0"),
        (b"  \n", "1.1.0"),
        (b"{}", "1.1.0"),
        (b'{"cniVersion": ""}', "1.1.0"),
        (b'{"cniVersion": "0.4.0"}', "0.4.0"),
        ('{"cniVersion": "1.0.0"}', "1.0.0"),
        (b'{"cniVersion": "9.9.9"}', "9.9.9"),
    ],
)
def test_version_request(stdin: bytes | str, expected: str) -> None:
    assert version_request(stdin) == expected


@pytest.mark.parametrize("stdin", [b"{", b"[]", b'"1.1.0"', b'{"cniVersion": 1}', b'{"cniVersion": "one"}'])
def test_version_request_rejects_bad_input_with_code_6(stdin: bytes) -> None:
    with pytest.raises(DecodeError):
        version_request(stdin)


def test_version_result_shape() -> None:
    assert version_result("1.0.0") == {
        "cniVersion": "1.0.0",
        "supportedVersions": ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
    }
    assert version_result()["cniVersion"] == "1.1.0"
