"""``runtimeConfig.bandwidth`` as the runtimes really send it: containerd marshals Go's
field names (``IngressRate``, ``IngressBurst``, ``EgressRate``, ``EgressBurst``: its struct
has no JSON tags), CRI-O the conventions' (``ingressRate``...). Go's JSON decoding, and so
the reference bandwidth plugin, matches either; cni-dra must too, or a pod's
``kubernetes.io/egress-bandwidth`` annotation is dropped under containerd. Keys that match
no field are ignored, as the conventions say, but logged."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_dra.attach.shaping_plan import shape_spec
from cni_dra.netlink.shaping import MIN_BURST_BYTES, ShapeSpec
from cni_dra.protocol.config import RuntimeBandwidth, ShapingConfig, load_conf
from tests.builders import netconf_bytes

M = 1_000_000
MAX_U32 = 2**32 - 1
FIELDS = ("ingressRate", "ingressBurst", "egressRate", "egressBurst")


def _runtime(bandwidth: dict) -> RuntimeBandwidth | None:
    return load_conf(
        netconf_bytes(runtimeConfig={"bandwidth": bandwidth}, capabilities={"bandwidth": True})
    ).runtime_bandwidth


def test_containerds_go_field_names_are_read() -> None:
    # what containerd 2.1 sent for kubernetes.io/egress-bandwidth: 100M and ingress-bandwidth: 5G
    sent = {"IngressRate": 5000 * M, "IngressBurst": MAX_U32, "EgressRate": 100 * M, "EgressBurst": MAX_U32}
    assert _runtime(sent) == RuntimeBandwidth(
        ingressRate=5000 * M, ingressBurst=MAX_U32, egressRate=100 * M, egressBurst=MAX_U32
    )


def test_containerds_egress_annotation_lowers_a_1g_share_and_its_ingress_one_does_not_raise_it() -> None:
    sent = {"IngressRate": 5000 * M, "IngressBurst": MAX_U32, "EgressRate": 100 * M, "EgressBurst": MAX_U32}
    spec = shape_spec(ShapingConfig(), {"bandwidth": "1G"}, _runtime(sent))
    # bursts: containerd's 2^32-1 bits leave each default (128 KiB at 100M, 2 ms = 250 kB at 1G)
    assert spec == ShapeSpec(
        egress_rate_bps=100 * M,
        egress_burst_bytes=MIN_BURST_BYTES,
        ingress_rate_bps=1000 * M,
        ingress_burst_bytes=250_000,
    )


@given(st.sampled_from(FIELDS), st.integers(0, 2**64 - 1), st.data())
def test_a_field_is_matched_in_any_case(field: str, value: int, data: st.DataObject) -> None:
    flips = data.draw(st.lists(st.booleans(), min_size=len(field), max_size=len(field)))
    key = "".join(c.swapcase() if f else c for c, f in zip(field, flips, strict=True))
    assert _runtime({key: value}) == RuntimeBandwidth(**{field: value})


def test_a_later_key_wins_over_an_earlier_spelling_of_the_same_field_as_in_go() -> None:
    assert _runtime({"egressRate": 1 * M, "EgressRate": 2 * M}) == RuntimeBandwidth(egressRate=2 * M)
    assert _runtime({"EgressRate": 2 * M, "egressRate": 1 * M}) == RuntimeBandwidth(egressRate=1 * M)


def test_a_bad_value_under_a_go_name_is_still_code_7() -> None:
    from cni_dra.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError) as err:
        _runtime({"EgressRate": -1})
    assert err.value.code == 7 and "runtimeConfig.bandwidth: egressRate" in err.value.msg, err.value.msg


def test_unknown_keys_are_ignored_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cni_dra.protocol.config"):
        got = _runtime(
            {"EgressRate": 5 * M, "shapedSubnets": ["10.0.0.0/8"], "egress_rate": 7, "égressRate": 9}
        )
    assert got == RuntimeBandwidth(egressRate=5 * M)
    (rec,) = [r for r in caplog.records if r.name == "cni_dra.protocol.config"]
    assert rec.levelno == logging.WARNING
    msg = rec.getMessage()
    assert (
        "runtimeConfig.bandwidth: ignoring unknown key(s) 'shapedSubnets', 'egress_rate', 'égressRate'" in msg
    ), msg
    assert "EgressRate" not in msg


def test_known_keys_log_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="cni_dra.protocol.config"):
        _runtime({"IngressRate": M, "egressRate": M})
        load_conf(
            netconf_bytes(runtimeConfig={"bandwidth": {"bogus": 1}})
        )  # capability not declared: not read
    assert not [r for r in caplog.records if r.name == "cni_dra.protocol.config"]
