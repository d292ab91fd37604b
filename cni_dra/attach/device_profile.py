"""The device profile an ADD applies: the claim's prepared, validated InterfaceConfig laid
over the network config the runtime sent.

A pod's allocation result carries the profile its DeviceClass and ResourceClaim config
give it (:class:`~cni_dra.state.schema.PreparedResult`, checked at prepare against the
limits of the conflists the agent was given). ADD takes it from there, never from the
claim again, and:

1. refuses a result whose config did not validate when the claim was read
   (``profileError``: prepared by a cni-dra that had no profiles, or edited by hand);
2. checks it against this network's own limits (``profiles`` of the conflist entry ADD was
   called with: the agent may have been given another conflist, or none);
3. lays it over the config (:func:`cni_dra.protocol.profile.apply_to_netconf`) and parses
   the outcome as any config (:func:`cni_dra.protocol.config.load_conf`: CNI_ARGS and the
   runtime's ``mac`` capability still apply on top, as on any config).

The IPAM plugin keeps the runtime's config bytes: a profile shapes the link, not the
addresses. :func:`describe` is the record of what the profile made of the link, kept on the
attachment for CHECK, ``cni-dra status`` and the claim's status entry.

Errors: ClaimError (101), naming the claim, the request and why.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from cni_dra.errors import ClaimError, CniError

if TYPE_CHECKING:
    from cni_dra.attach.invocation import Invocation
    from cni_dra.protocol.config import NetConf
    from cni_dra.state.schema import PreparedClaim, PreparedResult

__all__ = ["conf_for", "describe"]


def conf_for(inv: Invocation, picked: tuple[PreparedClaim, PreparedResult] | None) -> NetConf:
    """The network config ADD builds the link from: ``inv.conf`` with the profile of the
    picked allocation result laid over it, or ``inv.conf`` itself when there is none.
    Raises ClaimError (101) as the module docstring says."""
    if picked is None:
        return inv.conf
    claim, res = picked
    where = f"claim {claim.namespace}/{claim.name} request {res.request!r}"
    if res.profileError is not None:
        raise ClaimError(
            f"failed to honour {where}: its device configuration is not valid: {res.profileError}"
        )
    if res.profile is None:
        return inv.conf
    from cni_dra.protocol.config import load_conf
    from cni_dra.protocol.profile import apply_to_netconf, check_limits

    try:
        check_limits(res.profile, inv.conf.profiles)
        netconf = apply_to_netconf(json.loads(inv.raw), res.profile)
        return load_conf(json.dumps(netconf).encode(), inv.env)
    except CniError as exc:
        raise ClaimError(
            f"failed to honour {where} on network {inv.conf.name!r}: its device profile {exc.msg}"
        ) from exc


def describe(conf: NetConf, res: PreparedResult | None) -> dict[str, Any] | None:
    """The attachment's ``profile`` record: the link fields of the effective ``conf``
    (``linkType``, ``mode``, ``ipvlanFlag`` for an ipvlan, ``mtu`` and ``mac`` when set),
    ``shaping`` (whether the link is shaped) and ``fromConfig``, the fields the DRA
    configuration set (sorted; ``shaping`` for any shaping field). None when the result
    has no profile: the conflist alone made the link, as for every attachment before."""
    if res is None or res.profile is None:
        return None
    out: dict[str, Any] = {"linkType": conf.linkType, "mode": conf.mode}
    if conf.linkType == "ipvlan":
        out["ipvlanFlag"] = conf.ipvlanFlag
    if conf.mtu is not None:
        out["mtu"] = conf.mtu
    if conf.mac is not None:
        out["mac"] = conf.mac
    out["shaping"] = conf.shaping is not None
    out["fromConfig"] = sorted(res.profile.set_fields())
    return out
