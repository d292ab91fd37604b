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

Errors: IpamError (the IPAM plugin's code), NetlinkError (102), TryAgainLaterError (11),
StateError (5).
"""

from __future__ import annotations

import logging

from cni_dra.faults import fault_point
from cni_dra.verbs.common import Invocation

__all__ = ["cmd_del"]

log = logging.getLogger("cni_dra.del")


def cmd_del(inv: Invocation) -> None:
    """Run DEL for ``inv`` (idempotent). See module docstring."""
    from cni_dra.netlink import netns as netns_ops  # called through the module: the seam tests patch
    from cni_dra.verbs.intent import begin_delete, finish_delete
    from cni_dra.verbs.release import IpamRelease, release, release_temp_link

    env, conf = inv.env, inv.conf
    key = (conf.name, env.container_id, env.ifname)
    att = begin_delete(inv)  # recovery, then the "deleting" intent; None if absent or state unreadable
    fault_point("del:intent")
    ipam_type = conf.ipam_type or (att.ipamType if att else None)
    ipam = None
    if ipam_type:
        raw = inv.raw if conf.ipam_type else (att.ipamConf or "").encode() if att else b""
        ipam = IpamRelease(ipam_type, raw, inv.environ)
    delete_link = False
    if env.netns and netns_ops.netns_exists(env.netns):
        if netns_ops.is_host_netns(env.netns):
            log.warning("DEL %s: CNI_NETNS %s is the host namespace; no link is touched", key, env.netns)
        elif att is not None or _ours_without_record(inv):
            delete_link = True
        else:
            log.warning("DEL %s: no attachment recorded and %s is not a cni-dra link; left alone", key, env.ifname)
    # Shaping: the recorded one, or any when there is no record (state lost, an ADD's crash).
    shaped = att is None or att.shaping is not None
    release(env.netns or "", env.ifname, delete_link=delete_link, ipam=ipam, cni_path=env.path, faults="del",
            shaped=shaped)
    if att is not None:
        release_temp_link(att)  # an ADD of it killed before its rename, whose undo failed
        finish_delete(inv)


def _ours_without_record(inv: Invocation) -> bool:
    """With no attachment in state, is CNI_IFNAME in the netns a link cni-dra would have made?

    True for a macvlan/ipvlan whose parent is one of the inventory's NICs (state lost or a
    crash before the record): DEL then removes it. Any other link (another plugin's) is
    left alone. An unreadable inventory answers False: never delete what we cannot identify.
    """
    from cni_dra.dra.models import device_attribute
    from cni_dra.errors import CniError
    from cni_dra.netlink import info

    env = inv.env
    try:
        link = info.link_in_netns(env.netns, env.ifname)
        if link is None or link.kind not in ("macvlan", "ipvlan"):
            return False
        parent = info.host_parent_of(env.netns, env.ifname)
        slice_ = inv.inventory
    except CniError:
        return False
    names = {device_attribute(d, "ifName", slice_.spec.driver) for d in slice_.spec.devices}
    return parent is not None and parent.name in names
