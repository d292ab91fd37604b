"""What the kernel makes of a tbf bucket as cni-dra sends it, without a kernel.

The request is compiled by pyroute2 as :func:`cni_dra.netlink.shaping.apply_shaping` sends
it (``IPBatch``: the same encoder, no socket), so a value pyroute2 cannot encode raises
here as it would in ADD. It is then read as Linux's ``sch_tbf`` reads it (``tbf_change``):
the bucket arrives as a time in 64 ns scheduler ticks, and the largest packet tbf lets
through is what the rate sends in that time, capped at 2**32-1 ns.
"""

from __future__ import annotations

from dataclasses import dataclass

from cni_dra.netlink.tbf import Tbf, tbf_parameters

TICK_NS = 64  # PSCHED_SHIFT 6: what /proc/net/psched reports on every kernel since 2.6.31


@dataclass(frozen=True)
class Held:
    """A bucket as the kernel holds it: rate (bytes/s), queue limit, bucket time and size, and
    the largest packet it passes."""

    rate_Bps: int  # noqa: N815 - bytes, not bits
    limit_bytes: int
    buffer_ns: int
    burst_bytes: float
    max_packet_bytes: int


def as_the_kernel_holds_it(tbf: Tbf) -> Held:
    """``tbf`` compiled by pyroute2 and read back as the kernel reads it (module docstring)."""
    from pyroute2.iproute.linux import IPBatch
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    ipb = IPBatch()
    try:
        ipb.tc("replace", "tbf", 1, 0x10000, parent=0xFFFFFFFF, **tbf_parameters(tbf))
        data = bytes(ipb.batch)
    finally:
        ipb.close()
    msg = tcmsg(data)
    msg.decode()
    parms = msg.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
    rate, buffer_ns = parms["rate"], parms["buffer"] * TICK_NS
    return Held(
        rate_Bps=rate,
        limit_bytes=parms["limit"],
        buffer_ns=buffer_ns,
        burst_bytes=buffer_ns * rate / 1e9,
        max_packet_bytes=min(buffer_ns, 2**32 - 1) * rate // 10**9,
    )


def holds_as_asked(tbf: Tbf, mtu: int) -> bool:
    """The kernel holds ``tbf``'s rate and limit exactly, its burst within 2 µs of the rate (the
    rounding of the bucket's time), and passes a full frame of an interface of MTU ``mtu``
    (MTU + 14 bytes of Ethernet header)."""
    held = as_the_kernel_holds_it(tbf)
    rate_Bps = tbf.rate_bps // 8  # noqa: N806
    return (
        held.rate_Bps == rate_Bps
        and held.limit_bytes == tbf.limit_bytes
        and abs(held.burst_bytes - tbf.burst_bytes) <= rate_Bps * 2 / 1e6 + 1
        and held.max_packet_bytes >= mtu + 14
    )
