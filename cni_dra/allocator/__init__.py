"""Pure KEP-5075 allocator: no I/O, no clock, no randomness unless passed in.

Single request (the ADD path): :func:`consumed_amount`, :func:`device_consumption`,
:func:`remaining`, :func:`check_fits` (:mod:`.capacity`), :func:`select_device`
returning :class:`Selection` or :class:`NoFit` (:mod:`.select`). Whole claims:
:func:`allocate_claim`, :func:`allocate_claims` over a :class:`NodeUsage`
(:mod:`.claims`, built on :mod:`.claim_explain`, :mod:`.claim_search`,
:mod:`.claim_requests` and :mod:`.usage`). Every name is loaded on first use. CEL selectors live in
:mod:`cni_dra.allocator.cel`, imported only when a selector is present. ``.importlinter``
keeps the modules in that order.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cni_dra.allocator.capacity import (
        NoFit,
        RequestNotRepresentable,
        check_fits,
        consumed_amount,
        dedicated_in_use,
        device_consumption,
        remaining,
        resolve_capacity_name,
    )
    from cni_dra.allocator.claim_allocator import (
        MAX_RESULTS,
        ClaimNoFit,
        NodeUsage,
        allocate_claim,
        allocate_claims,
    )
    from cni_dra.allocator.select import POLICIES, Policy, Selection, policy_sort_key, rank_key, select_device

__all__ = [
    "MAX_RESULTS",
    "POLICIES",
    "ClaimNoFit",
    "NodeUsage",
    "allocate_claim",
    "allocate_claims",
    "policy_sort_key",
    "NoFit",
    "Policy",
    "RequestNotRepresentable",
    "Selection",
    "check_fits",
    "consumed_amount",
    "dedicated_in_use",
    "device_consumption",
    "rank_key",
    "remaining",
    "resolve_capacity_name",
    "select_device",
]


_CLAIM_NAMES = frozenset({"MAX_RESULTS", "ClaimNoFit", "NodeUsage", "allocate_claim", "allocate_claims"})
_SELECT_NAMES = frozenset({"POLICIES", "Policy", "Selection", "policy_sort_key", "rank_key", "select_device"})


def __getattr__(name: str) -> object:
    # Each part is loaded on first use: whole-claim allocation so that the ADD path
    # (select_device) does not pay for it, and the single-request allocator (which imports
    # the resource.k8s.io/v1 models) so that a module that needs only .usage (the state's
    # books, which a DEL reads) does not either.
    if name in _CLAIM_NAMES:
        from cni_dra.allocator import claim_allocator as part
    elif name in _SELECT_NAMES:
        from cni_dra.allocator import select as part  # type: ignore[no-redef]
    elif name in __all__:
        from cni_dra.allocator import capacity as part  # type: ignore[no-redef]
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(part, name)
