"""The pure parts of cni_dra.netlink.shaping: bucket defaults, spec validation and the bounds
within which tbf holds a bucket as asked, ifb names, tick arithmetic."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings
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
from cni_dra.netlink.tbf import max_burst_bytes, min_burst_bytes, min_rate_bps
from tests.tbf_model import as_the_kernel_holds_it, holds_as_asked

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
    assert Tbf.for_rate(100_001).rate_bps == 100_000


@given(st.integers(min_value=2824, max_value=MAX_RATE_BPS))
def test_bucket_formula_holds_for_every_rate(rate_bps: int) -> None:
    tbf = Tbf.for_rate(rate_bps)
    rate_Bps = rate_bps // 8  # noqa: N806
    # 128 KiB is more than tbf holds below about 3.8 kbit/s: then the longest bucket it holds
    assert tbf.burst_bytes == min(
        max(math.ceil(rate_Bps * BURST_WINDOW_S), MIN_BURST_BYTES), rate_Bps * 274_877_905 // 1_000_000
    )
    assert tbf.limit_bytes == min(math.ceil(rate_Bps * DEFAULT_LATENCY_S) + tbf.burst_bytes, 2**32 - 1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rate_bps": 0}, "rate 0 is not an integer"),
        ({"rate_bps": -5}, "rate -5"),
        ({"rate_bps": 7}, "rate 7 bit/s is below 2824 bit/s"),
        (
            {"rate_bps": 2823},
            "rate 2823 bit/s is below 2824 bit/s, the lowest at which tbf passes a full frame "
            "at MTU 1500 \\(1514 bytes in 4.29 s of the rate\\)",
        ),
        ({"rate_bps": 16_000, "mtu": 9000}, "below 16816 bit/s, .* at MTU 9000 \\(9014 bytes"),
        (
            {"rate_bps": 300 * M, "burst_bytes": 1588},
            "burst 1588 bytes is below 1589 bytes, the smallest bucket",
        ),
        (
            {"rate_bps": 100 * M, "burst_bytes": 3_435_973_813},
            "burst 3435973813 bytes is above 3435973812 bytes, the largest bucket tbf holds at 100000000 bit/s",
        ),
        ({"rate_bps": M, "mtu": 67}, "MTU 67"),
        ({"rate_bps": MAX_RATE_BPS + 1}, "rate"),
        ({"rate_bps": True}, "rate True"),
        ({"rate_bps": 1.5e6}, "rate 1500000.0"),
        ({"rate_bps": M, "burst_bytes": 0}, "burst 0"),
        ({"rate_bps": M, "burst_bytes": 2**32}, "burst"),
        ({"rate_bps": M, "latency_s": 0}, "latency 0"),
        ({"rate_bps": M, "latency_s": 11}, "latency 11"),
    ],
)
def test_invalid_buckets_are_config_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidConfigError, match=match) as err:
        Tbf.for_rate(**kwargs)
    assert err.value.code == 7


_MTUS = st.sampled_from([68, 1500, 9000, 65535, 65536]) | st.integers(min_value=68, max_value=65536)
_RATES = (
    st.integers(min_value=0, max_value=2**40)
    | st.integers(min_value=2700, max_value=3000)
    | st.integers(min_value=MAX_RATE_BPS - 64, max_value=MAX_RATE_BPS + 64)
)
_BURSTS = (
    st.none()
    | st.integers(min_value=-1, max_value=2**34)
    | st.integers(min_value=0, max_value=70_000)
    | st.integers(min_value=2**32 - 64, max_value=2**32 + 64)
)


@settings(max_examples=300, deadline=None)  # (the first example imports pyroute2)
@given(_RATES, _BURSTS, _MTUS, st.floats(min_value=0.001, max_value=10))
def test_a_bucket_is_held_as_asked_or_refused_with_code_7(
    rate_bps: int, burst: int | None, mtu: int, latency_s: float
) -> None:
    """Whatever the rate, burst and MTU: the kernel holds the bucket as asked and passes a full
    frame, or Tbf.for_rate refuses it with code 7; pyroute2 never fails to encode it."""
    try:
        tbf = Tbf.for_rate(rate_bps, burst, latency_s, mtu)
    except InvalidConfigError as exc:
        assert exc.code == 7 and exc.msg.startswith("invalid shaping: ")
        return
    assert holds_as_asked(tbf, mtu)
    assert burst is None or tbf.burst_bytes == burst
    assert tbf.rate_bps == rate_bps // 8 * 8


@settings(max_examples=200, deadline=None)
@given(st.data(), _MTUS)
def test_every_bucket_inside_the_bounds_is_accepted(data: st.DataObject, mtu: int) -> None:
    rate_bps = data.draw(
        st.integers(min_value=min_rate_bps(mtu), max_value=MAX_RATE_BPS)
        | st.sampled_from([min_rate_bps(mtu), MAX_RATE_BPS])
    )
    lo, hi = min_burst_bytes(rate_bps, mtu), max_burst_bytes(rate_bps)
    burst = data.draw(st.integers(min_value=lo, max_value=hi) | st.sampled_from([lo, hi]))
    assert holds_as_asked(Tbf.for_rate(rate_bps, burst, mtu=mtu), mtu)
    assert holds_as_asked(Tbf.for_rate(rate_bps, mtu=mtu), mtu)  # the default burst too


@pytest.mark.parametrize("mtu", [68, 1500, 9000, 65535])
@pytest.mark.parametrize("rate_bps", [None, 100 * M, 34_000 * M])
def test_the_bounds_are_the_kernels(mtu: int, rate_bps: int | None) -> None:
    """Just inside each bound the kernel passes a full frame; just outside it does not or
    pyroute2 cannot send it, and Tbf.for_rate refuses with code 7."""
    lowest = min_rate_bps(mtu)
    rate_bps = rate_bps or lowest
    assert holds_as_asked(Tbf.for_rate(rate_bps, min_burst_bytes(rate_bps, mtu), mtu=mtu), mtu)
    with pytest.raises(InvalidConfigError, match="the smallest bucket"):
        Tbf.for_rate(rate_bps, min_burst_bytes(rate_bps, mtu) - 1, mtu=mtu)
    with pytest.raises(InvalidConfigError, match="the lowest at which tbf passes a full frame"):
        Tbf.for_rate(lowest - 8, mtu=mtu)
    slow = Tbf.for_rate(lowest, mtu=mtu)  # at the lowest rate: what 2**32-1 ns of it sends holds a frame
    assert holds_as_asked(slow, mtu)
    assert (
        int(lowest * 0.998) // 8 * (2**32 - 1) // 10**9 < mtu + 14
    )  # the bound is within 0.2 % of the kernel
    top = max_burst_bytes(rate_bps)
    assert holds_as_asked(Tbf.for_rate(rate_bps, top, mtu=mtu), mtu)
    if top < 2**32 - 1:  # else 32 bits end the range first
        with pytest.raises(InvalidConfigError, match="the largest bucket tbf holds"):
            Tbf.for_rate(rate_bps, top + 1, mtu=mtu)
        with pytest.raises(struct.error):  # what ADD crashed on before
            # 274 877 907 µs of the rate: more than 2**32-1 ticks of 64 ns
            as_the_kernel_holds_it(
                Tbf(rate_bps // 8 * 8, -(-(rate_bps // 8) * 274_877_907 // 10**6) + 1, 2**32 - 1)
            )


def test_a_rate_below_4_kbit_s_has_a_bucket_the_kernel_holds() -> None:
    """The default 128 KiB bucket takes more than 2**32-1 ticks below about 3.8 kbit/s: the
    default is then the longest bucket tbf holds, and the queue limit stops at 2**32-1."""
    tbf = Tbf.for_rate(3000)
    assert tbf.burst_bytes == 375 * 274_877_905 // 1_000_000 < MIN_BURST_BYTES
    assert holds_as_asked(tbf, 1500)
    assert Tbf.for_rate(MAX_RATE_BPS, 2**32 - 1, latency_s=10).limit_bytes == 2**32 - 1


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
    with pytest.raises(InvalidEnvironmentError, match="not printable ASCII"):
        ifb_name("é" * 6)  # no interface of cni-dra's has such a name


@given(st.text(st.characters(min_codepoint=0x1F, max_codepoint=0x80), min_size=1, max_size=15))
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
        assert abs(burst_from_buffer(buffer, rate_bps, ticks_per_us) - burst) <= max(
            1, rate_bps / 8 / 15_625_000
        )
