"""Pick one device for one capacity request (the standalone-mode ADD path).

Pure: the caller passes the inventory, what the node has consumed so far and the
request; nothing is read or written here.

Ranking (deterministic, documented for operators):

* The *ranking capacities* are the capacities the request names, sorted by name
  (short form, so ``bandwidth`` and ``<driver>/bandwidth`` rank together); when the
  request names none, every capacity of the device, sorted by short name.
* For each fitting device the key is the tuple of its *remaining* amounts in those
  capacities after this allocation (value − already consumed − this consumption),
  compared lexicographically: the first ranking capacity decides, later ones break ties.
* ``best-fit`` picks the smallest key (the tightest device: it keeps big devices free
  for big requests), ``least-allocated`` the largest (spreads load), ``first-fit``
  ignores the key (the first fitting device by name, as the upstream allocator takes
  the first fitting device of a name-ordered slice).
* Ties are broken by device name (ascending), so the result does not depend on the
  order of the inventory.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from cni_dra.allocator.capacity import (
    NoFit,
    check_fits,
    dedicated_in_use,
    device_consumption,
    resolve_capacity_name,
)
from cni_dra.dra.objects import Device, split_qualified_name
from cni_dra.quantity import Quantity

__all__ = ["POLICIES", "Policy", "Selection", "select_device", "rank_key", "policy_sort_key"]

Policy = Literal["best-fit", "least-allocated", "first-fit"]
POLICIES: tuple[str, ...] = ("best-fit", "least-allocated", "first-fit")

_ZERO = Quantity.ZERO


@dataclass(frozen=True)
class Selection:
    """The chosen device and what the allocation consumes on it.

    ``consumed_capacity`` holds every capacity of the device (KEP-5075
    ``consumedCapacity``). ``shared`` is False for a dedicated device: the API result
    then carries neither ``consumedCapacity`` nor ``shareID``, while the node state
    still records the whole value as consumed.
    """

    device: Device
    consumed_capacity: dict[str, Quantity]
    shared: bool = True


def _unqualified(name: str) -> str:
    """``"dom/id"`` → ``"id"``: the sort key of capacity names."""
    return split_qualified_name(name)[1]


def rank_key(
    device: Device,
    consumed_on_node: Mapping[str, Quantity],
    consumption: Mapping[str, Quantity],
    requests: Mapping[str, Quantity],
    driver: str = "",
) -> tuple[int, ...]:
    """Remaining nano-units after the allocation, in ranking-capacity order (see module doc)."""
    keys: Sequence[str | None]  # a requested name the device lacks resolves to None
    if requests:
        names = sorted(requests, key=_unqualified)
        keys = [resolve_capacity_name(device, n, driver) for n in names]
    else:
        names = sorted(device.capacity, key=_unqualified)
        keys = names
    out = []
    for key in keys:
        if key is None:  # pragma: no cover - fitting devices have every requested capacity
            continue
        value = device.capacity[key].value
        out.append((value - consumed_on_node.get(key, _ZERO) - consumption.get(key, _ZERO)).nanos)
    return tuple(out)


def policy_sort_key(policy: Policy, key: tuple[int, ...], name: str) -> tuple[tuple[int, ...], str]:
    """Sort key for candidates under ``policy``: smaller sorts first."""
    if policy == "least-allocated":
        return (tuple(-k for k in key), name)
    if policy == "first-fit":
        return ((), name)
    return (key, name)


def select_device(
    devices: Sequence[Device],
    consumed: Mapping[str, Mapping[str, Quantity]],
    requests: Mapping[str, Quantity],
    policy: Policy = "best-fit",
    exclude: Collection[str] = (),
    driver: str = "",
    selectors: Sequence[str] = (),
    *,
    fractional_capacity_range: bool = False,
) -> Selection | NoFit:
    """Choose the device for one request of ``requests`` (capacity name → quantity).

    ``consumed`` maps device name → capacity key → amount already consumed on this
    node (every allocation summed; a dedicated device counts as in use when it has
    any entry). ``exclude`` names devices not to use (e.g. ``distinctFrom: pod``).
    ``driver`` resolves ``<driver>/name`` capacity names and is ``device.driver`` for
    the CEL ``selectors`` (all must hold; see :mod:`cni_dra.allocator.cel`, which is
    imported only when selectors are given; a selector that fails to compile or
    evaluate raises InvalidConfigError, code 7). ``fractional_capacity_range`` is the
    cluster's ``DRAFractionalCapacityRange`` gate (see :mod:`cni_dra.allocator.capacity`;
    off unless said, the Kubernetes 1.37 default).

    Devices are examined in name order; a request the first device it reaches cannot
    compute (:class:`~cni_dra.allocator.capacity.RequestNotRepresentable`, code 7) stops
    the selection, as upstream aborts the allocation there.

    Returns :class:`Selection` or :class:`NoFit` whose ``reasons`` give, per device,
    why it does not fit, e.g. ``remaining bandwidth 3G < 8G``. Source: KEP-5075
    "Allocation"; ranking in the module docstring.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown selection policy {policy!r}")
    reasons: dict[str, str] = {}
    candidates: list[tuple[tuple[tuple[int, ...], str], Selection]] = []
    for device in sorted(devices, key=lambda d: d.name):
        if device.name in exclude:
            reasons[device.name] = "excluded"
            continue
        if selectors:
            from cni_dra.allocator.cel import device_matches

            if not device_matches(selectors, device, driver):
                reasons[device.name] = "does not match selectors"
                continue
        on_node = consumed.get(device.name, {})
        if dedicated_in_use(device, on_node):
            reasons[device.name] = "dedicated device already allocated"
            continue
        consumption = device_consumption(
            device, requests, driver, fractional_capacity_range=fractional_capacity_range
        )
        if isinstance(consumption, NoFit):
            reasons.update(consumption.reasons)
            continue
        why = check_fits(device, on_node, consumption)
        if why is not None:
            reasons[device.name] = why
            continue
        key = rank_key(device, on_node, consumption, requests, driver)
        candidates.append(
            (policy_sort_key(policy, key, device.name), Selection(device, consumption, device.shared))
        )
    if not candidates:
        return NoFit(reasons)
    candidates.sort(key=lambda c: c[0])
    return candidates[0][1]
