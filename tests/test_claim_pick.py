"""Claim mode: which allocation result an attachment uses."""

from __future__ import annotations

import pytest

from cni_dra.errors import ClaimError
from cni_dra.state.models import PreparedClaim
from cni_dra.verbs.common import claim_results_for
from tests.builders import allocation_result, resource_claim


def _claim(*results: tuple[str, str, str]) -> PreparedClaim:
    """A claim with one result per (request, driver, device), all in pool ``p``."""
    return PreparedClaim.decode(
        resource_claim(*(allocation_result(dev, request=r, driver=drv, pool="p") for r, drv, dev in results)))


def test_no_result_of_this_driver_means_standalone():
    assert claim_results_for([_claim(("net", "other.dev", "x"))], "net.cni-dra.dev", "eth0") is None
    assert claim_results_for([], "net.cni-dra.dev", "eth0") is None


def test_only_result_is_used_whatever_the_ifname():
    _, res = claim_results_for([_claim(("net", "d", "eth-b"))], "d", "eth0")
    assert res.device == "eth-b"


def test_result_named_like_ifname_wins():
    claims = [_claim(("eth0", "d", "eth-a"), ("net1", "d", "eth-b"))]
    assert claim_results_for(claims, "d", "net1")[1].device == "eth-b"
    assert claim_results_for(claims, "d", "eth0")[1].device == "eth-a"


def test_ambiguous_results_are_refused_naming_requests():
    with pytest.raises(ClaimError) as ei:
        claim_results_for([_claim(("a", "d", "x"), ("b", "d", "y"))], "d", "eth0")
    assert ei.value.code == 101 and "a, b" in ei.value.msg
