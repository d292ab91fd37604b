"""The node's capacity report: what ``cni-dra status`` prints and the agent exports as metrics."""

from __future__ import annotations

from typing import Any

from cni_dra.quantity import Quantity

__all__ = ["status_report"]


def status_report(state_dir: str, inventory: str) -> dict[str, Any]:
    """The ``status --json`` document (stable interface for scripts).

    Shape: ``{"devices": [{"name", "ifName", "capacity": {name: q}, "consumed": {...},
    "remaining": {...}}], "attachments": [{"podUID", "containerID", "ifname", "netns",
    "device", "consumedCapacity": {...}, "consumedRecorded", "shareID", "phase", "readyAt", "shaping", ...}]}``; quantities
    are canonical Kubernetes quantity strings (bandwidth in bits per second). ``consumed``
    counts attachments and prepared claim results not attached yet. An attachment's
    ``consumedCapacity`` is what it is charged: its record, or, when the record names no
    amount (``consumedRecorded`` false: an old state), its device's whole capacity.
    ``shaping`` is the traffic control ADD installed on the pod interface, None when it is not
    shaped: ``{"egress": {"rate", "rateBps", "burstBytes", "limitBytes"}, "ingress": {...},
    "ifb"}`` (``rate`` a quantity in bits per second), a direction that is not shaped left out.
    ``readyAt`` is when its ADD made it ready (RFC 3339 UTC; None while adding, and for
    attachments recorded before the field existed): GC spares it for
    :data:`cni_dra.verbs.gc.GRACE_S` after that. ``linkType`` is the kind of the pod link; ``profile`` what the allocation result's device
    profile made of it (``{"linkType", "mode", "ipvlanFlag", "mtu", "mac", "shaping",
    "fromConfig"}``, :func:`cni_dra.attach.device_profile.describe`), None when the conflist alone
    made it.
    """
    from cni_dra.allocator import remaining
    from cni_dra.dra.inventory import load_inventory
    from cni_dra.dra.objects import device_attribute
    from cni_dra.state import StateStore
    from cni_dra.state.frozen import thaw
    from cni_dra.state.ledger import node_usage

    slice_ = load_inventory(inventory)
    state = StateStore(state_dir).read()
    driver, pool = slice_.spec.driver, slice_.spec.pool.name
    by_name = {d.name: d for d in slice_.spec.devices}
    consumed = node_usage(state, driver, pool, by_name).consumed
    devices = []
    for d in sorted(slice_.spec.devices, key=lambda d: d.name):
        used = consumed.get(d.name, {})
        devices.append(
            {
                "name": d.name,
                "ifName": device_attribute(d, "ifName", driver),
                "capacity": {k: str(c.value) for k, c in sorted(d.capacity.items())},
                "consumed": {k: str(used.get(k, Quantity.ZERO)) for k, c in sorted(d.capacity.items())},
                "remaining": {k: str(v) for k, v in sorted(remaining(d, used).items())},
            }
        )
    attachments = []
    for a in state.attachments:
        attachments.append(
            {
                "podUID": a.podUID,
                "podNamespace": a.podNamespace,
                "podName": a.podName,
                "network": a.network,
                "containerID": a.containerID,
                "ifname": a.ifname,
                "netns": a.netns,
                "device": a.device,
                "ifName": a.parent,
                "consumedCapacity": {k: str(v) for k, v in sorted(a.charged(by_name.get(a.device)).items())},
                "consumedRecorded": bool(a.consumedCapacity),
                "shareID": a.shareID,
                "phase": a.phase,
                "readyAt": a.readyAt,
                "claim": a.claim.model_dump() if a.claim else None,
                "shaping": _shaping(a.shaping),
                "linkType": a.linkType,
                "profile": thaw(a.profile) if a.profile is not None else None,
            }
        )
    claims = [
        {"podUID": pod, "namespace": c.namespace or None, "name": c.name or None, "uid": c.uid or None}
        for pod, c in sorted(state.prepared_items(), key=lambda pc: pc[0])
    ]
    return {
        "driver": driver,
        "pool": pool,
        "devices": devices,
        "attachments": attachments,
        "preparedClaims": claims,
    }


def _shaping(recorded: dict[str, Any] | None) -> dict[str, Any] | None:
    """An attachment's shaping record as the report shows it (rates also as quantities)."""
    if not recorded:
        return None
    out: dict[str, Any] = {}
    for direction in ("egress", "ingress"):
        bucket = recorded.get(direction)
        if bucket:
            out[direction] = {"rate": str(Quantity.from_int(int(bucket["rateBps"]))), **bucket}
    if recorded.get("ifb"):
        out["ifb"] = recorded["ifb"]
    return out
