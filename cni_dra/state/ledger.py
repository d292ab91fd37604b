"""The node's books: what each device of a pool holds, from the node state.

:func:`node_usage` is the one place the state's records become capacity charges
(:data:`cni_dra.allocator.usage.Charge`), summed by the allocator's one ledger
(:meth:`NodeUsage.plus <cni_dra.allocator.usage.NodeUsage.plus>`). ADD's placement (standalone
selection and the claim-mode check that a prepared result still fits), ``cni-dra status``
and the agent's metrics (:mod:`cni_dra.report`) and ``allocate --state-dir`` all read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from cni_dra.allocator.usage import Charge, NodeUsage, is_dedicated, whole_capacity
from cni_dra.state.books import kept_usage
from cni_dra.state.schema import NodeState

if TYPE_CHECKING:
    from cni_dra.dra.objects import Device

__all__ = ["node_usage", "node_charges"]


def node_usage(
    state: NodeState,
    driver: str,
    pool: str,
    devices: Mapping[str, Device] | None = None,
    *,
    prepared: bool = True,
) -> NodeUsage:
    """What the devices of (``driver``, ``pool``) hold in ``state``: :func:`node_charges`
    added up (``usage.consumed``: device name -> capacity name -> amount).

    Read from the books the state keeps as it changes (:func:`cni_dra.state.books.kept_usage`:
    O(devices), not O(attachments)), equal to adding up the charges; a pool the books
    cannot count (a record without an amount, a negative amount) is added up charge by charge."""
    devices = devices or {}
    held = kept_usage(state, driver, pool, devices, prepared=prepared)
    if held is None:
        return NodeUsage().plus(node_charges(state, driver, pool, devices, prepared=prepared))
    return held


def node_charges(
    state: NodeState,
    driver: str,
    pool: str,
    devices: Mapping[str, Device] | None = None,
    *,
    prepared: bool = True,
) -> list[Charge]:
    """The charges of ``state`` on (``driver``, ``pool``), in order: every attachment
    (``adding``, ``ready`` and ``deleting``), then, unless ``prepared`` is False, every
    result of a prepared claim (the scheduler already granted it), except ``adminAccess``
    ones, which hold nothing.

    A share is one allocation however many records name it: the attachments of several
    pods sharing one claim's result, the prepared copies of that claim in each pod, and the
    result an attachment uses (share ``(device, claim UID, shareID)``). ``devices`` (name ->
    resource.k8s.io/v1 Device: the inventory) lets a record that names no amount hold its
    device's whole capacity: an attachment without ``consumedCapacity`` (an old state's),
    which then also covers every prepared result of its claim on that device, and a result
    without ``consumedCapacity`` (a dedicated device: KEP-5075 records none). Without
    ``devices`` such records hold nothing; with them, a device the inventory says is not
    shared is held dedicated.
    """
    devices = devices or {}
    charges: list[Charge] = []
    append = charges.append
    covered: set[tuple[str, str]] = set()  # (device, claim UID) held whole by an unrecorded attachment
    exclusive: dict[str, bool] = {}  # device -> dedicated, for the devices the inventory has
    for att in state.attachments:  # the hot loop: 10,000 attachments on a large node
        if att.driver != driver or att.pool != pool:
            continue
        name = att.device
        ded = exclusive.get(name)
        if ded is None:
            dev = devices.get(name)
            if dev is None:
                ded = att.shareID is None  # is_dedicated without an inventory entry
            else:
                ded = exclusive[name] = not dev.shared
        consumed = att.consumedCapacity
        claim = att.claim
        if not consumed:  # no amount recorded: the whole device (Attachment.charged)
            consumed = whole_capacity(devices.get(name))
            if claim is not None:
                covered.add((name, claim.uid))
        append((name, consumed, ded, None if claim is None else (name, claim.uid, att.shareID)))
    if prepared:
        charges.extend(_prepared_charges(state, driver, pool, devices, covered))
    return charges


def _prepared_charges(
    state: NodeState,
    driver: str,
    pool: str,
    devices: Mapping[str, Device],
    covered: set[tuple[str, str]],
) -> list[Charge]:
    """The charges of the prepared claims' results (:func:`node_charges`), but those of
    ``covered`` (device, claim UID)."""
    charges: list[Charge] = []
    for _pod, pclaim in state.prepared_items():
        for res in pclaim.results:
            if res.driver != driver or res.pool != pool or res.adminAccess:
                continue
            if (res.device, pclaim.uid) in covered:
                continue
            dev = devices.get(res.device)
            consumed = res.consumedCapacity or whole_capacity(dev)
            charges.append(
                (res.device, consumed, is_dedicated(dev, res.shareID), (res.device, pclaim.uid, res.shareID))
            )
    return charges
