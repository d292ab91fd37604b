"""The attachment an ADD would record: the pod's effective config (its device profile merged
in, parsed once), the NIC chosen by :func:`cni_dra.attach.placement.place`, the record in
phase ``adding``; and the MAC rule an ADD checks against the node's other attachments.

Pure over its arguments (the state, the inventory, the host's links as read by the caller)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cni_dra.attach.invocation import Invocation
from cni_dra.attach.placement import Asker, pick_result, place
from cni_dra.errors import InvalidConfigError, InventoryError, TryAgainLaterError
from cni_dra.state import Attachment, NodeState

if TYPE_CHECKING:
    from cni_dra.netlink.info import LinkInfo
    from cni_dra.protocol.config import NetConf

__all__ = ["asker_of", "effective_invocation", "plan", "plan_attachment", "refuse_duplicate_mac"]


def asker_of(inv: Invocation) -> Asker:
    env = inv.env
    return Asker(env.args.pod_uid, env.args.pod_namespace, env.args.pod_name, env.container_id, env.ifname)


def effective_invocation(runtime: Invocation, state: NodeState) -> Invocation:
    """The invocation an ADD works with from its start to its end: the device profile of the
    pod's allocation result in ``state`` (:func:`cni_dra.attach.placement.pick_result`) merged
    into the runtime's config bytes, then parsed once (:func:`cni_dra.attach.device_profile.conf_for`);
    the runtime's config when there is no profile. It remembers the result it was made from
    (:attr:`Invocation.profile_source`), which :func:`plan` checks again under the lock.
    Raises ClaimError (101) as :mod:`cni_dra.attach.device_profile` says."""
    from cni_dra.attach.device_profile import conf_for

    picked = pick_result(state, runtime.conf, asker_of(runtime))
    return runtime.with_conf(conf_for(runtime, picked), picked)


def plan_attachment(inv: Invocation, state: NodeState, host_links: dict[str, LinkInfo]) -> Attachment:
    """The attachment an ADD of ``inv`` (the runtime's invocation) would record in ``state``:
    :func:`plan` of its :func:`effective_invocation`."""
    return plan(effective_invocation(inv, state), state, host_links)[0]


def plan(inv: Invocation, state: NodeState, host_links: dict[str, LinkInfo]) -> tuple[Attachment, NetConf]:
    """The attachment this ADD would record in ``state`` (phase ``adding``, no owner yet)
    and the network config its link is made from (``inv.conf``: ``inv`` is the ADD's
    :func:`effective_invocation`), placed by :func:`cni_dra.attach.placement.place`. Pure
    over its arguments; raises as :mod:`cni_dra.attach.placement` says, InventoryError (7)
    for an inventory of another driver, and TryAgainLaterError (11) when the pod's
    allocation result in ``state`` is not the one ``inv``'s config was made from (its
    claims changed since the ADD started)."""
    from cni_dra.attach.device_profile import describe
    from cni_dra.state.schema import STEP_IPAM

    if inv.profile_source is ...:
        raise ValueError("plan needs the ADD's effective invocation (effective_invocation)")

    env = inv.env
    slice_ = inv.inventory
    driver, pool = slice_.spec.driver, slice_.spec.pool.name
    if driver != inv.conf.driver:
        raise InventoryError(
            f"invalid inventory {inv.conf.inventory}: spec.driver {driver!r} is not the configured driver "
            f"{inv.conf.driver!r}"
        )
    asker = asker_of(inv)
    picked = pick_result(state, inv.conf, asker)
    if picked != inv.profile_source:
        raise TryAgainLaterError(
            f"failed to add {env.ifname} for container {env.container_id}: the pod's prepared claims changed "
            "while the ADD started"
        )
    conf = inv.conf
    # The cluster's rounding rules matter to a standalone allocation only (claim mode
    # honours the scheduler's amounts), so only then is the agent's record read.
    fractional = picked is None and inv.fractional_capacity_range
    placement = place(state, slice_, host_links, conf, asker, picked, fractional_capacity_range=fractional)
    att = Attachment(
        network=conf.name,
        containerID=env.container_id,
        ifname=env.ifname,
        netns=env.netns or "",
        podUID=asker.pod_uid,
        podNamespace=asker.pod_namespace,
        podName=asker.pod_name,
        driver=driver,
        pool=pool,
        linkType=conf.linkType,
        ipamType=conf.ipam_type,
        ipamConf=inv.raw.decode() if conf.ipam_type else None,
        phase="adding",
        steps=(STEP_IPAM,) if conf.ipam_type else (),  # recovery runs the IPAM DEL (a no-op if none ran)
        profile=describe(conf, picked[1] if picked else None),
        **placement.fields(),
    )
    return att, conf


def refuse_duplicate_mac(mac: str, att: Attachment, parent: LinkInfo, state: NodeState) -> None:
    """InvalidConfigError (7) when ``mac`` is the parent's own MAC or that of another
    attachment on the same NIC (the kernel would refuse it with EADDRINUSE at link up;
    saying which attachment holds it is clearer)."""
    if parent.mac and parent.mac.lower() == mac:
        raise InvalidConfigError(
            f"invalid MAC {mac}: it is the address of the parent NIC {att.parent} (device {att.device})"
        )
    for other in state.attachments:
        if other.parent != att.parent or not other.result:
            continue
        for iface in other.result.get("interfaces") or []:
            if iface.get("name") == other.ifname and str(iface.get("mac", "")).lower() == mac:
                raise InvalidConfigError(
                    f"invalid MAC {mac}: already used on parent {att.parent} by interface {other.ifname} of "
                    f"container {other.containerID} (network {other.network!r})"
                )
