"""Claim mode: which allocation result an attachment uses, and the same rule as prepare
applies it to refuse a pod's claims that give one interface several results."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_dra.attach.invocation import claim_results_for
from cni_dra.errors import ClaimError
from cni_dra.state.prepared import interface_conflicts
from cni_dra.state.schema import PreparedClaim
from tests.builders import allocation_result, resource_claim


def _claim(*results: tuple[str, str, str]) -> PreparedClaim:
    """A claim with one result per (request, driver, device), all in pool ``p``."""
    return PreparedClaim.decode(
        resource_claim(*(allocation_result(dev, request=r, driver=drv, pool="p") for r, drv, dev in results))
    )


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


def test_ambiguous_results_are_refused_naming_the_interface_claims_and_requests():
    claim = _claim(("fast", "d", "x"), ("slow", "d", "y"))
    with pytest.raises(ClaimError) as ei:
        claim_results_for([claim], "d", "net1")
    who = f"{claim.namespace}/{claim.name}"
    assert ei.value.code == 101
    assert (
        f"interface net1: the pod has 2 results from driver d (claim {who} request 'fast', "
        f"claim {who} request 'slow') and none is named 'net1'"
    ) in ei.value.msg, ei.value.msg


# -- which results serve which interface, as prepare judges it ---------------------------------


def test_one_claim_with_requests_net1_and_net2_serves_two_interfaces():
    claims = [_claim(("net1", "d", "eth-a"), ("net2", "d", "eth-b"))]
    assert interface_conflicts(claims, "d") == {}
    assert claim_results_for(claims, "d", "net2")[1].device == "eth-b"


def test_two_claims_whose_requests_share_a_name_give_that_interface_two_results():
    a, b = _claim(("net1", "d", "eth-a")), _claim(("net1", "d", "eth-b"))
    got = interface_conflicts([a, b], "d")
    assert list(got) == ["net1"] and [res.device for _, res in got["net1"]] == ["eth-a", "eth-b"]
    with pytest.raises(ClaimError):
        claim_results_for([a, b], "d", "net1")


def test_a_request_allocated_two_devices_gives_its_interface_two_results():
    claims = [_claim(("net1", "d", "eth-a"), ("net1", "d", "eth-b"))]  # count: 2, or allocationMode All
    assert list(interface_conflicts(claims, "d")) == ["net1"]


def test_a_single_result_serves_any_interface_and_other_drivers_do_not_count():
    assert interface_conflicts([_claim(("net1", "d", "eth-a"))], "d") == {}
    assert interface_conflicts([_claim(("net1", "d", "eth-a")), _claim(("net1", "other", "x"))], "d") == {}


_RESULTS = st.lists(
    st.tuples(
        st.sampled_from(["eth0", "net1", "net2", "net1/fast"]),
        st.sampled_from(["d", "other"]),
        st.sampled_from(["eth-a", "eth-b"]),
    ),
    max_size=5,
)


@given(st.lists(_RESULTS, max_size=3), st.sampled_from(["eth0", "net1", "net2", "net3"]))
def test_prepare_refuses_exactly_the_interfaces_add_could_not_pick_by_name(claims_results, ifname):
    """An interface prepare flags is one ADD refuses; any other interface named after a
    request of the pod gets that request's result (or the pod's only result)."""
    claims = [_claim(*results) for results in claims_results]
    conflicts = interface_conflicts(claims, "d")
    ours = [res for c in claims for res in c.results if res.driver == "d"]
    if ifname in conflicts:
        with pytest.raises(ClaimError):
            claim_results_for(claims, "d", ifname)
    elif len(ours) == 1:
        assert claim_results_for(claims, "d", ifname)[1] == ours[0]
    elif any(res.request == ifname for res in ours):
        assert claim_results_for(claims, "d", ifname)[1].request == ifname
    named = {}
    for res in ours:
        named[res.request] = named.get(res.request, 0) + 1
    assert sorted(conflicts) == (sorted(n for n, k in named.items() if k > 1) if len(ours) > 1 else [])
