"""Pure KEP-5075 allocator: no I/O, no clock, no randomness unless passed in.

Phase-1 surface (single request, the ADD path): :func:`consumed_amount`,
:func:`device_consumption`, :func:`remaining`, :func:`check_fits`,
:func:`select_device` returning :class:`Selection` or :class:`NoFit`.
"""

from cni_dra.allocator.capacity import (
    NoFit,
    check_fits,
    consumed_amount,
    dedicated_in_use,
    device_consumption,
    explain_consumed_amount,
    remaining,
    resolve_capacity_name,
)
from cni_dra.allocator.select import Policy, Selection, rank_key, select_device

__all__ = [
    "NoFit",
    "Policy",
    "Selection",
    "check_fits",
    "consumed_amount",
    "dedicated_in_use",
    "device_consumption",
    "explain_consumed_amount",
    "rank_key",
    "remaining",
    "resolve_capacity_name",
    "select_device",
]
