"""cni_dra.netlink: network namespaces and rtnetlink (the only layer that imports pyroute2).

* :mod:`cni_dra.netlink.netns`: namespace identity and the scoped
  :func:`~cni_dra.netlink.netns.in_netns` switch (standard library only);
* :mod:`cni_dra.netlink.links`: links, addresses, routes, sysctls (pyroute2,
  imported on the first netlink call, not at import time);
* :mod:`cni_dra.netlink.watch`: link-change notifications (:class:`LinkEvents`, a raw
  rtnetlink socket, standard library only).

Importing this package does not import pyroute2.
"""

from cni_dra.netlink.links import (
    IPVLAN_FLAGS,
    IPVLAN_MODES,
    MACVLAN_MODES,
    LinkInfo,
    configure_interface,
    create_ipvlan,
    create_macvlan,
    delete_link,
    host_link,
    host_link_by_index,
    host_parent_of,
    link_in_netns,
    link_kind_supported,
    link_speed_bps,
    list_host_links,
    set_sysctl_in_netns,
    validate_ifname,
)
from cni_dra.netlink.netns import (
    host_netns_identity,
    in_netns,
    is_host_netns,
    netns_exists,
    netns_identity,
)
from cni_dra.netlink.watch import LinkEvents

__all__ = [
    "LinkEvents",
    "IPVLAN_FLAGS",
    "IPVLAN_MODES",
    "MACVLAN_MODES",
    "LinkInfo",
    "configure_interface",
    "create_ipvlan",
    "create_macvlan",
    "delete_link",
    "host_link",
    "host_link_by_index",
    "host_parent_of",
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
