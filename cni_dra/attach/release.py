"""Release one attachment's side effects: its link in the pod netns, the ifb device that
shaped its ingress, and its IPAM reservation.

The one path by which DEL, GC and recovery take an attachment's link (also one left under
its temporary name, :func:`release_temp_link`) and address away (the
capacity goes when the caller drops the record, always after this has succeeded, so a
failure never frees capacity whose link or IP is still held).

The IPAM plugin's DEL runs in a thread while the link is deleted: the two do not depend on
each other (the reference macvlan plugin releases IPAM first, then deletes the link). The
link's deletion is done when the kernel announces it deleted; the kernel's wait before
freeing it (an RCU barrier, most of a deletion's time) goes on without the verb
(:mod:`cni_dra.netlink.dellink`). Both are waited for; a link
error is raised first, with the IPAM error noted on it. Except for ``dhcp``: its daemon
sends the DHCPRELEASE through the pod's link, so its DEL finishes before the link goes,
in the reference order.

The kernel takes the link's qdiscs with it; the ifb device (:mod:`cni_dra.netlink.shaping`)
is a link of its own in the pod netns and would outlive the pod's interface when the netns
outlives the pod, so an attachment that may be shaped has both deleted together
(:func:`~cni_dra.netlink.shaping.delete_shaped_link`: one kernel batch, so the deletion
costs about what the link's alone did), the ifb device also when the link is gone already
(a DEL retried, a crash, ``state repair`` and GC all find a leaked one this way). Only an
ifb device cni-dra made is deleted (its mark, or its link's redirect to it); one of the
same name that someone else made stays.

Errors: NetlinkError (102), IpamError (the plugin's code; its catch-all 999 becomes 103).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cni_dra.attach.invocation import Concurrently, ipam_codes
from cni_dra.errors import CniError
from cni_dra.faults import fault_point
from cni_dra.state import Attachment

if TYPE_CHECKING:
    from cni_dra.host.port import Host

__all__ = [
    "IpamRelease",
    "names_recorded_netns",
    "recorded_link_place",
    "recorded_netns_path",
    "release",
    "release_attachment",
    "release_temp_link",
]


@dataclass(frozen=True)
class IpamRelease:
    """An IPAM DEL to run: the plugin ``type``, the network config it gets on stdin and
    the CNI environment (CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS, ...)."""

    type: str
    config: bytes
    environ: Mapping[str, str]


def release(
    netns: str,
    ifname: str,
    *,
    delete_link: bool,
    ipam: IpamRelease | None,
    cni_path: Sequence[str] | None,
    host: Host,
    faults: str | None = None,
    shaped: bool = True,
) -> list[str]:
    """Delete link ``ifname`` in ``netns`` (when ``delete_link``), with its ifb device when
    ``shaped`` (the attachment may have one), and run ``ipam``'s DEL.

    ``faults``: the prefix of the crash-test fault points passed on the way (``del``: after
    the link is gone, ``del:link-deleted``; after IPAM, ``del:ipam-released``). Returns what
    was done, in words. Raises as the module docstring says.
    """
    from cni_dra.netlink.shaping import ifb_name

    done: list[str] = []
    pending = None
    if ipam is not None:
        path = list(cni_path) if cni_path else None
        if ipam.type == "dhcp":  # the release goes out through the link: before it is deleted
            with ipam_codes():
                host.ipam_del(ipam.type, ipam.config, ipam.environ, path)
            done.append(f"IPAM {ipam.type} released")
        else:
            pending = Concurrently(lambda: host.ipam_del(ipam.type, ipam.config, ipam.environ, path))
    try:
        if delete_link and shaped:
            link_gone, ifb_gone = host.delete_shaped_link(netns, ifname)
            if ifb_gone:
                done.insert(0, f"shaping of {ifname} ({ifb_name(ifname)}) removed in {netns}")
            if link_gone:
                done.insert(0, f"link {ifname} deleted in {netns}")
        elif delete_link and host.delete_link(netns, ifname):
            done.insert(0, f"link {ifname} deleted in {netns}")
        if faults:
            fault_point(f"{faults}:link-deleted")
    except BaseException as exc:
        if pending is not None:
            ipam_error = pending.wait()[1]
            if ipam_error is not None:
                exc.add_note(f"IPAM DEL failed as well: {ipam_error}")
        raise
    if pending is not None:
        with ipam_codes():
            pending.result()
        assert ipam is not None  # pending is only set for an IPAM release
        done.append(f"IPAM {ipam.type} released")
    if faults:
        fault_point(f"{faults}:ipam-released")
    return done


def release_attachment(
    att: Attachment,
    environ: Mapping[str, str],
    cni_path: Sequence[str] | None,
    *,
    host: Host,
    delete_link: bool = True,
    release_ipam: bool = True,
    netns: str | None = None,
) -> list[str]:
    """:func:`release` of a recorded attachment: its link (``delete_link``; the caller has
    checked that its netns is usable and not the host's: :func:`recorded_link_place`, whose
    answer is ``netns``, default the recorded path) and, with ``release_ipam``, the
    IPAM DEL with the config recorded at ADD, in ``environ`` plus the attachment's
    CNI_CONTAINERID, CNI_IFNAME and CNI_NETNS (and CNI_PATH from ``cni_path``). Its shaping
    goes with the link when it recorded one, or when it is an ADD that never completed (the
    record is written at the end, the ifb device may exist before)."""
    ipam = None
    if release_ipam and att.ipamType and att.ipamConf:
        env = dict(environ) | {
            "CNI_CONTAINERID": att.containerID,
            "CNI_IFNAME": att.ifname,
            "CNI_NETNS": att.netns,
        }
        if cni_path:
            env["CNI_PATH"] = ":".join(cni_path)
        ipam = IpamRelease(att.ipamType, att.ipamConf.encode(), env)
    shaped = att.shaping is not None or att.phase == "adding"
    return release(
        netns or att.netns,
        att.ifname,
        delete_link=delete_link,
        ipam=ipam,
        cni_path=cni_path,
        host=host,
        shaped=shaped,
    )


def release_temp_link(att: Attachment, host: Host) -> list[str]:
    """Delete the link an ADD of ``att`` left under the temporary name its intent records
    (``tempName``: killed between creating the link and renaming it), when it is still in
    the attachment's netns on the recorded parent
    (:func:`cni_dra.netlink.sublink.delete_temp_links`); returns what was done, in words.
    Nothing when no name is recorded, or the recorded namespace is gone (its path names
    no namespace and it is found nowhere else: :func:`recorded_netns_path`) or is the host's. Raises
    NetlinkError (102)."""
    where = recorded_netns_path(att, host) if att.tempName else None
    if where is None:
        return []
    gone = host.delete_temp_links(where, att.tempName or "", att.parent)
    return [f"temporary link {name} deleted in {where}" for name in gone]


def names_recorded_netns(att: Attachment, path: str, ident: tuple[int, int] | None, host: Host) -> bool:
    """Whether ``path``, whose namespace identity is ``ident`` (None: it names none), is the
    namespace ``att`` was added in: by the recorded identity; for a record written before
    identities were recorded, by :func:`~cni_dra.netlink.netns.same_netns` of the paths
    (equal strings match without a look)."""
    if att.netnsIdentity is not None:
        return ident is not None and att.netnsIdentity == ident
    if path == att.netns:
        return True
    return ident is not None and bool(att.netns) and host.netns_identity_or_none(att.netns) == ident


def recorded_netns_path(att: Attachment, host: Host) -> str | None:
    """A path that names the namespace ``att`` was added in now, other than the host's, or
    None. Its recorded path when that still names it: the same identity (``netnsIdentity``),
    or, for a record without one, any live network namespace there. Else, for a record with
    an identity, the entry of ``/var/run/netns`` that names it
    (:func:`~cni_dra.netlink.netns.find_netns`: the runtime moved its path, or the recorded
    path was a symlink pointed elsewhere since). None: gone (its links went with it), or
    named by no path cni-dra knows. A path that names nothing now, or something that is not
    a namespace, or cannot be looked at, is not it. Never raises."""
    if not att.netns:
        return None
    try:
        ident = host.netns_lookup(att.netns)
    except CniError:
        ident = None
    if ident is not None and (att.netnsIdentity is None or att.netnsIdentity == ident):
        return None if ident == host.host_netns_identity() else att.netns
    if att.netnsIdentity is None:
        return None
    found = host.find_netns(att.netnsIdentity)
    return None if found is None or att.netnsIdentity == host.host_netns_identity() else found


def recorded_link_place(att: Attachment, host: Host) -> str | None:
    """Where DEL (when the runtime does not name the recorded namespace), GC and recovery may
    delete ``att``'s link by name, or None: the namespace it was added in
    (:func:`recorded_netns_path`), when the link of its ifname there is absent (then only an
    ifb device it left goes) or sits on the recorded parent NIC. A namespace made later may
    have the dead one's inode (the kernel reuses them): a link of that name on another NIC,
    or on none, is someone else's. Costs up to two netlink requests. Never raises (a
    failed look: None)."""
    path = recorded_netns_path(att, host)
    if path is None:
        return None
    try:
        if host.link_in_netns(path, att.ifname) is None:
            return path
        parent = host.host_parent_of(path, att.ifname)
    except CniError:
        return None
    return path if parent is not None and parent.name == att.parent else None
