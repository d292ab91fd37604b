"""cni_dra.netlink: network namespaces and rtnetlink (the only layer that imports pyroute2).

One module per job:

* :mod:`cni_dra.netlink.netns`: namespace identity and the scoped
  :func:`~cni_dra.netlink.netns.in_netns` switch (standard library only);
* :mod:`cni_dra.netlink._pyroute2`: pyroute2, loaded on the first netlink call, and its
  errors translated into :class:`~cni_dra.errors.NetlinkError`;
* :mod:`cni_dra.netlink.sockets`: every rtnetlink socket (per call, the kept host socket
  of long-lived threads, inside a pod netns, subscribed to events);
* :mod:`cni_dra.netlink.info`: :class:`LinkInfo` decoded from RTM_NEWLINK, host link
  queries, a pod link and its host parent;
* :mod:`cni_dra.netlink.sublink`: macvlan/ipvlan creation from one spec object, deletion,
  the kernel's link kinds;
* :mod:`cni_dra.netlink.addr`: addresses, routes and IPv6 DAD on a pod link;
* :mod:`cni_dra.netlink.sysctl`: per-netns sysctls;
* :mod:`cni_dra.netlink.watch`: link-change notifications (:class:`LinkEvents`);
* :mod:`cni_dra.netlink.tbf`: the token buckets shaping installs and the bounds within which
  tbf holds them (pure);
* :mod:`cni_dra.netlink.shaping`: traffic control on a pod interface (tbf egress, ingress
  through an ifb device), applied, removed and read back.

Interface names, MACs and macvlan/ipvlan modes follow :mod:`cni_dra.iface`, the rules the
CNI protocol layer applies too. Importing this package does not import pyroute2.
"""

from cni_dra.iface import IPVLAN_FLAGS, IPVLAN_MODES, MACVLAN_MODES, validate_ifname
from cni_dra.netlink.addr import configure_interface
from cni_dra.netlink.info import (
    LinkInfo,
    host_link,
    host_link_by_index,
    host_parent_of,
    link_in_netns,
    link_speed_bps,
    list_host_links,
)
from cni_dra.netlink.netns import (
    host_netns_identity,
    in_netns,
    is_host_netns,
    netns_exists,
    netns_identity,
)
from cni_dra.netlink.sockets import keep_host_socket
from cni_dra.netlink.sublink import (
    SubLinkSpec,
    create_ipvlan,
    create_macvlan,
    create_sublink,
    delete_link,
    link_kind_supported,
)
from cni_dra.netlink.sysctl import set_sysctl_in_netns
from cni_dra.netlink.watch import LinkEvents

__all__ = [
    "LinkEvents",
    "IPVLAN_FLAGS",
    "IPVLAN_MODES",
    "MACVLAN_MODES",
    "LinkInfo",
    "SubLinkSpec",
    "configure_interface",
    "create_ipvlan",
    "create_macvlan",
    "create_sublink",
    "delete_link",
    "host_link",
    "host_link_by_index",
    "host_parent_of",
    "keep_host_socket",
    "link_in_netns",
    "link_kind_supported",
    "link_speed_bps",
    "list_host_links",
    "set_sysctl_in_netns",
    "validate_ifname",
    "host_netns_identity",
    "in_netns",
    "is_host_netns",
    "netns_exists",
    "netns_identity",
]
