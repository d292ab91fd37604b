"""What an attachment is shaped to, and how that is recorded and checked.

Pure functions over the network config, the attachment's consumed capacity and the
runtime's bandwidth request; the kernel work is :mod:`cni_dra.netlink.shaping`'s.

The rate of each direction (egress: what the pod sends; ingress: what it receives):

1. the consumed amount of the capacity that ``shaping`` names for it (``bandwidth`` for both
   by default; bits per second, rounded down to whole bits; a short name also matches the
   driver-qualified key and the reverse, as in a claim request); a zero amount, or an
   allocation that records none (a dedicated device, an old state): no allocation. A name
   the device has no capacity of is refused (it would leave the interface unshaped);
2. lowered (never raised) to the runtime's ``runtimeConfig.bandwidth`` rate of that
   direction when the ``bandwidth`` capability is declared and the rate is not 0; a
   direction with no allocation is shaped at the runtime's rate alone;
3. a direction with neither, or with a rate above what tbf holds
   (:data:`~cni_dra.netlink.tbf.MAX_RATE_BPS`, about 34.4 Gbit/s), is not shaped (logged).

The burst of a shaped direction is ``shaping.<direction>BurstBytes`` or the default for the
rate (:meth:`~cni_dra.netlink.tbf.Tbf.for_rate`), lowered (never raised) to the
runtime's burst (bits, rounded down to bytes; containerd sends 2**32-1 bits and CRI-O
about 4 GiB when a pod names only a rate: "no preference"). ``shaping: false`` shapes nothing,
the runtime's request included.

A rate or burst outside what tbf holds on the interface's MTU (:mod:`cni_dra.netlink.tbf`:
a rate of at least 2824 bit/s at MTU 1500, a burst of a full frame plus 2 µs of the rate up
to about 274.9 s of it) is refused with InvalidConfigError (7) naming the key it came from
and the bound: ``invalid shaping: ingress rate 1kbit/s (runtimeConfig.bandwidth.ingressRate)
is below 2824bit/s, ...``.

The record kept on the attachment (``Attachment.shaping``, see :func:`record`)::

    {"egress": {"rateBps": int, "burstBytes": int, "limitBytes": int},
     "ingress": {...}, "ifb": "<ifb device>"}

as ADD installed it, a direction that is not shaped (and ``ifb`` when ingress is not) left
out; CHECK compares the kernel with it (:func:`mismatch`: bursts within the rounding of
tbf's time-based bucket, and the ifb device up).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from cni_dra.allocator.capacity import resolve_capacity_key
from cni_dra.errors import InvalidConfigError
from cni_dra.netlink.shaping import ShapeInfo
from cni_dra.netlink.tbf import (
    DEFAULT_MTU,
    MAX_BUCKET_US,
    MAX_RATE_BPS,
    PACKET_WINDOW_NS,
    ShapeSpec,
    Tbf,
    burst_tolerance,
    default_burst_bytes,
    frame_bytes,
    max_burst_bytes,
    min_burst_bytes,
    min_rate_bps,
)
from cni_dra.protocol.config import DEFAULT_SHAPING_CAPACITY, RuntimeBandwidth, ShapingConfig
from cni_dra.quantity import Quantity

__all__ = ["DIRECTIONS", "shape_spec", "record", "mismatch"]

log = logging.getLogger("cni_dra.shaping")

DIRECTIONS = ("egress", "ingress")


def _capacity_key(conf: ShapingConfig, direction: str) -> str:
    """The config key that names ``direction``'s capacity, for messages."""
    if conf.ingressCapacity is not None or conf.egressCapacity is not None:
        return f"shaping.{direction}Capacity"
    return (
        "shaping.capacity"
        if conf.capacity is not None
        else f"shaping.capacity (default {DEFAULT_SHAPING_CAPACITY!r})"
    )


def _allocated(
    conf: ShapingConfig,
    direction: str,
    name: str | None,
    consumed: Mapping[str, Any],
    device: str,
    driver: str,
) -> tuple[int, str] | None:
    """(whole bits per second, where from) of capacity ``name`` in ``consumed``; None: no allocation.
    Raises InvalidConfigError (7) for a name the device has no capacity of."""
    if name is None or not consumed:
        return None
    key = resolve_capacity_key(consumed, name, driver)
    if key is None:
        raise InvalidConfigError(
            f"invalid shaping: {_capacity_key(conf, direction)} names capacity {name!r}, which device {device} "
            f"does not have (its capacities: {', '.join(sorted(consumed))}); name one of them, or set "
            '"shaping": false to leave the interface unshaped'
        )
    amount = Quantity.parse(consumed[key])
    if amount.sign() <= 0:
        return None
    return int(amount.as_fraction()), f"consumed capacity {key} of device {device}"


def _direction(
    direction: str,
    allocated: tuple[int, str] | None,
    conf_burst_bytes: int | None,
    runtime: RuntimeBandwidth | None,
    mtu: int,
) -> tuple[int | None, int | None]:
    """(rate in bit/s, burst in bytes or None for the default) of one direction; (None, None):
    unshaped. Raises InvalidConfigError (7) naming the key of a rate or burst tbf cannot hold."""
    runtime_rate = getattr(runtime, f"{direction}Rate") if runtime is not None else 0
    runtime_burst = getattr(runtime, f"{direction}Burst") if runtime is not None else 0
    asked = [allocated] if allocated is not None else []
    if runtime_rate:
        asked.append((runtime_rate, f"runtimeConfig.bandwidth.{direction}Rate"))
    if not asked:
        return None, None
    rate, rate_from = min(asked, key=lambda a: a[0])  # a tie: the allocation's
    if rate > MAX_RATE_BPS:
        log.warning(
            "%s not shaped: rate %d bit/s is above the %d bit/s tbf can hold", direction, rate, MAX_RATE_BPS
        )
        return None, None
    lowest = min_rate_bps(mtu)
    if rate < lowest:
        raise InvalidConfigError(
            f"invalid shaping: {direction} rate {_rate(rate)} ({rate_from}) is below {_rate(lowest)}, the lowest at "
            f"which tbf passes a full frame on an interface of MTU {mtu} ({frame_bytes(mtu)} bytes in "
            f"{PACKET_WINDOW_NS / 1e9:.2f} s of the rate)"
        )
    held = rate - rate % 8  # what tbf keeps: whole bytes per second
    burst, burst_from = conf_burst_bytes, f"shaping.{direction}BurstBytes {conf_burst_bytes}"
    if runtime_burst:
        burst = burst if burst is not None else default_burst_bytes(held)
        if runtime_burst // 8 < burst:
            burst = runtime_burst // 8
            burst_from = f"runtimeConfig.bandwidth.{direction}Burst {runtime_burst} bits ({burst} bytes)"
    if burst is not None:
        _check_burst(burst, burst_from, held, mtu)
    return rate, burst


def _check_burst(burst: int, burst_from: str, rate_bps: int, mtu: int) -> None:
    """Raise InvalidConfigError (7) naming ``burst_from`` when tbf cannot hold ``burst`` at ``rate_bps``."""
    smallest, largest = min_burst_bytes(rate_bps, mtu), max_burst_bytes(rate_bps)
    if burst < smallest:
        raise InvalidConfigError(
            f"invalid shaping: {burst_from} is below {smallest} bytes, the smallest bucket at "
            f"{_rate(rate_bps)} on an interface of MTU {mtu}: a full frame ({frame_bytes(mtu)} bytes) and the "
            "2 µs of the rate that tbf's rounding may take off"
        )
    if burst > largest:
        raise InvalidConfigError(
            f"invalid shaping: {burst_from} is above {largest} bytes, the largest bucket tbf "
            f"holds at {_rate(rate_bps)} ({MAX_BUCKET_US / 1e6:.1f} s of the rate, at most 2^32-1 bytes)"
        )


def shape_spec(
    conf: ShapingConfig | None,
    consumed: Mapping[str, Any],
    runtime: RuntimeBandwidth | None = None,
    *,
    mtu: int = DEFAULT_MTU,
    device: str = "of the attachment",
    driver: str = "",
) -> ShapeSpec | None:
    """The shaping of an attachment that consumed ``consumed`` (capacity name -> quantity, bits
    per second) of ``device`` (the driver ``driver``'s) under ``conf`` (None: shaping off),
    with the runtime's request ``runtime``, on an interface of MTU ``mtu``; None when no
    direction is shaped. Rules: module docstring.

    Raises InvalidConfigError (7) naming the config or runtime key: a capacity name the
    device lacks, a rate or burst that tbf cannot hold on that MTU.
    """
    if conf is None:
        return None
    names = dict(zip(DIRECTIONS, conf.capacities, strict=True))
    shape: dict[str, Any] = {}
    for direction in DIRECTIONS:
        allocated = _allocated(conf, direction, names[direction], consumed, device, driver)
        rate, burst = _direction(direction, allocated, getattr(conf, f"{direction}BurstBytes"), runtime, mtu)
        shape[f"{direction}_rate_bps"], shape[f"{direction}_burst_bytes"] = rate, burst
    if shape["egress_rate_bps"] is None and shape["ingress_rate_bps"] is None:
        return None
    return ShapeSpec(**shape, latency_s=conf.latencySeconds, mtu=mtu)


def _bucket(tbf: Tbf | None) -> dict[str, int] | None:
    if tbf is None:
        return None
    return {"rateBps": tbf.rate_bps, "burstBytes": tbf.burst_bytes, "limitBytes": tbf.limit_bytes}


def record(info: ShapeInfo) -> dict[str, Any]:
    """The record of ``info`` (what ADD installed) for ``Attachment.shaping``."""
    out: dict[str, Any] = {"egress": _bucket(info.egress), "ingress": _bucket(info.ingress), "ifb": info.ifb}
    return {k: v for k, v in out.items() if v is not None}


def _burst_close(got: int, want: int, rate_bps: int) -> bool:
    # tbf stores the burst as a time at the rate (whole microseconds, then ticks): some rounding
    return abs(got - want) <= burst_tolerance(rate_bps, want)


def mismatch(recorded: Mapping[str, Any], info: ShapeInfo | None) -> str | None:
    """How the kernel's shaping ``info`` (None: none at all) differs from the ``recorded`` one,
    in words, or None when it does not (rates and limits exact, bursts within rounding)."""
    for direction in DIRECTIONS:
        want = recorded.get(direction)
        if not want:
            continue
        got: Tbf | None = getattr(info, direction) if info is not None else None
        what = (
            "the root tbf qdisc"
            if direction == "egress"
            else f"the ingress redirect to {recorded.get('ifb')} and its tbf"
        )
        if got is None:
            return f"{direction} is not shaped ({what} is missing), expected {_rate(want['rateBps'])}"
        if got.rate_bps != want["rateBps"]:
            return f"{direction} rate is {_rate(got.rate_bps)}, expected {_rate(want['rateBps'])}"
        if got.limit_bytes != want["limitBytes"]:
            return f"{direction} queue limit is {got.limit_bytes} bytes, expected {want['limitBytes']}"
        if not _burst_close(got.burst_bytes, want["burstBytes"], want["rateBps"]):
            return f"{direction} burst is {got.burst_bytes} bytes, expected {want['burstBytes']}"
    if recorded.get("ingress") and info is not None and recorded.get("ifb"):
        if info.ifb != recorded["ifb"]:
            return f"ingress goes through {info.ifb}, expected {recorded['ifb']}"
        if info.ifb_up is False:
            return f"ingress goes through ifb device {info.ifb}, which is down (it drops every packet the pod receives)"
    return None


def _rate(bps: int) -> str:
    return f"{Quantity.from_int(bps)}bit/s"
