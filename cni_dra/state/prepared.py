"""Prepared claims as cni-dra reads them: the typed view of a stored ResourceClaim.

The node state keeps each prepared claim as the API server returned it
(``NodeState.claims``); :meth:`NodeState.prepared <cni_dra.state.schema.NodeState.prepared>`
decodes each one once into a :class:`PreparedClaim` whose :class:`PreparedResult` entries
carry what cni-dra uses of an allocation result: the device, KEP-5075 ``consumedCapacity``
and ``shareID``, and the result's device profile (:mod:`cni_dra.protocol.profile`), taken
from the claim's ``status.allocation.devices.config``. Prepare refused a claim whose
profiles do not validate or break the node's limits (:func:`cni_dra.state.preparing.prepare_claim`),
so ADD reads the profile here, already checked and never parsed again in that process; a
stored claim that fails anyway (prepared by a cni-dra without profiles) decodes with
``profileError`` saying why, and ADD refuses that result rather than ignore its config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from cni_dra.protocol.profile import InterfaceProfile, decode_result_profile
from cni_dra.quantity import QuantityField
from cni_dra.state.frozen import FrozenDict

__all__ = ["PreparedClaim", "PreparedResult", "interface_conflicts"]


class PreparedResult(BaseModel):
    """One allocation result of a prepared claim (``status.allocation.devices.results[]``,
    KEP-5075 ``consumedCapacity`` and ``shareID``), as cni-dra reads it.

    ``profile``: the device profile the claim's config gives this result (its DeviceClass's
    and its own entries of the result's driver that target its request, laid over each
    other), None when no entry applies; ``profileError``: why the config gives none, when
    it does not validate (then ``profile`` is None). Only the results of cni-dra's driver
    are read for them."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    request: str = ""
    driver: str = ""
    pool: str = ""
    device: str = ""
    consumedCapacity: Annotated[dict[str, QuantityField], AfterValidator(FrozenDict)] = Field(
        default_factory=FrozenDict
    )
    shareID: str | None = None
    adminAccess: bool | None = None  # holds nothing (KEP-5075), as the scheduler counts it
    profile: InterfaceProfile | None = None
    profileError: str | None = None

    @classmethod
    def decode(cls, result: Mapping[str, Any], config: Sequence[Mapping[str, Any]] | None) -> PreparedResult:
        """The typed view of one ``results[]`` entry of an allocation whose ``config[]`` is
        ``config`` (pydantic's ValidationError when an amount is not a quantity; a profile
        that does not validate is ``profileError``, never raised)."""
        profile, error = None, None
        if config:
            profile, error = decode_result_profile(
                config,
                str(result.get("driver") or ""),
                str(result.get("request") or ""),
                result.get("shareID"),
            )
        return cls.model_validate({**result, "profile": profile, "profileError": error})


class PreparedClaim(BaseModel):
    """A prepared ResourceClaim as cni-dra reads it: its identity and its allocation
    results. The state keeps the object as the API server returned it (``NodeState.claims``);
    :meth:`NodeState.prepared <cni_dra.state.schema.NodeState.prepared>` decodes each one
    once into this."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    namespace: str = ""
    name: str = ""
    uid: str = ""
    results: tuple[PreparedResult, ...] = ()

    @classmethod
    def decode(cls, claim: Mapping[str, Any]) -> PreparedClaim:
        """The typed view of a resource.k8s.io/v1 ResourceClaim object (pydantic's
        ValidationError when an amount is not a quantity)."""
        meta = claim.get("metadata") or {}
        devices = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        config = devices.get("config")
        return cls(
            namespace=meta.get("namespace") or "",
            name=meta.get("name") or "",
            uid=meta.get("uid") or "",
            results=tuple(PreparedResult.decode(r, config) for r in devices.get("results") or ()),
        )

    @property
    def identity(self) -> str:
        """What names the claim among a pod's: its UID, else its name."""
        return self.uid or self.name

    def ref(self) -> dict[str, str]:
        """``{"namespace", "name", "uid"}``: how the agent names the claim to the API server."""
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}


def interface_conflicts(
    claims: Sequence[PreparedClaim], driver: str
) -> dict[str, list[tuple[PreparedClaim, PreparedResult]]]:
    """The interfaces a pod holding ``claims`` could not attach: interface name -> the
    results of ``driver`` that would each serve it, for every name served by more than one.

    ADD picks the result of an interface by one rule
    (:func:`cni_dra.attach.invocation.claim_results_for`): the result whose request is named
    CNI_IFNAME, else the pod's only result. So a pod with a single result has no conflict
    (it serves any interface name); with several, each result serves the interface named
    after its request, and a request name that several results carry (two claims with a
    request of the same name, or one request allocated several devices: ``count``,
    ``allocationMode: All``) names an interface ADD must refuse. Several results named
    apart (one claim with requests ``net1`` and ``net2``, or two claims so named) serve one
    interface each. Empty: every interface the pod's results can serve is unambiguous.
    Pure."""
    results = [(claim, res) for claim in claims for res in claim.results if res.driver == driver]
    if len(results) <= 1:
        return {}
    by_name: dict[str, list[tuple[PreparedClaim, PreparedResult]]] = {}
    for claim, res in results:
        by_name.setdefault(res.request, []).append((claim, res))
    return {name: found for name, found in by_name.items() if len(found) > 1}
