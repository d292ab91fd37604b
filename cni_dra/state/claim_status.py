"""Claim status records: what a claim-mode ADD leaves in the node state for the agent.

The CNI plugin never talks to the API server. After a claim-mode ADD it appends one
record to ``NodeState.statusUpdates`` (in the same transaction that marks the attachment
``ready``; on failure, after the rollback); the agent (:mod:`cni_dra.agent.status_writer`) turns
each record into a server-side apply of the ResourceClaim's ``status.devices[]`` entry
for (driver, pool, device, shareID) and removes it once applied (KEP-4817 networkData).

Record shape (a dict, so older and newer agents read each other's)::

    {"id": "<uuid hex>", "time": "<RFC 3339 UTC>",
     "claim": {"namespace", "name", "uid"}, "driver", "pool", "device", "shareID",
     "podUID", "containerID", "ifname",
     "ready": true,  "networkData": {"interfaceName", "ips": ["192.0.2.5/24"], "hardwareAddress"}
     | "ready": false, "reason": "<CamelCase>", "message": "<why>"}
"""

from __future__ import annotations

import datetime
import logging
import uuid
from typing import Any

from cni_dra.state.schema import Attachment

__all__ = ["claim_status_record", "record_add_failure", "network_data", "interface_data"]

log = logging.getLogger("cni_dra.state")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def network_data(result: dict[str, Any], ifname: str) -> dict[str, Any]:
    """KEP-4817 ``networkData`` from a CNI 1.1.0 result for the pod interface ``ifname``.

    ``interfaceName``: ``ifname``; ``ips``: the result's addresses on that interface in CIDR
    form (as CNI prints them); ``hardwareAddress``: its MAC. Keys without a value are left out.
    """
    interfaces = result.get("interfaces") or []
    index = next(
        (i for i, itf in enumerate(interfaces) if itf.get("name") == ifname and itf.get("sandbox")), None
    )
    if index is None:
        index = next((i for i, itf in enumerate(interfaces) if itf.get("name") == ifname), None)
    out: dict[str, Any] = {"interfaceName": ifname}
    ips = [
        ip["address"]
        for ip in result.get("ips") or []
        if ip.get("address") and ip.get("interface", index) == index
    ]
    if ips:
        out["ips"] = ips
    if index is not None and interfaces[index].get("mac"):
        out["hardwareAddress"] = interfaces[index]["mac"]
    return out


def interface_data(att: Attachment) -> dict[str, Any]:
    """The driver-specific ``data`` of a ready attachment's ``status.devices[]`` entry
    (KEP-4817: opaque to Kubernetes, a JSON object)::

        {"apiVersion": "net.cni-dra.dev/v1alpha1", "kind": "InterfaceStatus",
         "linkType": "ipvlan", "parentInterface": "eth1",
         "profile": {"linkType", "mode", "ipvlanFlag", "mtu", "mac", "shaping", "fromConfig"}}

    ``profile`` (what the allocation result's device profile made of the link,
    :func:`cni_dra.attach.device_profile.describe`) only when one applied."""
    from cni_dra.protocol.profile import API_VERSION  # the driver's one API group and version
    from cni_dra.state.frozen import thaw

    out: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "InterfaceStatus",
        "linkType": att.linkType,
        "parentInterface": att.parent,
    }
    if att.profile is not None:
        out["profile"] = thaw(att.profile)
    return out


def _base(att: Attachment) -> dict[str, Any]:
    claim = att.claim
    return {
        "id": uuid.uuid4().hex,
        "time": _now(),
        "claim": {"namespace": claim.namespace, "name": claim.name, "uid": claim.uid} if claim else {},
        "driver": att.driver,
        "pool": att.pool,
        "device": att.device,
        "shareID": att.shareID,
        "podUID": att.podUID,
        "containerID": att.containerID,
        "ifname": att.ifname,
    }


def claim_status_record(att: Attachment) -> dict[str, Any]:
    """The record for a successful ADD of ``att`` (claim mode, ``att.result`` set)."""
    rec = _base(att)
    rec.update(ready=True, networkData=network_data(att.result or {}, att.ifname))
    return rec


def record_add_failure(store: Any, att: Attachment, error: BaseException) -> None:
    """Append the failure record of ``att``'s ADD to the state (own transaction).

    ``reason``: the error class name (e.g. ``NetlinkError``); ``message``: CNI code and
    message. Never raises: a state that cannot be written only loses the report, the
    original ADD error stays the one returned to the runtime.
    """
    rec = _base(att)
    code = getattr(error, "code", 999)
    msg = getattr(error, "msg", None) or str(error) or type(error).__name__
    rec.update(ready=False, reason=type(error).__name__, message=f"CNI ADD failed with code {code}: {msg}")
    try:
        with store.transaction() as txn:
            txn.add_status_update(rec)
    except Exception as exc:  # noqa: BLE001 - reporting must not mask the ADD error
        log.error("failed to record the ADD failure for claim %s: %s", rec["claim"], exc)
