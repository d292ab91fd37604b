"""DEL: remove the link and release IPAM, then release the capacity.

Source: CNI spec 1.1.0 "DEL: Remove container from network" — DEL must succeed when the
attachment is already gone, when CNI_NETNS is empty or no longer exists, and (cni-dra)
when the parent NIC is gone. Capacity is released last, so a DEL that fails halfway (the
runtime retries it) never frees capacity whose link or IP is still held.

Steps: the ``deleting`` intent (:mod:`cni_dra.attach.intent`, after recovering stale
intents: an ADD killed halfway is undone there, the link it left under its temporary name
included); the link, its ifb device and IPAM released (:func:`cni_dra.attach.release.release`:
IPAM DEL beside the link deletion, ``dhcp`` first; a temporary link the record still
names, :func:`cni_dra.attach.release.release_temp_link`); the record dropped.

Which link, in which namespace (compared by identity, device and inode, never by path:
``/run/netns/x`` and ``/var/run/netns/x`` are one, :mod:`cni_dra.netlink.netns`):

* with a record, when CNI_NETNS names the namespace the attachment recorded at ADD (its
  ``netnsIdentity``; a record without one: its path): CNI_IFNAME there (the normal DEL: one
  look at CNI_NETNS, no netlink request before the deletion);
* with a record, otherwise (CNI_NETNS empty, gone, or naming another namespace, the host's
  included): the link is where the record says, so the recorded path is looked at: when it
  still names the recorded namespace and the link there is absent or sits on the recorded
  parent NIC (:func:`cni_dra.attach.release.recorded_link_place`), and no other
  attachment's record names it, it is deleted there (with its ifb device). A recorded path
  that names another namespace now (or nothing) is not it: the namespace with the recorded
  identity is looked for under ``/var/run/netns`` (one ``stat`` per entry). A link in another
  CNI_NETNS is never touched. When the recorded namespace is found nowhere, it is taken as
  gone, with its links;
* without a record: CNI_IFNAME in CNI_NETNS, unless that is gone or the host's, or another
  attachment's record names it (the same namespace, the same ifname: it belongs to that
  attachment, whose own DEL removes it), or it is not a link cni-dra would have made there.

IPAM is released and the record dropped in every case. A CNI_NETNS that is set but names
something other than a namespace, or cannot be looked at (a directory, permission denied,
a symlink loop), is refused with code 4 before anything is done; one that names nothing
(missing, ``/etc/passwd/x``, the empty file of an unmounted namespace) is a gone namespace.

Errors: IpamError (the IPAM plugin's code), NetlinkError (102), TryAgainLaterError (11),
StateError (5).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cni_dra.attach.invocation import Invocation
from cni_dra.faults import fault_point

if TYPE_CHECKING:
    from cni_dra.netlink.netns import NetnsIdentity
    from cni_dra.state import Attachment

__all__ = ["cmd_del"]

log = logging.getLogger("cni_dra.del")


def cmd_del(inv: Invocation) -> None:
    """Run DEL for ``inv`` (idempotent). See module docstring."""
    from cni_dra.attach.intent import one_delete_at_a_time

    given = inv.host.netns_lookup(inv.env.netns) if inv.env.netns else None  # code 4 here, before any effect
    with one_delete_at_a_time(inv):
        _delete(inv, given)


def _delete(inv: Invocation, given: NetnsIdentity | None) -> None:
    from cni_dra.attach.intent import begin_delete, finish_delete
    from cni_dra.attach.release import IpamRelease, release, release_temp_link

    env, conf, host = inv.env, inv.conf, inv.host
    att = begin_delete(inv)  # recovery, then the "deleting" intent; None if absent or state unreadable
    fault_point("del:intent")
    ipam_type = conf.ipam_type or (att.ipamType if att else None)
    ipam = None
    if ipam_type:
        raw = inv.raw if conf.ipam_type else (att.ipamConf or "").encode() if att else b""
        ipam = IpamRelease(ipam_type, raw, inv.environ)
    netns, delete_link = _link_to_delete(inv, att, given)
    # Shaping: the recorded one, or any when there is no record (state lost, an ADD's crash).
    shaped = att is None or att.shaping is not None
    release(
        netns,
        env.ifname,
        delete_link=delete_link,
        ipam=ipam,
        cni_path=env.path,
        host=host,
        faults="del",
        shaped=shaped,
    )
    if att is not None:
        release_temp_link(att, host)  # an ADD of it killed before its rename, whose undo failed
        finish_delete(inv)


def _link_to_delete(inv: Invocation, att: Attachment | None, given: NetnsIdentity | None) -> tuple[str, bool]:
    """(the namespace path, whether CNI_IFNAME is deleted there): see the module docstring.
    ``given``: CNI_NETNS's namespace identity, None when it is empty or names nothing."""
    from cni_dra.attach.release import names_recorded_netns, recorded_link_place

    env = inv.env
    key = inv.key
    host = given is not None and given == inv.host.host_netns_identity()
    if host:
        log.warning("DEL %s: netns %s is the host namespace; no link is touched there", key, env.netns)
    if att is not None:
        if given is not None and not host and names_recorded_netns(att, env.netns, given, inv.host):
            return env.netns, True  # its own record names this link
        if given is not None:
            log.warning(
                "DEL %s: CNI_NETNS %s is not the namespace recorded at ADD; the link is looked for in "
                "the recorded one, %s",
                key,
                env.netns,
                att.netns or "(none)",
            )
        where = recorded_link_place(att, inv.host)
        if where is None:
            return att.netns or env.netns, False  # gone with its namespace, or not ours
        return where, _unowned(inv, where)
    if given is None or host:
        return env.netns, False
    if not _unowned(inv, env.netns):
        return env.netns, False
    if _ours_without_record(inv, env.netns):
        return env.netns, True
    log.warning("DEL %s: no attachment recorded and %s is not a cni-dra link; left alone", key, env.ifname)
    return env.netns, False


def _unowned(inv: Invocation, netns: str) -> bool:
    """False (logged) when another attachment's record names CNI_IFNAME in ``netns``."""
    env = inv.env
    owner = _recorded_elsewhere(inv, netns)
    if owner is not None:
        log.warning(
            "DEL %s: %s in %s belongs to attachment %s/%s/%s; left alone",
            inv.key,
            env.ifname,
            netns,
            *owner.key,
        )
    return owner is None


def _recorded_elsewhere(inv: Invocation, netns: str) -> Attachment | None:
    """Another attachment whose record names CNI_IFNAME in ``netns`` (the same namespace by
    identity, :func:`cni_dra.attach.release.names_recorded_netns`), or None. An unreadable
    state answers None (DEL then judges the link alone, as it did before there were
    records). Raises TryAgainLaterError (11) on lock timeout."""
    from cni_dra.attach.release import names_recorded_netns
    from cni_dra.errors import StateError

    env = inv.env
    key = inv.key
    try:
        state = inv.store.read()
    except StateError:
        return None
    others = [a for a in state.attachments if a.ifname == env.ifname and a.key != key and a.netns]
    ident = inv.host.netns_identity_or_none(netns) if others else None
    for other in others:
        if names_recorded_netns(other, netns, ident, inv.host):
            return other
    return None


def _ours_without_record(inv: Invocation, netns: str) -> bool:
    """With no attachment in state, is CNI_IFNAME in ``netns`` a link cni-dra would have made?

    True for a macvlan/ipvlan whose parent is one of the inventory's NICs (state lost or a
    crash before the record): DEL then removes it. Any other link (another plugin's) is
    left alone. An unreadable inventory answers False: never delete what we cannot identify.
    """
    from cni_dra.dra.objects import device_attribute
    from cni_dra.errors import CniError

    env = inv.env
    try:
        link = inv.host.link_in_netns(netns, env.ifname)
        if link is None or link.kind not in ("macvlan", "ipvlan"):
            return False
        parent = inv.host.host_parent_of(netns, env.ifname)
        slice_ = inv.inventory
    except CniError:
        return False
    names = {device_attribute(d, "ifName", slice_.spec.driver) for d in slice_.spec.devices}
    return parent is not None and parent.name in names
