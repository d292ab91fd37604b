"""Temporary link names: the first is random and recorded by ADD, the retries are derived
from it, so everything a killed ADD can leave is known from its intent. Unprivileged."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_dra.netlink import sublink

TEMP_FORM = re.compile(r"cdra[0-9a-f]{10}")  # what the README promises: 14 bytes, fits IFNAMSIZ


@given(st.binary(min_size=5, max_size=5))
def test_the_names_tried_are_the_recorded_one_then_distinct_derived_ones(token):
    first = "cdra" + token.hex()
    names = sublink.temp_names(first)
    assert names[0] == first and len(names) == 8 and len(set(names)) == 8
    assert all(TEMP_FORM.fullmatch(n) and sublink.is_temp_name(n) for n in names)
    assert sublink.temp_names(first) == names  # derived, not drawn: recovery computes the same


def test_fresh_temporary_names_are_random():
    firsts = [sublink.temp_name() for _ in range(100)]
    assert len(set(firsts)) == 100 and all(TEMP_FORM.fullmatch(n) for n in firsts)
    assert len({n for f in firsts for n in sublink.temp_names(f)}) == 800


@pytest.mark.parametrize(
    "name", ["eth0", "cdra", "cdra0123456789a", "cdra012345678", "cdraABCDEF0123", "xcdra01234567"]
)
def test_other_names_are_not_temporary(name):
    assert not sublink.is_temp_name(name)
