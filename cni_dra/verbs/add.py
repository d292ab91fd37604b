"""ADD: reserve a share of a NIC, create the macvlan in the pod netns, delegate IPAM, print the result.

Source: CNI spec 1.1.0 "ADD: Add container to network"; KEP-5075 for the capacity rules.

Steps (each effect registers its undo; a failure undoes them in reverse and re-raises):

1. under the state lock: choose the device (claim mode: the pod's prepared allocation
   result; standalone: :func:`cni_dra.allocator.select_device` over the inventory) and
   record the attachment in phase ``adding`` — the capacity is charged from here on;
2. create the macvlan in the pod netns (temporary name, then CNI_IFNAME);
3. IPAM ADD (the plugin named by ``ipam.type``), then addresses and routes on the link;
4. under the lock: the attachment becomes ``ready`` with the CNI result.

Errors: InvalidConfigError (7) for mtu above the parent's (before any IPAM call),
NoCapacityError (100) when nothing fits, ClaimError (101) for an allocation that cannot be
honoured, NetlinkError (102), IpamError (the IPAM plugin's code), TryAgainLaterError (11),
StateError (5), IOFailureError (5) / InventoryError (7) for the inventory.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from cni_dra.errors import (
    AttachmentExistsError,
    ClaimError,
    InvalidConfigError,
    InventoryError,
    NoCapacityError,
    TryAgainLaterError,
)
from cni_dra.protocol.results import DNS, Interface, IPConfig, Result, Route, merge_prev_result, parse_result
from cni_dra.quantity import Quantity
from cni_dra.state import Attachment, ClaimRef, NodeState
from cni_dra.state.claim_status import claim_status_record, record_add_failure
from cni_dra.verbs.common import Invocation, claim_results_for

__all__ = ["cmd_add"]

log = logging.getLogger("cni_dra.add")


def _host_links_by_name(names: list[str]) -> dict[str, Any]:
    from cni_dra.netlink.links import host_link

    out = {}
    for name in names:
        info = host_link(name)
        if info is not None:
            out[name] = info
    return out


def _device_if_name(device: Any, driver: str) -> str:
    from cni_dra.dra.models import device_attribute

    value = device_attribute(device, "ifName", driver)
    if not isinstance(value, str) or not value:
        raise InventoryError(f"invalid inventory: device {device.name}: attributes.ifName.string is missing")
    return value


def _describe(requests: dict[str, Quantity]) -> str:
    if not requests:
        return "the default capacity"
    return ", ".join(f"{k} {v}" for k, v in sorted(requests.items()))


def _reserve(inv: Invocation, state: NodeState, host_links: dict[str, Any]) -> Attachment:
    """Choose the device and charge it in ``state`` (called under the lock)."""
    from cni_dra.allocator import NoFit, check_fits, select_device

    env, conf = inv.env, inv.conf
    slice_ = inv.inventory
    driver, pool = slice_.spec.driver, slice_.spec.pool.name
    if driver != conf.driver:
        raise InventoryError(
            f"invalid inventory {conf.inventory}: spec.driver {driver!r} is not the configured driver {conf.driver!r}"
        )
    devices = {d.name: d for d in slice_.spec.devices}
    pod_uid = env.args.pod_uid
    common = dict(
        network=conf.name,
        containerID=env.container_id,
        ifname=env.ifname,
        netns=env.netns or "",
        podUID=pod_uid,
        podNamespace=env.args.pod_namespace,
        podName=env.args.pod_name,
        driver=driver,
        pool=pool,
        linkType=conf.linkType,
        ipamType=conf.ipam_type,
        ipamConf=inv.raw.decode() if conf.ipam_type else None,
        phase="adding",
    )
    picked = claim_results_for(state.claims.get(pod_uid, []), conf.driver, env.ifname) if pod_uid else None
    if picked is not None:
        claim, res = picked
        meta = claim.get("metadata") or {}
        name = res.get("device", "")
        where = f"claim {meta.get('namespace', '')}/{meta.get('name', '')} request {res.get('request')!r}"
        if res.get("pool") != pool or name not in devices:
            raise ClaimError(
                f"failed to honour {where}: device {res.get('pool')}/{name} is not in this node's inventory "
                f"(pool {pool}: {', '.join(sorted(devices))})"
            )
        for other in state.attachments:
            if (
                other.claim is not None
                and other.claim.uid == meta.get("uid", "")
                and other.claim.request == res.get("request", "")
                and other.shareID == res.get("shareID")
                and other.device == name
            ):
                raise ClaimError(
                    f"failed to honour {where} for interface {env.ifname}: that allocation result is already used "
                    f"by interface {other.ifname} of container {other.containerID}"
                )
        device = devices[name]
        if_name = _device_if_name(device, driver)
        if if_name not in host_links:
            raise ClaimError(f"failed to honour {where}: device {name}'s interface {if_name} does not exist")
        consumption = {k: Quantity.parse(v) for k, v in (res.get("consumedCapacity") or {}).items()}
        if not device.shared:
            # A dedicated device (KEP-5075: no allowMultipleAllocations) is held whole.
            consumption = {k: c.value for k, c in device.capacity.items()}
        share_id = res.get("shareID")
        others = [a for a in state.attachments if a.driver == driver and a.pool == pool and a.device == name]
        on_node: dict[str, Quantity] = {}
        for a in others:
            for k, v in a.consumedCapacity.items():
                on_node[k] = on_node[k] + v if k in on_node else v
        reason = check_fits(device, on_node, consumption)
        if reason:
            raise ClaimError(f"failed to honour {where} on device {name}: allocation no longer fits: {reason}")
        return Attachment(
            **common,
            device=name,
            ifName=if_name,
            consumedCapacity=consumption,
            shareID=share_id,
            claim=ClaimRef(
                namespace=meta.get("namespace", ""),
                name=meta.get("name", ""),
                uid=meta.get("uid", ""),
                request=res.get("request", ""),
            ),
        )
    # Standalone mode: allocate on the node as the scheduler would.
    requests = dict(conf.capacity.requests)
    usable, skipped = [], []
    for d in slice_.spec.devices:
        if_name = _device_if_name(d, driver)
        link = host_links.get(if_name)
        if link is None:
            skipped.append(f"{d.name}: interface {if_name} does not exist")
        elif conf.mtu is not None and conf.mtu > link.mtu:
            skipped.append(f"{d.name}: MTU {link.mtu} of {if_name} is below the configured mtu {conf.mtu}")
        else:
            usable.append(d)
    if conf.mtu is not None and not usable and skipped:
        raise InvalidConfigError(
            f"invalid network config {conf.name!r}: mtu {conf.mtu} is above the MTU of every usable parent NIC "
            f"({'; '.join(skipped)})"
        )
    consumed = state.consumed_by_device(driver, pool, devices)
    exclude: set[str] = set()
    if conf.distinctFrom == "pod" and pod_uid:
        # Each of a pod's attachments on a different NIC (redundant links), across CNI calls.
        exclude = {a.device for a in state.attachments if a.podUID == pod_uid and a.driver == driver}
    choice = select_device(
        usable, consumed, requests, conf.selectionPolicy, exclude=exclude, driver=driver,
        selectors=[s.cel.expression for s in conf.selectors],
    )
    if isinstance(choice, NoFit):
        reasons = [
            f"{dev}: {'already used by this pod (distinctFrom: pod)' if dev in exclude else why}"
            for dev, why in sorted(choice.reasons.items())
        ]
        reasons += skipped
        who = f"pod {env.args.pod_namespace}/{env.args.pod_name}" if env.args.pod_name else f"container {env.container_id}"
        raise NoCapacityError(
            f"failed to allocate {_describe(requests)} for {who} interface {env.ifname}: "
            f"no NIC has room ({'; '.join(reasons) or 'the inventory has no devices'})"
        )
    return Attachment(
        **common,
        device=choice.device.name,
        ifName=_device_if_name(choice.device, driver),
        consumedCapacity=dict(choice.consumed_capacity),
        shareID=str(uuid.uuid4()) if choice.shared else None,
    )


def _result_from(inv: Invocation, link: Any, ipam_result: Result | None) -> Result:
    env, conf = inv.env, inv.conf
    prev = parse_result(conf.prevResult, conf.cniVersion) if conf.prevResult else None
    iface = Interface(name=env.ifname, mac=link.mac, mtu=link.mtu, sandbox=env.netns or "")
    ips: list[IPConfig] = list(ipam_result.ips) if ipam_result else []
    routes: list[Route] = list(ipam_result.routes) if ipam_result else []
    dns = ipam_result.dns if ipam_result else None
    if conf.dns:
        dns = DNS(
            nameservers=conf.dns.nameservers, domain=conf.dns.domain, search=conf.dns.search, options=conf.dns.options
        )
    return merge_prev_result(prev, iface, ips, routes, dns)


def cmd_add(inv: Invocation) -> Result:
    """Run ADD for ``inv``; returns the CNI result (newest schema). See module docstring."""
    from cni_dra import ipam
    from cni_dra.netlink import links

    env, conf = inv.env, inv.conf
    slice_ = inv.inventory
    undo: list[Callable[[], None]] = []
    key = (conf.name, env.container_id, env.ifname)
    host_links = _host_links_by_name([_device_if_name(d, slice_.spec.driver) for d in slice_.spec.devices])
    try:
        # 1. reserve capacity (under the lock)
        with inv.store.transaction() as state:
            existing = state.find(*key)
            if existing is not None:
                if existing.phase == "ready" and existing.result and existing.netns == (env.netns or ""):
                    log.info("ADD repeated for %s: returning the recorded result", key)
                    return parse_result(existing.result, "1.1.0")
                if existing.phase == "adding":
                    raise TryAgainLaterError(
                        f"failed to add {env.ifname} for container {env.container_id}: an ADD of the same "
                        "attachment is still in progress"
                    )
                raise AttachmentExistsError(
                    f"failed to add {env.ifname} for container {env.container_id}: already attached on "
                    f"network {conf.name!r} in netns {existing.netns} (device {existing.device})"
                )
            att = _reserve(inv, state, host_links)
            parent = host_links[att.ifName]
            if conf.mtu is not None and conf.mtu > parent.mtu:
                raise InvalidConfigError(
                    f"invalid network config {conf.name!r}: mtu {conf.mtu} is above the MTU {parent.mtu} "
                    f"of the chosen parent {att.ifName} (device {att.device})"
                )
            state.attachments.append(att)

        def release_capacity() -> None:
            with inv.store.transaction() as st:
                st.remove(*key)

        undo.append(release_capacity)
        # 2. the link
        link = links.create_macvlan(
            parent=att.ifName, netns=env.netns, ifname=env.ifname, mode=conf.mode, mtu=conf.mtu, mac=conf.mac
        )
        undo.append(lambda: links.delete_link(env.netns, env.ifname))
        # 3. IPAM
        ipam_result: Result | None = None
        if conf.ipam_type:
            ipam_result = ipam.ipam_add(conf.ipam_type, inv.raw, inv.environ, env.path)
            undo.append(lambda: ipam.ipam_del(conf.ipam_type, inv.raw, inv.environ, env.path))
            links.configure_interface(
                env.netns,
                env.ifname,
                addresses=[(ip.address, ip.gateway) for ip in ipam_result.ips],
                routes=[(r.dst, r.gw) for r in ipam_result.routes],
            )
        result = _result_from(inv, link, ipam_result)
        # 4. done
        with inv.store.transaction() as state:
            recorded = state.find(*key)
            if recorded is None:  # pragma: no cover - only a concurrent GC/repair could do this
                raise ClaimError(f"failed to complete ADD of {key}: the attachment vanished from state")
            recorded.phase = "ready"
            recorded.result = _result_dict(result)
            if recorded.claim is not None:  # claim mode: the agent writes it into the claim's status
                state.statusUpdates.append(claim_status_record(recorded))
        return result
    except BaseException as failure:
        for step in reversed(undo):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - keep undoing, report the original error
                log.error("rollback step failed: %s", exc)
        if undo and att.claim is not None:  # claim mode: the agent reports the failure on the claim
            record_add_failure(inv.store, att, failure)
        raise


def _result_dict(result: Result) -> dict[str, Any]:
    from cni_dra.protocol.results import result_to_dict

    return result_to_dict(result, "1.1.0")
