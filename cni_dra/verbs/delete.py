"""DEL: remove the link and release IPAM, then release the capacity.

Source: CNI spec 1.1.0 "DEL: Remove container from network" — DEL must succeed when the
attachment is already gone, when CNI_NETNS is empty or no longer exists, and (cni-dra)
when the parent NIC is gone. Capacity is released last, so a DEL that fails halfway (the
runtime retries it) never frees capacity whose link or IP is still held.

Steps: the ``deleting`` intent (:mod:`cni_dra.verbs.intent`, after recovering stale
intents: an ADD killed halfway is undone there, the link it left under its temporary name
included); the link, its ifb device and IPAM released (:func:`cni_dra.verbs.release.release`:
IPAM DEL beside the link deletion, ``dhcp`` first; a temporary link the record still
names, :func:`cni_dra.verbs.release.release_temp_link`); the record dropped.

Which link: CNI_IFNAME in CNI_NETNS, or, when CNI_NETNS is empty (the spec allows it for
DEL), in the namespace the attachment recorded at ADD, if it still exists and the link there
sits on the recorded parent NIC. Namespaces are compared by identity (device and inode,
:func:`cni_dra.netlink.netns.same_netns`), never by path: ``/run/netns/x`` and
``/var/run/netns/x`` are one. A link that another attachment's record names (the same
namespace, the same ifname) is never deleted by a DEL that has no record of its own in that
namespace: it belongs to that attachment, whose own DEL removes it.

Errors: IpamError (the IPAM plugin's code), NetlinkError (102), TryAgainLaterError (11),
StateError (5).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cni_dra.faults import fault_point
from cni_dra.verbs.common import Invocation

if TYPE_CHECKING:
    from cni_dra.state import Attachment

__all__ = ["cmd_del"]

log = logging.getLogger("cni_dra.del")


def cmd_del(inv: Invocation) -> None:
    """Run DEL for ``inv`` (idempotent). See module docstring."""
    from cni_dra.verbs.intent import begin_delete, finish_delete
    from cni_dra.verbs.release import IpamRelease, release, release_temp_link

    env, conf = inv.env, inv.conf
    att = begin_delete(inv)  # recovery, then the "deleting" intent; None if absent or state unreadable
    fault_point("del:intent")
    ipam_type = conf.ipam_type or (att.ipamType if att else None)
    ipam = None
    if ipam_type:
        raw = inv.raw if conf.ipam_type else (att.ipamConf or "").encode() if att else b""
        ipam = IpamRelease(ipam_type, raw, inv.environ)
    # An empty CNI_NETNS (allowed for DEL): the namespace the attachment recorded.
    netns = env.netns or (att.netns if att is not None else "")
    delete_link = _may_delete_link(inv, att, netns)
    # Shaping: the recorded one, or any when there is no record (state lost, an ADD's crash).
    shaped = att is None or att.shaping is not None
    release(netns, env.ifname, delete_link=delete_link, ipam=ipam, cni_path=env.path, faults="del",
            shaped=shaped)
    if att is not None:
        release_temp_link(att)  # an ADD of it killed before its rename, whose undo failed
        finish_delete(inv)


def _may_delete_link(inv: Invocation, att: Attachment | None, netns: str) -> bool:
    """Whether DEL deletes CNI_IFNAME in ``netns`` (CNI_NETNS, or the recorded namespace when
    it is empty): see the module docstring. Raises as :func:`~cni_dra.netlink.netns.netns_exists`
    for a CNI_NETNS that exists but is no namespace; a recorded one is only judged gone then."""
    from cni_dra.errors import CniError
    from cni_dra.netlink import netns as netns_ops  # called through the module: the seam tests patch

    env = inv.env
    key = (inv.conf.name, env.container_id, env.ifname)
    recorded = not env.netns  # the namespace is the record's, not the runtime's
    try:
        if not netns or not netns_ops.netns_exists(netns):
            return False
        if netns_ops.is_host_netns(netns):
            log.warning("DEL %s: netns %s is the host namespace; no link is touched", key, netns)
            return False
    except CniError:
        if recorded:
            return False
        raise
    if att is not None and not recorded and netns_ops.same_netns(att.netns, netns):
        return True  # its own record names this link (equal paths cost no look)
    owner = _recorded_elsewhere(inv, netns)
    if owner is not None:
        log.warning("DEL %s: %s in %s belongs to attachment %s/%s/%s; left alone", key, env.ifname, netns,
                    *owner.key)
        return False
    if att is not None:
        return not recorded or _on_recorded_parent(att, netns)
    if _ours_without_record(inv, netns):
        return True
    log.warning("DEL %s: no attachment recorded and %s is not a cni-dra link; left alone", key, env.ifname)
    return False


def _recorded_elsewhere(inv: Invocation, netns: str) -> Attachment | None:
    """Another attachment whose record names CNI_IFNAME in ``netns`` (compared by namespace
    identity), or None. An unreadable state answers None (DEL then judges the link alone, as
    it did before there were records). Raises TryAgainLaterError (11) on lock timeout."""
    from cni_dra.errors import StateError
    from cni_dra.netlink.netns import netns_identity_or_none

    env = inv.env
    key = (inv.conf.name, env.container_id, env.ifname)
    try:
        state = inv.store.read()
    except StateError:
        return None
    others = [a for a in state.attachments if a.ifname == env.ifname and a.key != key and a.netns]
    ident = netns_identity_or_none(netns) if others else None
    for other in others:
        if other.netns == netns or (ident is not None and netns_identity_or_none(other.netns) == ident):
            return other
    return None


def _on_recorded_parent(att: Attachment, netns: str) -> bool:
    """Whether the attachment's link in ``netns`` sits on its recorded parent NIC (a recorded
    path that names another namespace now, a ``/proc/PID`` one reused, holds someone else's)."""
    from cni_dra.errors import CniError
    from cni_dra.netlink import info

    try:
        parent = info.host_parent_of(netns, att.ifname)
    except CniError:
        return False
    return parent is not None and parent.name == att.parent


def _ours_without_record(inv: Invocation, netns: str) -> bool:
    """With no attachment in state, is CNI_IFNAME in ``netns`` a link cni-dra would have made?

    True for a macvlan/ipvlan whose parent is one of the inventory's NICs (state lost or a
    crash before the record): DEL then removes it. Any other link (another plugin's) is
    left alone. An unreadable inventory answers False: never delete what we cannot identify.
    """
    from cni_dra.dra.models import device_attribute
    from cni_dra.errors import CniError
    from cni_dra.netlink import info

    env = inv.env
    try:
        link = info.link_in_netns(netns, env.ifname)
        if link is None or link.kind not in ("macvlan", "ipvlan"):
            return False
        parent = info.host_parent_of(netns, env.ifname)
        slice_ = inv.inventory
    except CniError:
        return False
    names = {device_attribute(d, "ifName", slice_.spec.driver) for d in slice_.spec.devices}
    return parent is not None and parent.name in names
