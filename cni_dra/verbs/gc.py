"""GC: release every attachment of this network that the runtime no longer knows.

Source: CNI spec 1.1.0 "GC: Clean up any stale resources" (config version >= 1.1.0,
gated by the entry point with code 1) — the config carries ``cni.dev/valid-attachments``
(older runtimes: ``cni.dev/attachments``), a list of ``{"containerID", "ifname"}``. For each
attachment of this network (``name``) in state that is not listed: delete its link (unless
its netns is gone or is the host's), release its IPAM with the config recorded at ADD,
release its capacity. Then GC is forwarded to the IPAM plugin (skipped for plugins older
than spec 1.1.0, which have no GC). Errors are collected and GC continues past them; the
first is raised at the end (its own CNI code), its ``details`` listing every failure.
"""

from __future__ import annotations

import logging

from cni_dra.errors import CniError
from cni_dra.verbs.common import Invocation, ipam_codes

__all__ = ["cmd_gc"]

log = logging.getLogger("cni_dra.gc")


def cmd_gc(inv: Invocation) -> None:
    """Run GC for ``inv``. See module docstring."""
    from cni_dra import ipam
    from cni_dra.netlink import links
    from cni_dra.netlink.netns import is_host_netns, netns_exists

    from cni_dra.verbs.recover import recover_pending

    conf = inv.conf
    recover_pending(inv)  # stale intents and attachments lost in a reboot, before judging the rest
    valid = conf.valid_attachments
    keep = {(a.get("containerID"), a.get("ifname")) for a in valid}
    stale = [a for a in inv.store.read().attachments if a.network == conf.name and (a.containerID, a.ifname) not in keep]
    errors: list[CniError] = []
    for att in stale:
        try:
            if att.netns and netns_exists(att.netns) and not is_host_netns(att.netns):
                links.delete_link(att.netns, att.ifname)
            if att.ipamType and att.ipamConf:
                env = inv.environ | {"CNI_CONTAINERID": att.containerID, "CNI_IFNAME": att.ifname, "CNI_NETNS": att.netns}
                with ipam_codes():
                    ipam.ipam_del(att.ipamType, att.ipamConf.encode(), env, inv.env.path)
            with inv.store.transaction() as state:
                state.remove(*att.key)
        except CniError as exc:
            log.error("GC of %s failed: %s", att.key, exc.msg)
            exc.msg = f"failed to garbage-collect attachment {att.containerID}/{att.ifname}: {exc.msg}"
            errors.append(exc)
    if conf.ipam_type:
        try:
            with ipam_codes():
                ipam.ipam_gc(conf.ipam_type, inv.raw, inv.environ, inv.env.path)
        except CniError as exc:
            log.error("IPAM GC failed: %s", exc.msg)
            errors.append(exc)
    if errors:
        first = errors[0]
        if len(errors) > 1:
            first.details = "; ".join(e.msg for e in errors)
        raise first
