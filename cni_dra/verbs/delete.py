"""DEL: remove the link, release IPAM, then release the capacity.

Source: CNI spec 1.1.0 "DEL: Remove container from network" — DEL must succeed when the
attachment is already gone, when CNI_NETNS is empty or no longer exists, and (cni-dra)
when the parent NIC is gone. Capacity is released last, so a DEL that fails halfway (the
runtime retries it) never frees capacity whose link or IP is still held.

Errors: IpamError (the IPAM plugin's code), NetlinkError (102), TryAgainLaterError (11),
StateError (5).
"""

from __future__ import annotations

import logging

from cni_dra.verbs.common import Invocation, ipam_codes

__all__ = ["cmd_del"]

log = logging.getLogger("cni_dra.del")


def cmd_del(inv: Invocation) -> None:
    """Run DEL for ``inv`` (idempotent). See module docstring."""
    from cni_dra import ipam
    from cni_dra.netlink import links
    from cni_dra.netlink.netns import is_host_netns, netns_exists

    env, conf = inv.env, inv.conf
    key = (conf.name, env.container_id, env.ifname)
    att = inv.store.read().find(*key)
    if env.netns and netns_exists(env.netns):
        if is_host_netns(env.netns):
            log.warning("DEL %s: CNI_NETNS %s is the host namespace; no link is touched", key, env.netns)
        else:
            links.delete_link(env.netns, env.ifname)
    ipam_type = conf.ipam_type or (att.ipamType if att else None)
    if ipam_type:
        raw = inv.raw if conf.ipam_type else (att.ipamConf or "").encode()
        with ipam_codes():
            ipam.ipam_del(ipam_type, raw, inv.environ, env.path)
    if att is not None:
        with inv.store.transaction() as state:
            state.remove(*key)
