"""ADD: reserve a share of a NIC, create the macvlan in the pod netns, delegate IPAM, print the result.

Source: CNI spec 1.1.0 "ADD: Add container to network"; KEP-5075 for the capacity rules.

Steps (each effect registers its undo; a failure undoes them in reverse and re-raises):

1. under the state lock: choose the device (claim mode: the pod's prepared allocation
   result; standalone: :func:`cni_dra.allocator.select_device` over the inventory) and
   record the attachment in phase ``adding`` — the capacity is charged from here on (a
   ResourceClaim shared by several pods: each pod's interface uses the claim's one share,
   charged once, on the device the scheduler allocated);
2. start IPAM ADD (the plugin named by ``ipam.type``) in a thread; meanwhile create the
   macvlan/ipvlan in the pod netns (under the temporary name step 1 recorded, then renamed
   to CNI_IFNAME) and shape it to the attachment's consumed capacity
   (:mod:`cni_dra.attach.shaping_plan`: tbf for egress, an ifb device for ingress; traffic
   control does not depend on the addresses); then addresses
   and routes from IPAM's result on the link (dhcp, whose daemon configures through the
   link, runs after the link instead, in the reference order);
3. under the lock: the attachment becomes ``ready`` with the CNI result and the shaping record.

Errors: InvalidConfigError (7) for mtu above the parent's, and for shaping that tbf cannot
hold or a shaping capacity the device lacks (:mod:`cni_dra.attach.shaping_plan`; both before any IPAM call),
NoCapacityError (100) when nothing fits, ClaimError (101) for an allocation that cannot be
honoured (also a device profile this network's limits forbid, or whose MTU is above the
allocated parent's: :mod:`cni_dra.attach.device_profile`), NetlinkError (102; also when the kernel lacks a piece of shaping, e.g. ``kernel
lacks ifb``, unless ``shaping`` is false, or an ifb device cni-dra did not make holds the ifb name), IpamError (the IPAM plugin's code; its catch-all 999 becomes
103), TryAgainLaterError (11, also when the dhcp daemon's socket is absent), IncompatibleVersionError
(1) for an L2-only 0.1.0/0.2.0 config, InvalidConfigError (7) for a MAC already used on the parent,
StateError (5), IOFailureError (5) / InventoryError (7) for the inventory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from cni_dra.errors import (
    AttachmentExistsError,
    ClaimError,
    IncompatibleVersionError,
    InvalidConfigError,
    IOFailureError,
    TryAgainLaterError,
)
from cni_dra.faults import fault_point
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
from cni_dra.state import Attachment, NodeState

if TYPE_CHECKING:
    from cni_dra.dra.objects import ResourceSlice
    from cni_dra.host.port import Host
    from cni_dra.netlink.info import LinkInfo
    from cni_dra.netlink.netns import NetnsIdentity
    from cni_dra.netlink.sublink import SubLinkSpec
    from cni_dra.netlink.tbf import ShapeSpec
from cni_dra.attach.intent import AddIntent
from cni_dra.attach.invocation import Concurrently, Invocation, ipam_codes
from cni_dra.attach.placement import device_if_name, link_type_conflicts
from cni_dra.attach.plan import effective_invocation, plan, refuse_duplicate_mac
from cni_dra.state.claim_status import record_add_failure
from cni_dra.verbs.status import dhcp_socket_missing

__all__ = ["cmd_add", "link_type_conflicts"]

log = logging.getLogger("cni_dra.add")


def cmd_add(runtime: Invocation) -> Result:
    """Run ADD for ``runtime`` (the invocation as the runtime made it); returns the CNI
    result (newest schema). See module docstring. The ADD reads its effective config once,
    first (:func:`effective_invocation`: the device profile of the pod's allocation result
    merged into the runtime's config before it is parsed), and every step after sees that
    one object."""
    from cni_dra.attach.recover import recover_pending

    inv = effective_invocation(runtime, runtime.store.peek() if runtime.env.args.pod_uid else NodeState())
    _refuse_early(inv)
    recover_pending(inv)  # stale intents of crashed ADD/DEL, attachments lost in a reboot
    host = inv.host
    host_links = _host_links(inv, inv.inventory)
    ident = host.netns_identity(inv.env.netns)  # code 3 / 4 before any effect; recorded with the intent
    intent: AddIntent | None = None
    try:
        with ExitStack() as undo:
            # 1. reserve capacity (under the lock): the intent
            reserved = _reserve_after_recovery(inv, host_links, ident)
            if isinstance(reserved, Result):  # a repeated ADD: its recorded result
                return reserved
            intent = reserved
            fault_point("add:reserved")
            _undo_with(undo, intent.abandon)
            spec = _shape_spec(inv, intent.att, host_links[intent.att.parent])  # code 7 before any effect
            # 2. IPAM in a thread (it does not need the link), 3. the link, 4. IPAM's answer
            ipam_job = _start_ipam(inv, undo)
            temp = _add_link(inv, intent.att, host_links[intent.att.parent], undo)
            with ExitStack() as pod:  # the pod-side work: one entry into CNI_NETNS
                pod.enter_context(host.in_pod())
                link = _finish_link(inv, intent.att, temp, undo)
                shaped = _shape(inv, spec, undo)
                if ipam_job is None and inv.conf.ipam_type:  # dhcp runs in the host namespace
                    pod.close()
                ipam_result = _ipam_result(inv, ipam_job, undo)
                if ipam_result is not None:
                    pod.enter_context(host.in_pod())
                    host.configure_interface(
                        inv.env.netns,
                        inv.env.ifname,
                        addresses=[(ip.address, ip.gateway) for ip in ipam_result.ips],
                        routes=[(r.dst, r.gw) for r in ipam_result.routes],
                        nodad=inv.conf.nodad,
                        settle_timeout_s=inv.conf.dadTimeoutSeconds,
                    )
            result = _result_from(inv, link, ipam_result)
            # The runtime gets the result in the config's version; one that cannot be expressed
            # there (0.1.0/0.2.0 without an IP) must fail here, while the undo steps still run.
            result_to_dict(result, inv.conf.cniVersion)
            # 5. done
            intent.complete(_result_dict(result), shaping=shaped)
            undo.pop_all()
        fault_point("add:ready")
        return result
    except BaseException as failure:
        if intent is not None and intent.att.claim is not None:  # the agent reports it on the claim
            record_add_failure(inv.store, intent.att, failure)
        raise


def _refuse_early(inv: Invocation) -> None:
    """Before any state: an L2-only config of a result version without L2 (1), the dhcp
    daemon's socket absent (11)."""
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


def _host_links(inv: Invocation, slice_: ResourceSlice) -> dict[str, LinkInfo]:
    """Host interface name → link facts of every inventory NIC that exists."""
    out = {}
    for name in [device_if_name(d, slice_.spec.driver) for d in slice_.spec.devices]:
        found = inv.host.host_link(name)
        if found is not None:
            out[name] = found
    return out


def _undo_with(undo: ExitStack, step: Callable[[], object]) -> None:
    """Register an undo step that, when it fails, is logged and the next ones still run
    (the runtime gets the ADD's own error)."""

    def safely() -> None:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - keep undoing, report the original error
            log.error("rollback step failed: %s", exc)

    undo.callback(safely)


def _reserve_after_recovery(
    inv: Invocation, host_links: dict[str, LinkInfo], ident: NetnsIdentity
) -> AddIntent | Result:
    """:func:`_reserve`; while a live recovery holds this attachment's interrupted intent,
    wait for it (at most ``lockTimeoutSeconds``, :func:`cni_dra.attach.intent.wait_for_recovery`)
    and try again, after recovering whatever its process may have left if it died."""
    from cni_dra.attach.intent import RecoveryInProgressError, wait_for_recovery
    from cni_dra.attach.recover import recover_pending

    deadline: float | None = None
    while True:
        try:
            return _reserve(inv, host_links, ident)
        except RecoveryInProgressError as busy:
            if deadline is None:
                deadline = inv.host.monotonic() + inv.conf.lockTimeoutSeconds
            wait_for_recovery(inv, busy, deadline)
            recover_pending(inv)


def _reserve(inv: Invocation, host_links: dict[str, LinkInfo], ident: NetnsIdentity) -> AddIntent | Result:
    """The reserving transaction: a repeated ADD's recorded result, or the planned
    attachment recorded as ``adding`` with this process as owner, the link's temporary
    name and the identity ``ident`` of its namespace (recovery undoes it if the process
    dies), its capacity charged. The intent's invocation carries the config the link is
    made from (the device profile applied)."""
    from cni_dra.netlink.sublink import temp_name
    from cni_dra.state.owner import current_owner

    with inv.store.transaction() as txn:
        existing = txn.find(*inv.key)
        if existing is not None:
            return _repeated(inv, existing, ident)
        att, conf = plan(inv, txn.state, host_links)
        parent = host_links[att.parent]
        if (
            conf.mtu is not None
            and conf.mtu > parent.mtu
            and att.profile
            and "mtu" in att.profile["fromConfig"]
        ):
            claim = att.claim
            where = (
                f"claim {claim.namespace}/{claim.name} request {claim.request!r}" if claim else "the claim"
            )
            raise ClaimError(
                f"failed to honour {where}: its device profile asks mtu {conf.mtu}, above the MTU {parent.mtu} "
                f"of the allocated parent {att.parent} (device {att.device})"
            )
        if conf.mtu is not None and conf.mtu > parent.mtu:
            raise InvalidConfigError(
                f"invalid network config {conf.name!r}: mtu {conf.mtu} is above the MTU {parent.mtu} "
                f"of the chosen parent {att.parent} (device {att.device})"
            )
        if conf.mac is not None:
            refuse_duplicate_mac(conf.mac, att, parent, txn.state)
        # The link's temporary name, recorded before the link exists: recovery finds a link
        # left under it by a kill before the rename.
        intent = att.model_copy(
            update={"owner": current_owner(), "tempName": temp_name(), "netnsIdentity": ident}
        )
        return AddIntent(inv, txn.put(intent))


def _repeated(inv: Invocation, existing: Attachment, ident: NetnsIdentity) -> Result:
    """An ADD of an attachment already recorded (the runtime must not send one, CNI spec
    "ADD"): its recorded result when it is ready in the same namespace (by identity, another
    path of it is the same; a namespace made again under the recorded path is not) and its
    link is still there on the recorded parent; :class:`~cni_dra.attach.intent.RecoveryInProgressError`
    while a recovery undoes its interrupted ADD; TryAgainLaterError (11) while another ADD
    or a DEL of it runs; else AttachmentExistsError (104): the runtime DELs it first."""
    from cni_dra.attach.intent import recovery_holds, recovery_in_progress
    from cni_dra.attach.release import names_recorded_netns

    env, conf = inv.env, inv.conf
    where = names_recorded_netns(existing, env.netns, ident, inv.host)
    if existing.phase == "ready" and existing.result and where:
        if existing.netnsIdentity is None or _link_there(inv, existing, env.netns):
            log.info("ADD repeated for %s: returning the recorded result", existing.key)
            return parse_result(existing.result, "1.1.0")
        raise AttachmentExistsError(
            f"failed to add {env.ifname} for container {env.container_id}: already attached on network "
            f"{conf.name!r} in netns {existing.netns} (device {existing.device}), but its link is no longer there; "
            "DEL it first"
        )
    if existing.phase != "ready" and recovery_holds(existing):
        raise recovery_in_progress(inv, existing, "add")
    if existing.phase != "ready":
        verb = "a DEL" if existing.phase == "deleting" else "an ADD"
        raise TryAgainLaterError(
            f"failed to add {env.ifname} for container {env.container_id}: {verb} of the same "
            "attachment is still in progress"
        )
    gone = "" if where else " (CNI_NETNS names another namespace)"
    raise AttachmentExistsError(
        f"failed to add {env.ifname} for container {env.container_id}: already attached on "
        f"network {conf.name!r} in netns {existing.netns} (device {existing.device}){gone}"
    )


def _link_there(inv: Invocation, att: Attachment, netns: str) -> bool:
    """Whether ``att``'s link is in ``netns`` on its recorded parent NIC (one netlink look)."""
    from cni_dra.errors import CniError

    try:
        parent = inv.host.host_parent_of(netns, att.ifname)
    except CniError:
        return False
    return parent is not None and parent.name == att.parent


def _start_ipam(inv: Invocation, undo: ExitStack) -> Concurrently | None:
    """IPAM ADD in a thread, with its undo (except dhcp, whose daemon configures through
    the link: that one runs after it, in the reference order, see :func:`_ipam_result`)."""
    env, ipam_type, host = inv.env, inv.conf.ipam_type, inv.host
    if not ipam_type or ipam_type == "dhcp":
        return None
    job = Concurrently(lambda: host.ipam_add(ipam_type, inv.raw, inv.environ, env.path))

    def release_ipam() -> None:
        if job.wait()[1] is None:  # it allocated: give it back
            host.ipam_del(ipam_type, inv.raw, inv.environ, env.path)

    _undo_with(undo, release_ipam)
    return job


def _add_link(inv: Invocation, att: Attachment, parent: LinkInfo, undo: ExitStack) -> str:
    """The macvlan/ipvlan on ``att``'s parent NIC, made from the host namespace directly in
    the pod netns under its temporary name (returned), with its undo."""
    host, env = inv.host, inv.env
    spec = _sublink_spec(inv, att)
    temp = host.add_sublink(spec, parent_link=parent, temp=att.tempName)
    _undo_with(undo, lambda: host.delete_link(env.netns, temp))  # until renamed
    fault_point("add:link-temp")  # crash tests: the link exists under its temporary name
    return temp


def _finish_link(inv: Invocation, att: Attachment, temp: str, undo: ExitStack) -> LinkInfo:
    """Inside the pod netns: the link renamed to CNI_IFNAME and up (deleted on failure),
    with its undo, announced."""
    env, host = inv.env, inv.host
    link = host.rename_and_up(_sublink_spec(inv, att), temp)
    fault_point("add:link-renamed")
    _undo_with(undo, lambda: host.delete_link(env.netns, env.ifname))
    _announce(host, env.netns, env.ifname)
    fault_point("add:link-created")
    return link


def _sublink_spec(inv: Invocation, att: Attachment) -> SubLinkSpec:
    from cni_dra.netlink.sublink import SubLinkSpec

    env, conf = inv.env, inv.conf
    if conf.linkType == "ipvlan":
        return SubLinkSpec.ipvlan(
            parent=att.parent,
            netns=env.netns,
            ifname=env.ifname,
            mode=conf.mode,
            flag=conf.ipvlanFlag or "bridge",
            mtu=conf.mtu,
        )
    return SubLinkSpec.macvlan(
        parent=att.parent,
        netns=env.netns,
        ifname=env.ifname,
        mode=conf.mode,
        mtu=conf.mtu,
        mac=conf.mac,
        bcqueuelen=conf.bcqueuelen,
    )


def _shape_spec(inv: Invocation, att: Attachment, parent: LinkInfo) -> ShapeSpec | None:
    """What the new link is shaped to: from ``att``'s consumed capacity, the runtime's
    bandwidth request and the config (:func:`cni_dra.attach.shaping_plan.shape_spec`), on the MTU
    the link will have (the config's, else its parent's). None: not shaped. Raises
    InvalidConfigError (7) naming the key of a capacity, rate or burst tbf cannot hold."""
    from cni_dra.attach.shaping_plan import shape_spec

    conf = inv.conf
    return shape_spec(
        conf.shaping,
        att.consumedCapacity,
        conf.runtime_bandwidth,
        mtu=conf.mtu or parent.mtu,
        device=att.device,
        driver=att.driver,
    )


def _shape(inv: Invocation, spec: ShapeSpec | None, undo: ExitStack) -> dict[str, Any] | None:
    """Traffic control on the new link as ``spec`` says (:func:`_shape_spec`), with its undo
    (the ifb device would outlive the link); returns the record for the attachment, None
    when nothing is shaped. Raises NetlinkError (102), having left nothing behind."""
    from cni_dra.attach.shaping_plan import record

    env, host = inv.env, inv.host
    if spec is None:
        return None
    _undo_with(undo, lambda: host.remove_shaping(env.netns, env.ifname))
    info = host.apply_shaping(env.netns, env.ifname, spec, new_link=True)
    fault_point("add:shaped")
    return record(info)


def _ipam_result(inv: Invocation, job: Concurrently | None, undo: ExitStack) -> Result | None:
    """The IPAM plugin's result: the thread's, or (dhcp) the ADD run now, with its undo."""
    env, ipam_type, host = inv.env, inv.conf.ipam_type, inv.host
    result: Result | None = None
    if job is not None:
        with ipam_codes():
            result = job.result()
    elif ipam_type:  # dhcp
        with ipam_codes():
            result = host.ipam_add(ipam_type, inv.raw, inv.environ, env.path)
        _undo_with(undo, lambda: host.ipam_del(ipam_type, inv.raw, inv.environ, env.path))
    if ipam_type:
        fault_point("add:ipam-done")
    return result


def _result_from(inv: Invocation, link: LinkInfo, ipam_result: Result | None) -> Result:
    env, conf = inv.env, inv.conf
    prev = parse_result(conf.prevResult, conf.cniVersion) if conf.prevResult else None
    iface = Interface(name=env.ifname, mac=link.mac or "", mtu=link.mtu, sandbox=env.netns or "")
    ips: list[IPConfig] = list(ipam_result.ips) if ipam_result else []
    routes: list[Route] = list(ipam_result.routes) if ipam_result else []
    dns = ipam_result.dns if ipam_result else None
    if conf.dns:
        dns = DNS(
            nameservers=conf.dns.nameservers,
            domain=conf.dns.domain,
            search=conf.dns.search,
            options=conf.dns.options,
        )
    return merge_prev_result(prev, iface, ips, routes, dns)


def _result_dict(result: Result) -> dict[str, Any]:
    return result_to_dict(result, "1.1.0")


def _announce(host: Host, netns: str, ifname: str) -> None:
    """Set ``arp_notify`` and ``ndisc_notify`` on the new link, as the reference macvlan plugin
    does: neighbours learn the address when the link comes up or moves. ndisc_notify is
    skipped (logged) when the netns has IPv6 disabled. Raises IOFailureError (5)."""
    host.set_sysctl(netns, f"net/ipv4/conf/{ifname}/arp_notify", 1)
    try:
        host.set_sysctl(netns, f"net/ipv6/conf/{ifname}/ndisc_notify", 1)
    except IOFailureError as exc:
        log.warning("ndisc_notify not set on %s (IPv6 disabled?): %s", ifname, exc.msg)
