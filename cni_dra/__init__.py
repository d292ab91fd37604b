"""cni-dra: a CNI plugin that gives pods macvlan/ipvlan shares of node NICs by bandwidth.

Layers, bottom to top (README "Architecture"):

* ``cni_dra.errors``, ``cni_dra.quantity``, ``cni_dra.iface`` (interface name, MAC and
  macvlan/ipvlan mode rules), ``cni_dra.dra`` (resource.k8s.io/v1 models),
  ``cni_dra.protocol`` (CNI env, config, results, versions) and ``cni_dra.allocator``
  (pure KEP-5075 functions);
* ``cni_dra.netlink`` (pyroute2), ``cni_dra.ipam`` (IPAM plugin delegation),
  ``cni_dra.state`` (node-local JSON state under a file lock), ``cni_dra.k8s``;
* ``cni_dra.verbs`` (orchestration of ADD/DEL/CHECK/...);
* ``cni_dra.cni`` (the CNI entry point) and ``cni_dra.cli`` (click operator CLI).
"""

__version__ = "0.1.0"
