"""cni_dra.host: what a verb needs from the machine, as a port handed in.

* :mod:`cni_dra.host.port`: the :class:`~cni_dra.host.port.Host` protocol (links in the
  host and the pod namespace, addresses and routes, sysctls, traffic control, the IPAM
  plugins, namespace identity, the clock);
* :mod:`cni_dra.host.kernel`: :class:`~cni_dra.host.kernel.KernelHost`, the production
  one, on :mod:`cni_dra.netlink` and :mod:`cni_dra.ipam` (imported when first used), with
  the pod's namespace opened once per invocation.

The verbs and the attachment helpers reach the machine only through a ``Host``; the
CNI entry point (:func:`cni_dra.cni.run`) makes one per invocation; the unit tests hand
in an in-memory one. Importing this package imports neither pyroute2 nor the netlink layer.
"""
