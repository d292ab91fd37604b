"""The token buckets cni-dra installs (tbf), and the bounds within which tbf holds what is asked.

Pure: no socket, no kernel call. :mod:`cni_dra.netlink.shaping` installs what this
describes; :mod:`cni_dra.attach.shaping_plan` checks a config against the same bounds first, to
name the key that asked.

:class:`Tbf` is one direction's bucket (rate, burst, queue limit), with the defaults of
:meth:`Tbf.for_rate`; :class:`ShapeSpec` is both directions of one interface.

**What tbf can hold.** tbf keeps the rate in bytes per second (32 bits) and the bucket as
the time it takes at that rate, in 64 ns scheduler ticks (32 bits; pyroute2 computes it
from whole microseconds); the largest packet it lets through is what the bucket holds, and
at most what the rate sends in 2³²−1 ns (about 4.29 s): a larger packet is dropped (or
segmented, when it is a GSO aggregate of smaller ones). So, on an interface of MTU ``m``
(a full frame: ``m`` + 14 bytes of Ethernet header):

* rate: at least :func:`min_rate_bps` (a full frame in 4.29 s of the rate: 2824 bit/s at
  MTU 1500), at most :data:`MAX_RATE_BPS` (about 34.4 Gbit/s);
* burst: at least :func:`min_burst_bytes` (a full frame, plus 2 µs of the rate that the
  rounding to whole microseconds may take off), at most :func:`max_burst_bytes` (what
  the rate sends in :data:`MAX_BUCKET_US`, about 274.9 s, and 2³²−1 bytes);
* queue limit: what the rate sends in the latency, plus the burst, at most 2³²−1 bytes.

Outside these the kernel refuses the bucket (``Invalid argument``), pyroute2 cannot encode
it, or the interface passes no full-size frame at all: :meth:`Tbf.for_rate` refuses such a
bucket with :class:`~cni_dra.errors.InvalidConfigError` (7) instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from cni_dra.errors import InvalidConfigError

__all__ = [
    "DEFAULT_LATENCY_S",
    "BURST_WINDOW_S",
    "MIN_BURST_BYTES",
    "MAX_RATE_BPS",
    "DEFAULT_MTU",
    "ETH_HLEN",
    "MAX_BUCKET_US",
    "PACKET_WINDOW_NS",
    "PSCHED_TICKS_PER_US",
    "Tbf",
    "ShapeSpec",
    "frame_bytes",
    "min_rate_bps",
    "min_burst_bytes",
    "max_burst_bytes",
    "default_burst_bytes",
    "burst_tolerance",
    "tbf_parameters",
    "burst_from_buffer",
    "psched_ticks_per_us",
]

DEFAULT_LATENCY_S = 0.025
"""Longest a packet may wait in a tbf queue by default (the reference bandwidth plugin's 25 ms)."""
BURST_WINDOW_S = 0.002
"""Default burst: the bytes the rate sends in this long (2 ms), at least :data:`MIN_BURST_BYTES`."""
MIN_BURST_BYTES = 2 * 65536
"""Default burst floor: two 64 KiB TSO/GRO packets (one must fit or tbf segments or drops it)."""
MAX_RATE_BPS = 8 * (2**32 - 1)
"""tbf's 32-bit rate field holds bytes per second: about 34.36 Gbit/s."""
DEFAULT_MTU = 1500
"""The MTU a :class:`ShapeSpec` is checked against when it names none (Ethernet's)."""
ETH_HLEN = 14
"""Ethernet header bytes that tbf counts in each frame beyond the MTU (macvlan, ipvlan, ifb)."""
PSCHED_TICKS_PER_US = 15.625
"""Packet scheduler ticks per microsecond: 64 ns ticks (``PSCHED_SHIFT`` 6, what
``/proc/net/psched`` reports, :func:`psched_ticks_per_us`)."""
MAX_BUCKET_US = 274_877_905
"""Longest bucket tbf holds, in microseconds of the rate: 2³²−1 ticks of 64 ns is
274 877 906.9 µs, less one microsecond for the rounding of the conversion."""
PACKET_WINDOW_NS = 4_290_000_000
"""The kernel sizes the largest packet tbf lets through from at most 2³²−1 ns of the bucket;
a full frame must fit in what the rate sends in this long (4.29 s, a little under that)."""
_MAX_MTU = 65536  # loopback's; Ethernet links stop at 65535
_ROUNDING_US = 2  # whole microseconds of the burst (pyroute2) and 64 ns ticks (the kernel)
_MAX_U32 = 2**32 - 1
_US_PER_S = 1_000_000


def _positive_int(value: object, what: str, maximum: int = _MAX_U32) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= maximum:
        raise InvalidConfigError(f"invalid shaping: {what} {value!r} is not an integer in [1, {maximum}]")
    return value


def frame_bytes(mtu: int) -> int:
    """The bytes tbf counts for a full-size frame on an interface of MTU ``mtu``."""
    return mtu + ETH_HLEN


def min_rate_bps(mtu: int) -> int:
    """The lowest rate (bit/s, whole bytes per second) at which tbf passes a full frame of an
    interface of MTU ``mtu``: the frame in :data:`PACKET_WINDOW_NS` of the rate."""
    return 8 * -(-frame_bytes(mtu) * 1_000_000_000 // PACKET_WINDOW_NS)


def min_burst_bytes(rate_bps: int, mtu: int) -> int:
    """The smallest burst that holds a full frame of MTU ``mtu`` once tbf has rounded it (a
    frame, plus 2 µs of ``rate_bps``)."""
    return frame_bytes(mtu) + -(-(rate_bps // 8) * _ROUNDING_US // _US_PER_S)


def max_burst_bytes(rate_bps: int) -> int:
    """The largest burst tbf holds at ``rate_bps``: :data:`MAX_BUCKET_US` of the rate, at most 2³²−1."""
    return min(_MAX_U32, (rate_bps // 8) * MAX_BUCKET_US // _US_PER_S)


def default_burst_bytes(rate_bps: int) -> int:
    """The burst of a bucket that names none: max(2 ms of the rate, 128 KiB) (:meth:`Tbf.for_rate`),
    at most :func:`max_burst_bytes` (below about 3.8 kbit/s, 128 KiB is more than tbf holds)."""
    rate_Bps = rate_bps // 8  # noqa: N806 - bytes, not bits
    return min(max(math.ceil(rate_Bps * BURST_WINDOW_S), MIN_BURST_BYTES), max_burst_bytes(rate_bps))


def burst_tolerance(rate_bps: int, burst_bytes: int) -> int:
    """How far the burst the kernel reports may be from ``burst_bytes`` asked at ``rate_bps``:
    the bucket travels as a time (whole microseconds, then 64 ns ticks), so up to 2 µs of
    the rate, plus 16 bytes or 0.1 % for the conversions back."""
    return max(16, burst_bytes // 1000) + -(-(rate_bps // 8) * _ROUNDING_US // _US_PER_S)


def _check_mtu(mtu: object) -> int:
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not 68 <= mtu <= _MAX_MTU:
        raise InvalidConfigError(f"invalid shaping: MTU {mtu!r} is not an integer in [68, {_MAX_MTU}]")
    return mtu


@dataclass(frozen=True)
class Tbf:
    """One token bucket: ``rate_bps`` (bits per second), ``burst_bytes`` (bucket size),
    ``limit_bytes`` (queue length). Built with :meth:`for_rate`; read back as the kernel holds it."""

    rate_bps: int
    burst_bytes: int
    limit_bytes: int

    @classmethod
    def for_rate(
        cls,
        rate_bps: int,
        burst_bytes: int | None = None,
        latency_s: float = DEFAULT_LATENCY_S,
        mtu: int = DEFAULT_MTU,
    ) -> Tbf:
        """A bucket for ``rate_bps`` on an interface of MTU ``mtu``, with the defaults below.

        * ``burst_bytes`` (None: :func:`default_burst_bytes`) = max(⌈rate_bps / 8 ×
          :data:`BURST_WINDOW_S`⌉, :data:`MIN_BURST_BYTES`), at most what tbf holds. The
          bucket must hold the largest packet the stack hands to the qdisc (a 64 KiB
          TSO/GRO aggregate, else tbf segments or drops it) and refill for longer than the
          timer's granularity, so that bulk TCP is not held below the rate; the larger the
          bucket, the more a sender may exceed the rate for one burst: at most
          ``burst_bytes`` once per idle period, under 1 % of 3 s at 100 Mbit/s.
        * ``limit_bytes`` = ⌈rate_bps / 8 × ``latency_s``⌉ + ``burst_bytes``, at most 2³²−1:
          the bytes that wait at most ``latency_s`` (default :data:`DEFAULT_LATENCY_S`,
          25 ms) behind a full bucket: the reference bandwidth plugin's choice, enough queue
          for TCP to keep the link busy without the delay of a deep buffer.

        ``rate_bps`` is rounded down to whole bytes per second (what tbf stores).

        Raises:
            InvalidConfigError: (7) a value of the wrong type, or outside what tbf holds
                (module docstring): ``invalid shaping: rate 1000 bit/s is below 2824 bit/s,
                the lowest at which tbf passes a full frame at MTU 1500 (1514 bytes in
                4.29 s of the rate)``.
        """
        rate_bps = _positive_int(rate_bps, "rate", MAX_RATE_BPS)
        mtu = _check_mtu(mtu)
        lowest = min_rate_bps(mtu)
        if rate_bps < lowest:
            raise InvalidConfigError(
                f"invalid shaping: rate {rate_bps} bit/s is below {lowest} bit/s, the lowest at which tbf passes "
                f"a full frame at MTU {mtu} ({frame_bytes(mtu)} bytes in {PACKET_WINDOW_NS / 1e9:.2f} s of the rate)"
            )
        rate_bps -= rate_bps % 8  # lowest is a whole number of bytes per second: still above it
        if burst_bytes is None:
            burst_bytes = default_burst_bytes(rate_bps)
        burst_bytes = _positive_int(burst_bytes, "burst")
        smallest, largest = min_burst_bytes(rate_bps, mtu), max_burst_bytes(rate_bps)
        if burst_bytes < smallest:
            raise InvalidConfigError(
                f"invalid shaping: burst {burst_bytes} bytes is below {smallest} bytes, the smallest bucket at "
                f"{rate_bps} bit/s and MTU {mtu} (a full frame of {frame_bytes(mtu)} bytes and 2 µs of the rate)"
            )
        if burst_bytes > largest:
            raise InvalidConfigError(
                f"invalid shaping: burst {burst_bytes} bytes is above {largest} bytes, the largest bucket tbf "
                f"holds at {rate_bps} bit/s"
            )
        if isinstance(latency_s, bool) or not isinstance(latency_s, (int, float)) or not 0 < latency_s <= 10:
            raise InvalidConfigError(f"invalid shaping: latency {latency_s!r} s is not in (0, 10]")
        limit_bytes = min(math.ceil(rate_bps // 8 * latency_s) + burst_bytes, _MAX_U32)
        return cls(rate_bps=rate_bps, burst_bytes=burst_bytes, limit_bytes=limit_bytes)


@dataclass(frozen=True)
class ShapeSpec:
    """What to shape: each direction's rate in bits per second (None: that direction unshaped),
    its burst in bytes (None: :meth:`Tbf.for_rate`'s default), the queue latency, and the MTU
    of the interface (the bounds of the rate and burst; the kernel's when it is applied).

    Egress is what the pod sends, ingress what it receives. Building one validates it and
    raises InvalidConfigError (7); :attr:`egress` / :attr:`ingress` are the resulting buckets.
    """

    egress_rate_bps: int | None = None
    egress_burst_bytes: int | None = None
    ingress_rate_bps: int | None = None
    ingress_burst_bytes: int | None = None
    latency_s: float = DEFAULT_LATENCY_S
    mtu: int = DEFAULT_MTU

    def __post_init__(self) -> None:
        for direction in ("egress", "ingress"):
            if (
                getattr(self, f"{direction}_rate_bps") is None
                and getattr(self, f"{direction}_burst_bytes") is not None
            ):
                raise InvalidConfigError(f"invalid shaping: {direction} burst without an {direction} rate")
        self.egress  # noqa: B018 - validates
        self.ingress  # noqa: B018

    @property
    def egress(self) -> Tbf | None:
        """The egress bucket, or None."""
        if self.egress_rate_bps is None:
            return None
        return Tbf.for_rate(self.egress_rate_bps, self.egress_burst_bytes, self.latency_s, self.mtu)

    @property
    def ingress(self) -> Tbf | None:
        """The ingress bucket, or None."""
        if self.ingress_rate_bps is None:
            return None
        return Tbf.for_rate(self.ingress_rate_bps, self.ingress_burst_bytes, self.latency_s, self.mtu)

    def at_mtu(self, mtu: int) -> ShapeSpec:
        """This spec for an interface of MTU ``mtu`` (the buckets are the same; the bounds are
        that MTU's). Raises InvalidConfigError (7) when a bucket does not fit it."""
        return self if mtu == self.mtu else replace(self, mtu=mtu)

    @classmethod
    def symmetric(cls, rate_bps: int, burst_bytes: int | None = None) -> ShapeSpec:
        """Both directions at ``rate_bps``."""
        return cls(
            egress_rate_bps=rate_bps,
            egress_burst_bytes=burst_bytes,
            ingress_rate_bps=rate_bps,
            ingress_burst_bytes=burst_bytes,
        )


def tbf_parameters(tbf: Tbf) -> dict[str, int]:
    """The tbf parameters of ``tbf`` as pyroute2's ``tc(..., "tbf", ...)`` takes them (rate in
    bytes per second); pyroute2 turns the burst into the bucket's time."""
    return {"rate": tbf.rate_bps // 8, "burst": tbf.burst_bytes, "limit": tbf.limit_bytes}


def burst_from_buffer(buffer_ticks: int, rate_bps: int, ticks_per_us: float) -> int:
    """The burst in bytes that a tbf ``buffer`` (its transmit time at ``rate_bps``, in
    scheduler ticks of ``ticks_per_us`` per microsecond) stands for, rounded to the nearest byte."""
    return round(buffer_ticks / ticks_per_us / _US_PER_S * rate_bps / 8)


def psched_ticks_per_us() -> float:
    """Packet scheduler ticks per microsecond (``/proc/net/psched``, as tc computes it)."""
    with open("/proc/net/psched", encoding="ascii") as f:
        t2us, us2t, clock_res, _ = (int(x, 16) for x in f.read().split())
    return t2us / us2t * (clock_res / _US_PER_S)
