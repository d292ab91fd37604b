"""The pure parts of cni_dra.netlink.shaping: bucket defaults, spec validation, ifb names, tick arithmetic."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_dra.errors import InvalidConfigError, InvalidEnvironmentError
from cni_dra.iface import validate_ifname
from cni_dra.netlink.shaping import (
    BURST_WINDOW_S,
    DEFAULT_LATENCY_S,
    MAX_RATE_BPS,
    MIN_BURST_BYTES,
    ShapeSpec,
    Tbf,
    burst_from_buffer,
    ifb_name,
)

M = 1_000_000


@pytest.mark.parametrize(
    ("rate_bps", "burst", "limit"),
    [
        # below 2 ms x rate = 128 KiB (about 524 Mbit/s) the floor holds
        (100 * M, 131_072, 12_500_000 * 25 // 1000 + 131_072),
        (300 * M, 131_072, 37_500_000 * 25 // 1000 + 131_072),
        # above, 2 ms of the rate
        (1000 * M, 250_000, 3_125_000 + 250_000),
        (10_000 * M, 2_500_000, 31_250_000 + 2_500_000),
    ],
)
def test_default_burst_and_limit(rate_bps: int, burst: int, limit: int) -> None:
    assert Tbf.for_rate(rate_bps) == Tbf(rate_bps=rate_bps, burst_bytes=burst, limit_bytes=limit)


def test_explicit_burst_and_latency_make_the_limit() -> None:
    assert Tbf.for_rate(80 * M, burst_bytes=50_000, latency_s=0.1) == Tbf(80 * M, 50_000, 1_000_000 + 50_000)


def test_rate_rounds_down_to_whole_bytes_per_second() -> None:
    assert Tbf.for_rate(1001).rate_bps == 1000


@given(st.integers(min_value=8, max_value=MAX_RATE_BPS))
def test_bucket_formula_holds_for_every_rate(rate_bps: int) -> None:
    tbf = Tbf.for_rate(rate_bps)
    rate_Bps = rate_bps // 8  # noqa: N806
    assert tbf.burst_bytes == max(math.ceil(rate_Bps * BURST_WINDOW_S), MIN_BURST_BYTES)
    assert tbf.limit_bytes == math.ceil(rate_Bps * DEFAULT_LATENCY_S) + tbf.burst_bytes


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rate_bps": 0}, "rate 0 is not an integer"),
        ({"rate_bps": -5}, "rate -5"),
        ({"rate_bps": 7}, "below 8 bit/s"),
        ({"rate_bps": MAX_RATE_BPS + 1}, "rate"),
        ({"rate_bps": True}, "rate True"),
        ({"rate_bps": 1.5e6}, "rate 1500000.0"),
        ({"rate_bps": M, "burst_bytes": 0}, "burst 0"),
        ({"rate_bps": M, "burst_bytes": 2**32}, "burst"),
        ({"rate_bps": M, "latency_s": 0}, "latency 0"),
        ({"rate_bps": M, "latency_s": 11}, "latency 11"),
        ({"rate_bps": MAX_RATE_BPS, "latency_s": 10}, "queue limit"),
    ],
)
def test_invalid_buckets_are_config_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidConfigError, match=match) as err:
        Tbf.for_rate(**kwargs)
    assert err.value.code == 7


def test_spec_directions() -> None:
    spec = ShapeSpec(egress_rate_bps=100 * M, ingress_rate_bps=300 * M, ingress_burst_bytes=200_000)
    assert spec.egress == Tbf.for_rate(100 * M)
    assert spec.ingress == Tbf.for_rate(300 * M, 200_000)
    assert ShapeSpec().egress is None and ShapeSpec().ingress is None
    both = ShapeSpec.symmetric(50 * M, 64_000)
    assert both.egress == both.ingress == Tbf.for_rate(50 * M, 64_000)


def test_spec_is_validated_when_built() -> None:
    with pytest.raises(InvalidConfigError, match="ingress burst without an ingress rate"):
        ShapeSpec(ingress_burst_bytes=1000)
    with pytest.raises(InvalidConfigError, match="rate 0"):
        ShapeSpec(egress_rate_bps=0)
    with pytest.raises(InvalidConfigError, match="latency"):
        ShapeSpec(egress_rate_bps=M, latency_s=-1)


@pytest.mark.parametrize(
    ("ifname", "ifb"),
    [("eth0", "ifb-eth0"), ("net1", "ifb-net1"), ("a" * 11, "ifb-" + "a" * 11)],
)
def test_short_names_keep_the_interface_name(ifname: str, ifb: str) -> None:
    assert ifb_name(ifname) == ifb


def test_long_names_are_hashed_and_cannot_meet_the_short_form() -> None:
    long = ifb_name("a" * 12)
    assert len(long) == 15 and long.startswith("ifb") and long[3] != "-"
    assert long == ifb_name("a" * 12)  # deterministic
    assert ifb_name("a" * 12) != ifb_name("a" * 13)
    assert ifb_name("é" * 6) != "ifb-" + "é" * 6  # 12 bytes in UTF-8: too long for the short form
    assert len(ifb_name("é" * 6).encode()) <= 15


@given(st.text(st.characters(blacklist_characters="/:", blacklist_categories=("Cs", "Zs", "Cc")),
               min_size=1, max_size=15))
def test_every_valid_interface_has_a_valid_ifb_name(ifname: str) -> None:
    try:
        validate_ifname(ifname)
    except InvalidEnvironmentError:
        return
    name = ifb_name(ifname)
    assert len(name.encode()) <= 15 and name != ifname
    validate_ifname(name)


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 16, "."])
def test_invalid_interface_names_are_refused(bad: str) -> None:
    with pytest.raises(InvalidEnvironmentError):
        ifb_name(bad)


@pytest.mark.parametrize("rate_bps", [8, 100 * M, 300 * M, 10_000 * M])
def test_burst_reads_back_from_ticks(rate_bps: int) -> None:
    ticks_per_us = 15.625  # /proc/net/psched of a kernel with a 1 GHz clock source
    for burst in (1500, 131_072, 2_500_000):
        buffer = int(1_000_000 * burst / (rate_bps / 8) * ticks_per_us)  # what tc and pyroute2 store
        if buffer >= 2**32:
            continue
        assert abs(burst_from_buffer(buffer, rate_bps, ticks_per_us) - burst) <= max(1, rate_bps / 8 / 15_625_000)
