"""Device profiles: the shape of a pod's interface, asked for in DRA configuration.

A DeviceClass or a ResourceClaim gives cni-dra's driver opaque ``parameters`` of one
versioned type (``spec.devices.config[].opaque {driver, parameters}``; the scheduler copies
them to ``status.allocation.devices.config[]`` with ``source`` FromClass or FromClaim)::

    apiVersion: net.cni-dra.dev/v1alpha1
    kind: InterfaceConfig
    linkType: ipvlan            # macvlan | ipvlan
    mode: l3                    # macvlan: bridge private vepa passthru; ipvlan: l2 l3 l3s
    ipvlanFlag: bridge          # ipvlan only: bridge private vepa
    mtu: 9000                   # 68-65535
    mac: "02:00:00:00:00:01"    # macvlan only: a fixed unicast address
    shaping: {enabled: true, ingressBurstBytes: 262144, egressBurstBytes: 262144, latencySeconds: 0.025}

Every field but ``apiVersion`` and ``kind`` is optional: a field left out is the lower
layer's. Unknown fields are refused; the parent NIC is the allocated device and no profile
can name it. The mode names, the flags and the MAC rule are :mod:`cni_dra.iface`'s, as for
the plugin config.

Precedence, lowest first: the node's conflist entry < FromClass entries < FromClaim
entries, each group in the order the allocation lists it (a later entry wins). An entry
applies to the requests it names (``requests: [net1]``; a main request also covers its
subrequests, ``net1/fast`` only that one) or, naming none, to every request; entries of
another driver are ignored. Fields merge one by one (``shaping`` too), except that an entry
naming another ``linkType`` than the layers below drops their ``mode``, ``ipvlanFlag`` and
``mac``, which belong to the link type. Because the conflist's link type is not known when
a claim is prepared, the claim's layers must name ``linkType`` wherever they set ``mode``,
``ipvlanFlag`` or ``mac`` (:func:`result_profile`); then the profile is complete and valid
before the pod starts, and ADD lays it over its own config (:func:`apply_to_netconf`).

``shaping`` mirrors the plugin config's ``shaping`` keys: ``enabled`` false leaves the
interface unshaped (true turns shaping on where the conflist turns it off), the bursts (in
bytes) and ``latencySeconds`` override that config's. Which capacity sets the rate is the
node's business (the conflist), not the workload's.

Limits (:class:`ProfileLimits`, the ``profiles`` object of a cni-dra conflist entry) bound
what the class and claim layers may ask; the defaults let both link types and any MTU
through but no fixed MAC and no unshaped interface. What a profile asks beyond them fails
the claim at prepare (:func:`claim_profiles`), naming the claim, the request, the field and
the limit; ADD checks again against its own conflist (:func:`check_limits`).

Modules: ``model`` the parameters type, ``limits`` the node's limits, ``precedence`` the
entries, their order and targeting (each on the ones before it).

Errors: :class:`~cni_dra.errors.InvalidConfigError` (7), and
:class:`~cni_dra.errors.IOFailureError` (5) for a conflist that cannot be read.
"""

from cni_dra.protocol.profile.limits import (
    ProfileLimits,
    check_limits,
    limits_from_conflist,
    load_limits,
    strictest,
)
from cni_dra.protocol.profile.params import (
    API_VERSION,
    KIND,
    LINK_TYPES,
    InterfaceConfig,
    InterfaceProfile,
    ShapingProfile,
    parse_interface_config,
)
from cni_dra.protocol.profile.precedence import (
    SOURCES,
    ProfileEntry,
    applies_to,
    apply_to_netconf,
    claim_profiles,
    decode_result_profile,
    driver_entries,
    overlay,
    result_profile,
)

__all__ = [
    "API_VERSION",
    "KIND",
    "SOURCES",
    "LINK_TYPES",
    "ShapingProfile",
    "InterfaceProfile",
    "InterfaceConfig",
    "ProfileLimits",
    "ProfileEntry",
    "parse_interface_config",
    "driver_entries",
    "applies_to",
    "overlay",
    "result_profile",
    "check_limits",
    "claim_profiles",
    "decode_result_profile",
    "apply_to_netconf",
    "strictest",
    "limits_from_conflist",
    "load_limits",
]
