"""ADD: reserve a share of a NIC, create the macvlan in the pod netns, delegate IPAM, print the result.

Source: CNI spec 1.1.0 "ADD: Add container to network"; KEP-5075 for the capacity rules.

Steps (each effect registers its undo; a failure undoes them in reverse and re-raises):

1. under the state lock: choose the device (claim mode: the pod's prepared allocation
   result; standalone: :func:`cni_dra.allocator.select_device` over the inventory) and
   record the attachment in phase ``adding`` — the capacity is charged from here on (a
   ResourceClaim shared by several pods: each pod's interface uses the claim's one share,
   charged once, on the device the scheduler allocated);
2. create the macvlan in the pod netns (temporary name, then CNI_IFNAME);
3. IPAM ADD (the plugin named by ``ipam.type``), then addresses and routes on the link;
4. under the lock: the attachment becomes ``ready`` with the CNI result.

Errors: InvalidConfigError (7) for mtu above the parent's (before any IPAM call),
NoCapacityError (100) when nothing fits, ClaimError (101) for an allocation that cannot be
honoured, NetlinkError (102), IpamError (the IPAM plugin's code; its catch-all 999 becomes
103), TryAgainLaterError (11, also when the dhcp daemon's socket is absent), IncompatibleVersionError
(1) for an L2-only 0.1.0/0.2.0 config, InvalidConfigError (7) for a MAC already used on the parent,
StateError (5), IOFailureError (5) / InventoryError (7) for the inventory.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from cni_dra.faults import fault_point
from cni_dra.errors import (
    AttachmentExistsError,
    ClaimError,
    IncompatibleVersionError,
    InvalidConfigError,
    IOFailureError,
    InventoryError,
    NoCapacityError,
    TryAgainLaterError,
)
from cni_dra.protocol.results import (
    DNS,
    Interface,
    IPConfig,
    Result,
    Route,
    merge_prev_result,
    parse_result,
    result_to_dict,
)
from cni_dra.protocol.versions import version_at_least
from cni_dra.quantity import Quantity
from cni_dra.state import Attachment, ClaimRef, NodeState
from cni_dra.state.claim_status import claim_status_record, record_add_failure
from cni_dra.state.models import whole_capacity
from cni_dra.verbs.common import Concurrently, Invocation, claim_results_for, ipam_codes
from cni_dra.verbs.status import dhcp_socket_missing

__all__ = ["cmd_add", "link_type_conflicts"]

log = logging.getLogger("cni_dra.add")


def link_type_conflicts(attachments: Iterable[Attachment], link_type: str, driver: str, pool: str) -> dict[str, str]:
    """Devices of (``driver``, ``pool``) that cannot take a link of ``link_type`` now.

    A parent NIC that carries macvlan children cannot take an ipvlan and the reverse
    (the kernel gives a NIC one receive handler: EBUSY). ``attachments`` are the node
    state's; each records its ``linkType``. Returns device name -> reason, e.g.
    ``"carries macvlan links, so it cannot take ipvlan (macvlan and ipvlan cannot share a
    parent NIC)"``. Used as ``exclude`` of :func:`cni_dra.allocator.select_device`.
    Pure; raises nothing.
    """
    out: dict[str, str] = {}
    for att in attachments:
        if att.driver == driver and att.pool == pool and att.linkType != link_type:
            out[att.device] = (
                f"carries {att.linkType} links, so it cannot take {link_type} "
                "(macvlan and ipvlan cannot share a parent NIC)"
            )
    return out


def _host_links_by_name(names: list[str]) -> dict[str, Any]:
    from cni_dra.netlink import info  # called as info.host_link: the seam tests patch

    out = {}
    for name in names:
        found = info.host_link(name)
        if found is not None:
            out[name] = found
    return out


def _device_if_name(device: Any, driver: str) -> str:
    from cni_dra.dra.models import device_attribute

    value = device_attribute(device, "ifName", driver)
    if not isinstance(value, str) or not value:
        raise InventoryError(f"invalid inventory: device {device.name}: attributes.ifName.string is missing")
    return value


_DOWN = frozenset({"DOWN", "LOWERLAYERDOWN", "NOTPRESENT"})  # RFC 2863 operstates that carry no traffic


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
        share = (driver, pool, name, meta.get("uid", ""), res.get("request", ""), res.get("shareID"))
        sharing = [a for a in state.attachments if a.share_key() == share]
        for other in sharing:
            if not pod_uid or other.podUID == pod_uid:
                raise ClaimError(
                    f"failed to honour {where} for interface {env.ifname}: that allocation result is already used "
                    f"by interface {other.ifname} of container {other.containerID}"
                )
        device = devices[name]
        if_name = _device_if_name(device, driver)
        if if_name not in host_links:
            raise ClaimError(f"failed to honour {where}: device {name}'s interface {if_name} does not exist")
        consumption = {k: Quantity.parse(v) for k, v in (res.get("consumedCapacity") or {}).items()}
        if not device.shared or not consumption:
            # A dedicated device (KEP-5075: no allowMultipleAllocations) is held whole; so is a
            # shared one by a result that records no amount (its share is unknown).
            consumption = whole_capacity(device)
        share_id = res.get("shareID")
        mixed = link_type_conflicts(state.attachments, conf.linkType, driver, pool).get(name)
        if mixed:
            raise ClaimError(f"failed to honour {where} on device {name}: the NIC {mixed}")
        if not sharing:  # another pod of a shared claim already holds (and is charged) this share
            on_node: dict[str, Quantity] = {}
            counted: set[Any] = set()
            for a in state.attachments:
                if a.driver != driver or a.pool != pool or a.device != name:
                    continue
                key = a.share_key()
                if key is not None and key in counted:  # one share of a claim shared by pods
                    continue
                counted.add(key)
                for k, v in a.charged(device).items():  # a record without amounts: the whole device
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
        elif not getattr(link, "admin_up", True) or getattr(link, "operstate", "UP") in _DOWN:  # no traffic: skipped
            skipped.append(f"{d.name}: interface {if_name} is down")
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
    # A NIC carrying links of the other type cannot take this one (the kernel allows one per parent).
    exclude: dict[str, str] = link_type_conflicts(state.attachments, conf.linkType, driver, pool)
    if conf.distinctFrom == "pod" and pod_uid:
        # Each of a pod's attachments on a different NIC (redundant links), across CNI calls.
        for a in state.attachments:
            if a.podUID == pod_uid and a.driver == driver:
                exclude.setdefault(a.device, "already used by this pod (distinctFrom: pod)")
    choice = select_device(
        usable, consumed, requests, conf.selectionPolicy, exclude=exclude, driver=driver,
        selectors=[s.cel.expression for s in conf.selectors],
    )
    if isinstance(choice, NoFit):
        reasons = [
            f"{dev}: {exclude.get(dev, why)}"
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
    from cni_dra.netlink import addr, sublink  # called through the modules: the seams tests patch
    from cni_dra.state.models import STEP_IPAM, STEP_LINK, ready_at
    from cni_dra.state.owner import current_owner
    from cni_dra.verbs.intent import record_step
    from cni_dra.verbs.recover import recover_pending

    env, conf = inv.env, inv.conf
    if not conf.ipam_type and not version_at_least(conf.cniVersion, "0.3.0"):
        raise IncompatibleVersionError(
            f"failed to add {env.ifname} for container {env.container_id}: an L2-only network (no ipam) has "
            f"no IP address, and a cniVersion {conf.cniVersion} result consists of ip4/ip6 entries",
            "use cniVersion 0.3.0 or newer, or configure ipam",
        )
    sock = dhcp_socket_missing(conf.ipam.model_dump())
    if sock:
        raise TryAgainLaterError(
            f"failed to add {env.ifname} for container {env.container_id}: the dhcp IPAM daemon socket {sock} "
            "is absent (is the reference dhcp daemon running?)"
        )
    recover_pending(inv)  # stale intents of crashed ADD/DEL, attachments lost in a reboot
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
                if existing.phase != "ready":
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
            if conf.mac is not None:
                _refuse_duplicate_mac(conf.mac, att, parent, state)
            att.owner = current_owner()  # intent record: recovery undoes it if this process dies
            state.attachments.append(att)
        fault_point("add:reserved")

        def release_capacity() -> None:
            with inv.store.transaction() as st:
                st.remove(*key)

        undo.append(release_capacity)
        # 2. IPAM starts now, in a thread: it does not need the link (except dhcp, whose
        # daemon configures through it: that one runs after the link, in the reference order)
        ipam_job: Concurrently | None = None
        if conf.ipam_type and conf.ipam_type != "dhcp":
            record_step(inv, STEP_IPAM)  # from here on recovery releases IPAM (a DEL of nothing is a no-op)
            ipam_job = Concurrently(lambda: ipam.ipam_add(conf.ipam_type, inv.raw, inv.environ, env.path))

            def release_ipam() -> None:
                if ipam_job.wait()[1] is None:  # it allocated: give it back
                    ipam.ipam_del(conf.ipam_type, inv.raw, inv.environ, env.path)

            undo.append(release_ipam)
        # 3. the link
        if conf.linkType == "ipvlan":
            link = sublink.create_ipvlan(
                parent=att.ifName, netns=env.netns, ifname=env.ifname, mode=conf.mode,
                flag=conf.ipvlanFlag or "bridge", mtu=conf.mtu, parent_link=parent,
            )
        else:
            link = sublink.create_macvlan(
                parent=att.ifName, netns=env.netns, ifname=env.ifname, mode=conf.mode, mtu=conf.mtu,
                mac=conf.mac, bcqueuelen=conf.bcqueuelen, parent_link=parent,
            )
        undo.append(lambda: sublink.delete_link(env.netns, env.ifname))
        _announce(env.netns, env.ifname)
        fault_point("add:link-created")
        record_step(inv, STEP_LINK)
        fault_point("add:link-recorded")
        # 4. IPAM's answer, then addresses and routes on the link
        ipam_result: Result | None = None
        if ipam_job is not None:
            with ipam_codes():
                ipam_result = ipam_job.result()
            fault_point("add:ipam-done")
            fault_point("add:ipam-recorded")
        elif conf.ipam_type:  # dhcp
            with ipam_codes():
                ipam_result = ipam.ipam_add(conf.ipam_type, inv.raw, inv.environ, env.path)
            undo.append(lambda: ipam.ipam_del(conf.ipam_type, inv.raw, inv.environ, env.path))
            fault_point("add:ipam-done")
            record_step(inv, STEP_IPAM)
            fault_point("add:ipam-recorded")
        if ipam_result is not None:
            addr.configure_interface(
                env.netns,
                env.ifname,
                addresses=[(ip.address, ip.gateway) for ip in ipam_result.ips],
                routes=[(r.dst, r.gw) for r in ipam_result.routes],
                wait_ipv6=True,
                nodad=conf.nodad,
                settle_timeout_s=conf.dadTimeoutSeconds,
                describe=False,
            )
        result = _result_from(inv, link, ipam_result)
        # The runtime gets the result in the config's version; one that cannot be expressed
        # there (0.1.0/0.2.0 without an IP) must fail here, while the undo steps still run.
        result_to_dict(result, conf.cniVersion)
        # 5. done
        with inv.store.transaction() as state:
            recorded = state.find(*key)
            if recorded is None:  # pragma: no cover - only a concurrent GC/repair could do this
                raise ClaimError(f"failed to complete ADD of {key}: the attachment vanished from state")
            recorded.phase = "ready"
            recorded.readyAt = ready_at(time.time())  # GC spares it for a grace period
            recorded.result = _result_dict(result)
            if recorded.claim is not None:  # claim mode: the agent writes it into the claim's status
                state.statusUpdates.append(claim_status_record(recorded))
            recorded.owner, recorded.steps = None, []
        fault_point("add:ready")
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
    return result_to_dict(result, "1.1.0")


def _refuse_duplicate_mac(mac: str, att: Attachment, parent: Any, state: NodeState) -> None:
    """InvalidConfigError (7) when ``mac`` is the parent's own MAC or that of another
    attachment on the same NIC (the kernel would refuse it with EADDRINUSE at link up;
    saying which attachment holds it is clearer)."""
    if parent.mac and parent.mac.lower() == mac:
        raise InvalidConfigError(f"invalid MAC {mac}: it is the address of the parent NIC {att.ifName} (device {att.device})")
    for other in state.attachments:
        if other.ifName != att.ifName or not other.result:
            continue
        for iface in other.result.get("interfaces") or []:
            if iface.get("name") == other.ifname and str(iface.get("mac", "")).lower() == mac:
                raise InvalidConfigError(
                    f"invalid MAC {mac}: already used on parent {att.ifName} by interface {other.ifname} of "
                    f"container {other.containerID} (network {other.network!r})"
                )


def _announce(netns: str, ifname: str) -> None:
    """Set ``arp_notify`` and ``ndisc_notify`` on the new link, as the reference macvlan plugin
    does: neighbours learn the address when the link comes up or moves. ndisc_notify is
    skipped (logged) when the netns has IPv6 disabled. Raises IOFailureError (5)."""
    from cni_dra.netlink import sysctl  # called as sysctl.set_sysctl_in_netns: the seam tests patch

    sysctl.set_sysctl_in_netns(netns, f"net/ipv4/conf/{ifname}/arp_notify", 1)
    try:
        sysctl.set_sysctl_in_netns(netns, f"net/ipv6/conf/{ifname}/ndisc_notify", 1)
    except IOFailureError as exc:
        log.warning("ndisc_notify not set on %s (IPv6 disabled?): %s", ifname, exc.msg)
