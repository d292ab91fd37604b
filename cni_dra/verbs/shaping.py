"""What an attachment is shaped to, and how that is recorded and checked.

Pure functions over the network config, the attachment's consumed capacity and the
runtime's bandwidth request; the kernel work is :mod:`cni_dra.netlink.shaping`'s.

The rate of each direction (egress: what the pod sends; ingress: what it receives):

1. the consumed amount of the capacity that ``shaping`` names for it (``bandwidth`` for both
   by default; bits per second, rounded down to whole bits); none, or zero: no allocation;
2. lowered (never raised) to the runtime's ``runtimeConfig.bandwidth`` rate of that
   direction when the ``bandwidth`` capability is declared and the rate is not 0; a
   direction with no allocation is shaped at the runtime's rate alone;
3. a direction with neither, or with a rate above what tbf holds
   (:data:`~cni_dra.netlink.shaping.MAX_RATE_BPS`, about 34.4 Gbit/s), is not shaped.

The burst of a shaped direction is ``shaping.<direction>BurstBytes`` or the default for the
rate (:meth:`~cni_dra.netlink.shaping.Tbf.for_rate`), lowered (never raised) to the
runtime's burst (bits, rounded down to bytes; containerd sends 2**32-1 bits and CRI-O
about 4 GiB when a pod names only a rate: "no preference"). ``shaping: false`` shapes nothing,
the runtime's request included.

The record kept on the attachment (``Attachment.shaping``, see :func:`record`)::

    {"egress": {"rateBps": int, "burstBytes": int, "limitBytes": int},
     "ingress": {...}, "ifb": "<ifb device>"}

as ADD installed it, a direction that is not shaped (and ``ifb`` when ingress is not) left
out; CHECK compares the kernel with it (:func:`mismatch`: bursts within the rounding of
tbf's time-based bucket).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from cni_dra.netlink.shaping import MAX_RATE_BPS, ShapeInfo, ShapeSpec, Tbf
from cni_dra.protocol.config import RuntimeBandwidth, ShapingConfig
from cni_dra.quantity import Quantity

__all__ = ["DIRECTIONS", "shape_spec", "record", "mismatch"]

log = logging.getLogger("cni_dra.shaping")

DIRECTIONS = ("egress", "ingress")
_MIN_RATE_BPS = 8  # one byte per second: the smallest rate tbf stores


def _allocated_bps(consumed: Mapping[str, Any], name: str | None) -> int | None:
    """The consumed amount of capacity ``name`` in whole bits per second, or None."""
    if name is None or name not in consumed:
        return None
    amount = Quantity.parse(consumed[name])
    if amount.sign() <= 0:
        return None
    return max(int(amount.as_fraction()), _MIN_RATE_BPS)


def _direction(
    direction: str, allocated_bps: int | None, conf_burst_bytes: int | None, latency_s: float,
    runtime: RuntimeBandwidth | None,
) -> tuple[int | None, int | None]:
    """(rate in bit/s, burst in bytes or None for the default) of one direction; (None, None): unshaped."""
    runtime_rate = getattr(runtime, f"{direction}Rate") if runtime is not None else 0
    runtime_burst = getattr(runtime, f"{direction}Burst") if runtime is not None else 0
    rates = [r for r in (allocated_bps, runtime_rate or None) if r is not None]
    if not rates:
        return None, None
    rate = max(min(rates), _MIN_RATE_BPS)
    if rate > MAX_RATE_BPS:
        log.warning("%s not shaped: rate %d bit/s is above the %d bit/s tbf can hold", direction, rate, MAX_RATE_BPS)
        return None, None
    burst = conf_burst_bytes
    if runtime_burst:
        default = burst if burst is not None else Tbf.for_rate(rate, None, latency_s).burst_bytes
        burst = min(default, max(runtime_burst // 8, 1))
    return rate, burst


def shape_spec(
    conf: ShapingConfig | None, consumed: Mapping[str, Any], runtime: RuntimeBandwidth | None = None
) -> ShapeSpec | None:
    """The shaping of an attachment that consumed ``consumed`` (capacity name -> quantity, bits
    per second) under ``conf`` (None: shaping off) and the runtime's request ``runtime``; None
    when no direction is shaped. Rules: module docstring.

    Raises InvalidConfigError (7) for a bucket tbf cannot hold (a queue limit above 4 GiB).
    """
    if conf is None:
        return None
    egress_name, ingress_name = conf.capacities
    egress_rate, egress_burst = _direction(
        "egress", _allocated_bps(consumed, egress_name), conf.egressBurstBytes, conf.latencySeconds, runtime)
    ingress_rate, ingress_burst = _direction(
        "ingress", _allocated_bps(consumed, ingress_name), conf.ingressBurstBytes, conf.latencySeconds, runtime)
    if egress_rate is None and ingress_rate is None:
        return None
    return ShapeSpec(egress_rate_bps=egress_rate, egress_burst_bytes=egress_burst,
                     ingress_rate_bps=ingress_rate, ingress_burst_bytes=ingress_burst,
                     latency_s=conf.latencySeconds)


def _bucket(tbf: Tbf | None) -> dict[str, int] | None:
    if tbf is None:
        return None
    return {"rateBps": tbf.rate_bps, "burstBytes": tbf.burst_bytes, "limitBytes": tbf.limit_bytes}


def record(info: ShapeInfo) -> dict[str, Any]:
    """The record of ``info`` (what ADD installed) for ``Attachment.shaping``."""
    out: dict[str, Any] = {"egress": _bucket(info.egress), "ingress": _bucket(info.ingress), "ifb": info.ifb}
    return {k: v for k, v in out.items() if v is not None}


def _burst_close(got: int, want: int) -> bool:
    # tbf stores the burst as a time at the rate, in scheduler ticks: a few bytes of rounding
    return abs(got - want) <= max(16, want // 1000)


def mismatch(recorded: Mapping[str, Any], info: ShapeInfo | None) -> str | None:
    """How the kernel's shaping ``info`` (None: none at all) differs from the ``recorded`` one,
    in words, or None when it does not (rates and limits exact, bursts within rounding)."""
    for direction in DIRECTIONS:
        want = recorded.get(direction)
        if not want:
            continue
        got: Tbf | None = getattr(info, direction) if info is not None else None
        what = "the root tbf qdisc" if direction == "egress" else f"the ingress redirect to {recorded.get('ifb')} and its tbf"
        if got is None:
            return f"{direction} is not shaped ({what} is missing), expected {_rate(want['rateBps'])}"
        if got.rate_bps != want["rateBps"]:
            return f"{direction} rate is {_rate(got.rate_bps)}, expected {_rate(want['rateBps'])}"
        if got.limit_bytes != want["limitBytes"]:
            return f"{direction} queue limit is {got.limit_bytes} bytes, expected {want['limitBytes']}"
        if not _burst_close(got.burst_bytes, want["burstBytes"]):
            return f"{direction} burst is {got.burst_bytes} bytes, expected {want['burstBytes']}"
    if recorded.get("ingress") and info is not None and recorded.get("ifb") and info.ifb != recorded["ifb"]:
        return f"ingress goes through {info.ifb}, expected {recorded['ifb']}"
    return None


def _rate(bps: int) -> str:
    return f"{Quantity.from_int(bps)}bit/s"

