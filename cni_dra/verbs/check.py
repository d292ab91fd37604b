"""CHECK: verify the attachment is as ADD left it.

Source: CNI spec 1.1.0 "CHECK: Check container's networking is as expected" (needs
cniVersion ≥ 0.4.0 and ``prevResult``). Tolerates what later plugins of a chain change
(MTU, sysctls, extra addresses); verifies what cni-dra owns: the attachment in state,
the link's existence, kind, mode and parent NIC (as the device profile ADD applied made
them, when there was one: the attachment's ``profile`` record), that the link and its parent are
administratively up and have carrier (IFF_LOWER_UP: a pod link that cannot pass traffic
is not working as configured), the MAC and the IPs prevResult reports for our
interface, and the traffic control ADD recorded (the root tbf, the ingress redirect to the
ifb device and its tbf, with the recorded rates, queue limits and bursts; none is checked
for an attachment that was not shaped); then delegates CHECK to the IPAM plugin. The netns recorded for the interface
(prevResult ``sandbox``, else the state) must be CNI_NETNS by identity (device and inode
of the namespace), not by path string: ``/run/netns/x`` and ``/var/run/netns/x`` are the
same namespace; and CNI_NETNS must be the namespace the attachment was added in (the
identity it recorded): a namespace made again under the same path is not.

The IPAM plugin's CHECK (read-only, CNI spec) runs in a helper thread while the state is
read and the link verified, so its exec overlaps that work; a mismatch found here (or the
attachment missing) is still the error reported when both fail. CHECK changes nothing, so
it reads the state without the file lock (:meth:`~cni_dra.state.StateStore.peek`: the
record ADD made is durable before ADD returns), not waiting for the ADDs and DELs of a
burst that hold it in turn.

Errors: InvalidConfigError (7) without prevResult, ContainerUnknownError (3) when the
attachment is not in state, CheckFailedError (105) for a mismatch, IpamError.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from cni_dra.attach.invocation import Concurrently, Invocation, ipam_codes
from cni_dra.errors import CheckFailedError, ContainerUnknownError, InvalidConfigError
from cni_dra.protocol.results import parse_result

if TYPE_CHECKING:
    from cni_dra.host.port import Host
    from cni_dra.state import Attachment

__all__ = ["cmd_check"]


def cmd_check(inv: Invocation) -> None:
    """Run CHECK for ``inv``. See module docstring."""
    env, conf = inv.env, inv.conf
    if conf.prevResult is None:
        raise InvalidConfigError(f"invalid network config {conf.name!r}: CHECK requires prevResult")
    prev = parse_result(conf.prevResult, conf.cniVersion)
    key = (conf.name, env.container_id, env.ifname)
    what = f"interface {env.ifname} of container {env.container_id}"
    ipam_check = None
    ipam_type = conf.ipam_type
    if ipam_type:  # read-only: runs while the state is read and the link verified
        host = inv.host
        ipam_check = Concurrently(lambda: host.ipam_check(ipam_type, inv.raw, inv.environ, env.path))
    try:
        att = inv.store.peek().find(*key)  # read-only: no wait for the file lock ADDs and DELs take
        if att is None or att.phase != "ready":
            raise ContainerUnknownError(
                f"failed to check {what}: no attachment on network {conf.name!r} in state"
            )
        _check_link(inv, att, prev, what)
    finally:
        failure = ipam_check.wait()[1] if ipam_check is not None else None  # never left running
    if failure is not None:  # our own error, raised above, comes first
        with ipam_codes():
            raise failure


def _check_link(inv: Invocation, att: Attachment, prev: Any, what: str) -> None:
    """The link checks of :func:`cmd_check`; raises CheckFailedError (105)."""
    env, conf, host = inv.env, inv.conf, inv.host
    ident = host.netns_identity_or_none(env.netns) if att.netnsIdentity is not None else None
    if ident is not None and ident != att.netnsIdentity:  # a path that names nothing: code 3/4 below
        raise CheckFailedError(
            f"failed to check {what}: CNI_NETNS {env.netns} is not the namespace it was added in "
            "(that one is gone, or the path names another now)"
        )
    link = host.link_in_netns(env.netns, env.ifname)
    if link is None:
        raise CheckFailedError(f"failed to check {what}: the link is not in netns {env.netns}")
    if link.kind != att.linkType:
        raise CheckFailedError(f"failed to check {what}: link kind is {link.kind}, expected {att.linkType}")
    # the device profile ADD applied, when there was one, says what the link is; else the config
    mode = att.profile["mode"] if att.profile else conf.mode
    flag = att.profile.get("ipvlanFlag") if att.profile else conf.ipvlanFlag
    if link.mode and link.mode != mode:
        raise CheckFailedError(f"failed to check {what}: {link.kind} mode is {link.mode}, expected {mode}")
    if link.kind == "ipvlan" and link.ipvlan_flag and link.ipvlan_flag != flag:
        raise CheckFailedError(f"failed to check {what}: ipvlan flag is {link.ipvlan_flag}, expected {flag}")
    parent = host.host_link(att.parent)
    if parent is None or link.parent_index != parent.index:
        raise CheckFailedError(
            f"failed to check {what}: its parent is not {att.parent} (device {att.device})"
        )
    # Working as configured also means able to pass traffic: the specific cause first.
    if not link.admin_up:
        raise CheckFailedError(
            f"failed to check {what}: the link is administratively down in netns {env.netns}"
        )
    if not parent.admin_up:
        raise CheckFailedError(
            f"failed to check {what}: its parent NIC {att.parent} (device {att.device}) is administratively down"
        )
    if not parent.carrier:
        raise CheckFailedError(
            f"failed to check {what}: its parent NIC {att.parent} (device {att.device}) has no carrier (NO-CARRIER)"
        )
    if not link.carrier:
        raise CheckFailedError(f"failed to check {what}: the link has no carrier (NO-CARRIER)")
    ours = [i for i, iface in enumerate(prev.interfaces) if iface.name == env.ifname and iface.sandbox]
    sandbox = prev.interfaces[ours[-1]].sandbox if ours else att.netns
    if sandbox and not _same_netns(host, sandbox, env.netns):
        raise CheckFailedError(
            f"failed to check {what}: it was added in netns {sandbox}, not in CNI_NETNS {env.netns}"
        )
    if ours:
        want_mac = prev.interfaces[ours[-1]].mac
        if want_mac and want_mac.lower() != (link.mac or "").lower():
            raise CheckFailedError(f"failed to check {what}: MAC is {link.mac}, prevResult says {want_mac}")
    have = {ipaddress.ip_interface(a) for a in link.addresses or ()}  # link_in_netns always reads them
    for ip in prev.ips:
        if ours and ip.interface is not None and ip.interface not in ours:
            continue
        if ipaddress.ip_interface(ip.address) not in have:
            raise CheckFailedError(f"failed to check {what}: address {ip.address} is missing")
    if att.shaping:
        _check_shaping(host, att.shaping, env.netns, env.ifname, what)


def _same_netns(host: Host, a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one namespace, by identity (equal strings without
    a look; a path that names none matches nothing else)."""
    if a == b:
        return True
    ident = host.netns_identity_or_none(a)
    return ident is not None and ident == host.netns_identity_or_none(b)


def _check_shaping(host: Host, recorded: dict[str, Any], netns: str, ifname: str, what: str) -> None:
    """The kernel's shaping of ``ifname`` against the ``recorded`` one; CheckFailedError (105)."""
    from cni_dra.attach.shaping_plan import mismatch

    problem = mismatch(recorded, host.read_shaping(netns, ifname))
    if problem is not None:
        raise CheckFailedError(f"failed to check {what}: {problem}")
