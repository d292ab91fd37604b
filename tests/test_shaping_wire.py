"""Shaping wired into the product, without a kernel: the ``shaping`` config, what an attachment
is shaped to (its consumed capacity, lowered by the runtime's ``runtimeConfig.bandwidth``,
never raised), the record ADD keeps and CHECK compares, DEL/GC/recovery's release, and the
status report and metrics. The machine is the in-memory host (tests/fake_host.py) handed to the entry point;
netns_tests/test_plugin_shaping.py runs the real thing."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_dra.attach.shaping_plan import mismatch, record, shape_spec
from cni_dra.cni import run
from cni_dra.errors import InvalidConfigError, NetlinkError, UnsupportedFieldError
from cni_dra.netlink import shaping, sublink
from cni_dra.netlink.shaping import MAX_RATE_BPS, MIN_BURST_BYTES, ShapeInfo, ShapeSpec, Tbf
from cni_dra.protocol.config import DEFAULT_SHAPING_LATENCY_S, RuntimeBandwidth, ShapingConfig, load_conf
from cni_dra.state import StateStore
from tests.builders import attachment, device, netconf_bytes, write_slice
from tests.fake_host import FakeHost
from tests.tbf_model import as_the_kernel_holds_it, holds_as_asked

M = 1_000_000
MAX_U32 = 2**32 - 1


# -- the config --------------------------------------------------------------------------------


def test_shaping_is_on_by_default_on_the_bandwidth_capacity() -> None:
    conf = load_conf(netconf_bytes())
    assert conf.shaping == ShapingConfig()
    assert conf.shaping is not None and conf.shaping.capacities == ("bandwidth", "bandwidth")
    assert conf.shaping.latencySeconds == DEFAULT_SHAPING_LATENCY_S == 0.025
    assert load_conf(netconf_bytes(shaping=True)).shaping == ShapingConfig()
    assert load_conf(netconf_bytes(shaping=False)).shaping is None


@pytest.mark.parametrize(
    ("shaping", "capacities"),
    [
        ({"capacity": "net.example.com/bw"}, ("net.example.com/bw", "net.example.com/bw")),
        (
            {"ingressCapacity": "ingressBandwidth", "egressCapacity": "egressBandwidth"},
            ("egressBandwidth", "ingressBandwidth"),
        ),
        ({"egressCapacity": "egressBandwidth"}, ("egressBandwidth", None)),
    ],
)
def test_which_capacity_shapes_which_direction(shaping: dict, capacities: tuple) -> None:
    conf = load_conf(netconf_bytes(shaping=shaping))
    assert conf.shaping is not None and conf.shaping.capacities == capacities


def test_overrides_are_read() -> None:
    conf = load_conf(
        netconf_bytes(
            shaping={"ingressBurstBytes": 200_000, "egressBurstBytes": 65536, "latencySeconds": 0.1}
        )
    )
    assert conf.shaping == ShapingConfig(
        ingressBurstBytes=200_000, egressBurstBytes=65536, latencySeconds=0.1
    )


@pytest.mark.parametrize(
    ("shaping", "says"),
    [
        ("yes", 'shaping: must be true, false or an object, not "yes"'),
        (None, "shaping: must be true, false or an object, not null"),
        (1, "shaping: must be true, false or an object, not 1"),
        ({"capacity": "9bad"}, "shaping.capacity: '9bad' is not a capacity name"),
        ({"capacity": "a" * 33}, "is not a capacity name"),
        ({"capacity": "Bad_Domain/bw"}, "is not a capacity name"),
        ({"capacity": 5}, "shaping.capacity: Input should be a valid string"),
        (
            {"capacity": "bandwidth", "egressCapacity": "egressBandwidth"},
            "shaping: capacity (both directions) and ingressCapacity/egressCapacity (one each) are exclusive",
        ),
        ({"ingressBurstBytes": 0}, "shaping.ingressBurstBytes: Input should be greater than or equal to 1"),
        (
            {"egressBurstBytes": 2**32},
            "shaping.egressBurstBytes: Input should be less than or equal to 4294967295",
        ),
        ({"egressBurstBytes": "1M"}, "shaping.egressBurstBytes: Input should be a valid integer"),
        ({"latencySeconds": 0}, "shaping.latencySeconds: Input should be greater than 0"),
        ({"latencySeconds": 11}, "shaping.latencySeconds: Input should be less than or equal to 10"),
    ],
)
def test_bad_shaping_is_code_7_naming_the_key(shaping: Any, says: str) -> None:
    with pytest.raises(InvalidConfigError) as err:
        load_conf(netconf_bytes(shaping=shaping))
    assert err.value.code == 7 and says in err.value.msg, err.value.msg


def test_an_unknown_shaping_key_is_code_2_naming_it() -> None:
    with pytest.raises(UnsupportedFieldError) as err:
        load_conf(netconf_bytes(shaping={"rate": "1G"}))
    assert err.value.code == 2 and "unknown field 'shaping.rate'" in err.value.msg


def test_runtime_bandwidth_needs_its_capability() -> None:
    rc = {"bandwidth": {"ingressRate": 100 * M, "ingressBurst": MAX_U32}}
    assert load_conf(netconf_bytes(runtimeConfig=rc)).runtime_bandwidth is None
    conf = load_conf(netconf_bytes(runtimeConfig=rc, capabilities={"bandwidth": True}))
    assert conf.runtime_bandwidth == RuntimeBandwidth(ingressRate=100 * M, ingressBurst=MAX_U32)
    # keys it does not know (a newer runtime's) are ignored, as the CNI conventions say
    rc2 = {"bandwidth": {"egressRate": 5, "shapedSubnets": []}}
    assert load_conf(
        netconf_bytes(runtimeConfig=rc2, capabilities={"bandwidth": True})
    ).runtime_bandwidth == RuntimeBandwidth(egressRate=5)


@pytest.mark.parametrize(
    ("bandwidth", "says"),
    [
        (
            {"ingressRate": -1},
            "runtimeConfig.bandwidth: ingressRate: Input should be greater than or equal to 0",
        ),
        ({"egressBurst": "1M"}, "runtimeConfig.bandwidth: egressBurst: Input should be a valid integer"),
        ({"egressRate": 2**64}, "egressRate: Input should be less than or equal to"),
        ("fast", "runtimeConfig.bandwidth: Input should be a valid dictionary"),
    ],
)
def test_bad_runtime_bandwidth_is_code_7(bandwidth: Any, says: str) -> None:
    with pytest.raises(InvalidConfigError) as err:
        load_conf(netconf_bytes(runtimeConfig={"bandwidth": bandwidth}, capabilities={"bandwidth": True}))
    assert err.value.code == 7 and says in err.value.msg, err.value.msg


# -- what an attachment is shaped to ------------------------------------------------------------

ON = ShapingConfig()


def test_the_consumed_amount_is_the_rate_of_both_directions() -> None:
    assert shape_spec(ON, {"bandwidth": "300M"}) == ShapeSpec.symmetric(300 * M)
    assert shape_spec(ON, {"bandwidth": "1.5G", "other": "1"}) == ShapeSpec.symmetric(1500 * M)
    assert shape_spec(ON, {"bandwidth": "100500500m"}) == ShapeSpec.symmetric(
        100500
    )  # whole bits, rounded down


@pytest.mark.parametrize("consumed", [{}, {"bandwidth": "0", "other": "1G"}])
def test_no_amount_no_shaping(consumed: dict) -> None:
    """No amount recorded (a dedicated device, an old state) or a zero one: not shaped."""
    assert shape_spec(ON, consumed) is None


@pytest.mark.parametrize(
    ("conf", "consumed", "says"),
    [
        (
            ShapingConfig(capacity="egressBW"),
            {"bandwidth": "300M"},
            "invalid shaping: shaping.capacity names capacity 'egressBW', which device nic-a does not have (its "
            'capacities: bandwidth); name one of them, or set "shaping": false to leave the interface unshaped',
        ),
        (
            ON,
            {"ports": "4", "speed": "1G"},
            "shaping.capacity (default 'bandwidth') names capacity 'bandwidth', which device nic-a does not have "
            "(its capacities: ports, speed)",
        ),
        (
            ShapingConfig(ingressCapacity="ingressBandwidth", egressCapacity="egressBandwidth"),
            {"ingressBandwidth": "1G"},
            "shaping.egressCapacity names capacity 'egressBandwidth', which device nic-a does not have (its capacities: "
            "ingressBandwidth)",
        ),
    ],
)
def test_a_capacity_the_device_lacks_is_refused_naming_it(
    conf: ShapingConfig, consumed: dict, says: str
) -> None:
    """Shaping a direction by a capacity the device does not have would leave it unshaped
    without a word: refused, naming the key, the name and what the device has."""
    with pytest.raises(InvalidConfigError) as err:
        shape_spec(conf, consumed, device="nic-a")
    assert err.value.code == 7 and says in err.value.msg, err.value.msg


def test_a_short_or_qualified_capacity_name_finds_the_device_key() -> None:
    """As in a claim request: a short name matches ``<driver>/name``, and the reverse."""
    driver = "net.cni-dra.dev"
    assert shape_spec(ON, {f"{driver}/bandwidth": "300M"}, driver=driver) == ShapeSpec.symmetric(300 * M)
    qualified = ShapingConfig(capacity=f"{driver}/bandwidth")
    assert shape_spec(qualified, {"bandwidth": "300M"}, driver=driver) == ShapeSpec.symmetric(300 * M)
    with pytest.raises(InvalidConfigError, match="names capacity 'example.com/bandwidth'"):
        shape_spec(ShapingConfig(capacity="example.com/bandwidth"), {"bandwidth": "300M"}, driver=driver)


def test_shaping_off_shapes_nothing_not_even_the_runtime_request() -> None:
    assert shape_spec(None, {"bandwidth": "1G"}, RuntimeBandwidth(ingressRate=M, egressRate=M)) is None


def test_a_pair_of_capacities() -> None:
    conf = ShapingConfig(ingressCapacity="ingressBandwidth", egressCapacity="egressBandwidth")
    spec = shape_spec(conf, {"ingressBandwidth": "2G", "egressBandwidth": "500M", "bandwidth": "9G"})
    assert spec == ShapeSpec(egress_rate_bps=500 * M, ingress_rate_bps=2000 * M)
    only_in = shape_spec(
        ShapingConfig(ingressCapacity="ingressBandwidth"), {"ingressBandwidth": "2G", "bandwidth": "9G"}
    )
    assert only_in == ShapeSpec(ingress_rate_bps=2000 * M)


def test_config_bursts_and_latency_are_used() -> None:
    conf = ShapingConfig(egressBurstBytes=64_000, latencySeconds=0.05)
    spec = shape_spec(conf, {"bandwidth": "100M"})
    assert spec == ShapeSpec(
        egress_rate_bps=100 * M, egress_burst_bytes=64_000, ingress_rate_bps=100 * M, latency_s=0.05
    )
    assert spec is not None and spec.egress == Tbf.for_rate(100 * M, 64_000, 0.05)


def test_the_runtime_lowers_the_rate() -> None:
    spec = shape_spec(ON, {"bandwidth": "300M"}, RuntimeBandwidth(ingressRate=100 * M, ingressBurst=MAX_U32))
    assert spec == ShapeSpec(
        egress_rate_bps=300 * M, ingress_rate_bps=100 * M, ingress_burst_bytes=MIN_BURST_BYTES
    )
    assert spec is not None and spec.ingress == Tbf.for_rate(
        100 * M
    )  # containerd's 2**32-1 bits: the default


def test_the_runtime_never_raises_the_rate() -> None:
    spec = shape_spec(
        ON,
        {"bandwidth": "300M"},
        RuntimeBandwidth(egressRate=2000 * M, egressBurst=MAX_U32 * 8 - 1, ingressRate=300 * M + 1),
    )
    assert spec == ShapeSpec(
        egress_rate_bps=300 * M, egress_burst_bytes=MIN_BURST_BYTES, ingress_rate_bps=300 * M
    )
    assert spec is not None and spec.egress == spec.ingress == Tbf.for_rate(300 * M)


def test_the_runtime_lowers_the_burst_never_raises_it() -> None:
    spec = shape_spec(
        ON, {"bandwidth": "300M"}, RuntimeBandwidth(egressBurst=80_000 * 8, ingressBurst=2000 * 8 + 7)
    )
    assert spec is not None and spec.egress is not None and spec.ingress is not None
    assert spec.egress.burst_bytes == 80_000  # bits to bytes, below the 128 KiB default
    assert spec.ingress.burst_bytes == 2000  # rounded down to whole bytes
    conf = ShapingConfig(egressBurstBytes=10_000)
    spec = shape_spec(conf, {"bandwidth": "300M"}, RuntimeBandwidth(egressBurst=80_000 * 8))
    assert spec is not None and spec.egress is not None and spec.egress.burst_bytes == 10_000


def test_a_direction_without_an_allocation_takes_the_runtime_rate() -> None:
    conf = ShapingConfig(egressCapacity="egressBandwidth")
    spec = shape_spec(
        conf, {"egressBandwidth": "1G"}, RuntimeBandwidth(ingressRate=50 * M, ingressBurst=MAX_U32)
    )
    assert spec == ShapeSpec(
        egress_rate_bps=1000 * M, ingress_rate_bps=50 * M, ingress_burst_bytes=MIN_BURST_BYTES
    )
    assert shape_spec(ON, {}, RuntimeBandwidth(egressRate=10 * M)) == ShapeSpec(egress_rate_bps=10 * M)


def test_a_rate_tbf_cannot_hold_is_not_shaped() -> None:
    assert shape_spec(ON, {"bandwidth": "40G"}) is None
    # ... unless the runtime asks for less
    assert shape_spec(ON, {"bandwidth": "40G"}, RuntimeBandwidth(egressRate=10_000 * M)) == ShapeSpec(
        egress_rate_bps=10_000 * M
    )
    assert shape_spec(ON, {"bandwidth": str(MAX_RATE_BPS)}) == ShapeSpec.symmetric(MAX_RATE_BPS)


@given(
    st.integers(min_value=2824, max_value=MAX_RATE_BPS),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.integers(min_value=0, max_value=2**64 - 1),
)
def test_the_runtime_never_raises_anything(allocated_bps: int, runtime_rate: int, runtime_burst: int) -> None:
    plain = shape_spec(ON, {"bandwidth": str(allocated_bps)})
    try:
        lowered = shape_spec(
            ON,
            {"bandwidth": str(allocated_bps)},
            RuntimeBandwidth(egressRate=runtime_rate, egressBurst=runtime_burst),
        )
    except InvalidConfigError as exc:  # what it asks is below what tbf holds: refused, never raised to it
        assert exc.code == 7 and exc.msg.startswith(
            ("invalid shaping: egress rate", "invalid shaping: runtimeConfig")
        )
        assert "runtimeConfig.bandwidth.egress" in exc.msg
        return
    assert (
        plain is not None and lowered is not None and plain.egress is not None and lowered.egress is not None
    )
    assert lowered.egress.rate_bps <= plain.egress.rate_bps
    assert (
        lowered.egress.rate_bps
        == (min(allocated_bps, runtime_rate) if runtime_rate else allocated_bps) // 8 * 8
    )
    assert lowered.egress.burst_bytes <= Tbf.for_rate(lowered.egress.rate_bps).burst_bytes
    assert lowered.ingress == plain.ingress  # the other direction is not touched


@pytest.mark.parametrize(
    ("conf", "consumed", "runtime", "says"),
    [
        # containerd's request for kubernetes.io/ingress-bandwidth: 1k
        (
            ON,
            {"bandwidth": "300M"},
            RuntimeBandwidth(ingressRate=1000, ingressBurst=MAX_U32),
            "invalid shaping: ingress rate 1kbit/s (runtimeConfig.bandwidth.ingressRate) is below 2824bit/s, the lowest at "
            "which tbf passes a full frame on an interface of MTU 1500 (1514 bytes in 4.29 s of the rate)",
        ),
        (
            ON,
            {"bandwidth": "2k"},
            None,
            "invalid shaping: egress rate 2kbit/s (consumed capacity bandwidth of device nic-a) is below 2824bit/s",
        ),
        (
            ON,
            {"bandwidth": "500m"},
            None,  # half a bit per second: no whole bit, still asked
            "invalid shaping: egress rate 0bit/s (consumed capacity bandwidth of device nic-a) is below 2824bit/s",
        ),
        (
            ON,
            {"bandwidth": "300M"},
            RuntimeBandwidth(ingressRate=100 * M, ingressBurst=80),
            "invalid shaping: runtimeConfig.bandwidth.ingressBurst 80 bits (10 bytes) is below 1539 bytes, the smallest "
            "bucket at 100Mbit/s on an interface of MTU 1500: a full frame (1514 bytes) and the 2 µs of the rate that "
            "tbf's rounding may take off",
        ),
        (
            ShapingConfig(ingressBurstBytes=1500),
            {"bandwidth": "300M"},
            None,
            "invalid shaping: shaping.ingressBurstBytes 1500 is below 1589 bytes, the smallest bucket at 300Mbit/s",
        ),
        (
            ShapingConfig(egressBurstBytes=MAX_U32),
            {"bandwidth": "100M"},
            None,
            "invalid shaping: shaping.egressBurstBytes 4294967295 is above 3435973812 bytes, the largest bucket tbf holds "
            "at 100Mbit/s (274.9 s of the rate, at most 2^32-1 bytes)",
        ),
    ],
)
def test_what_tbf_cannot_hold_is_code_7_naming_the_key_and_the_bound(
    conf: ShapingConfig, consumed: dict, runtime: RuntimeBandwidth | None, says: str
) -> None:
    with pytest.raises(InvalidConfigError) as err:
        shape_spec(conf, consumed, runtime, device="nic-a")
    assert err.value.code == 7 and err.value.msg.startswith(says), err.value.msg


def test_the_bounds_follow_the_interface_mtu() -> None:
    with pytest.raises(InvalidConfigError, match="below 16816bit/s, .* MTU 9000 \\(9014 bytes"):
        shape_spec(ON, {"bandwidth": "16k"}, mtu=9000)
    assert shape_spec(ON, {"bandwidth": "16k"}, mtu=1500) == ShapeSpec.symmetric(16_000)
    with pytest.raises(InvalidConfigError, match="shaping.egressBurstBytes 9000 is below 9039 bytes"):
        shape_spec(ShapingConfig(egressBurstBytes=9000), {"bandwidth": "100M"}, mtu=9000)


def test_a_burst_at_its_documented_maximum_is_taken_where_tbf_holds_it() -> None:
    """``egressBurstBytes`` 2**32-1: at 300 Mbit/s tbf holds it (the queue limit stops at
    2**32-1 bytes); at 100 Mbit/s it is more than 274.9 s of the rate (refused, above)."""
    spec = shape_spec(ShapingConfig(egressBurstBytes=MAX_U32), {"bandwidth": "300M"})
    assert spec is not None and spec.egress == Tbf(300 * M, MAX_U32, MAX_U32)
    assert holds_as_asked(spec.egress, 1500)


_ANY_INT = (
    st.integers(min_value=-2, max_value=2**66)
    | st.integers(min_value=0, max_value=20_000)
    | st.sampled_from([2**32 - 1, 2**32, 2**64 - 1, 2**64, 3_435_973_812, 3_435_973_813])
)
_KEYS = ("shaping.", "runtimeConfig.bandwidth", "consumed capacity")


@settings(max_examples=300, deadline=None)
@given(
    conf_bursts=st.fixed_dictionaries(
        {}, optional={"ingressBurstBytes": _ANY_INT, "egressBurstBytes": _ANY_INT}
    ),
    runtime=st.fixed_dictionaries(
        {}, optional={k: _ANY_INT for k in ("ingressRate", "ingressBurst", "egressRate", "egressBurst")}
    ),
    profile_bursts=st.fixed_dictionaries(
        {}, optional={"ingressBurstBytes": _ANY_INT, "egressBurstBytes": _ANY_INT}
    ),
    allocated=_ANY_INT,
    mtu=st.sampled_from([1500, 9000, 65535]),
)
def test_any_rate_and_burst_is_shaped_as_asked_or_refused_naming_the_key(
    conf_bursts: dict, runtime: dict, profile_bursts: dict, allocated: int, mtu: int
) -> None:
    """From the conflist, runtimeConfig.bandwidth, a device profile and the consumed capacity,
    0 to huge: either every bucket is one the kernel holds as asked, passing full frames, or
    code 7 names the key (and the bound) that asked; never another error."""
    from pydantic import ValidationError

    from cni_dra.protocol.profile import InterfaceProfile, apply_to_netconf

    netconf = json.loads(
        netconf_bytes(
            shaping=conf_bursts, capabilities={"bandwidth": True}, runtimeConfig={"bandwidth": runtime}
        )
    )
    try:
        profile = InterfaceProfile.model_validate({"shaping": profile_bursts})
    except ValidationError:  # refused when the claim is prepared, before any ADD
        profile = None
    try:
        conf = load_conf(json.dumps(apply_to_netconf(netconf, profile)).encode())
        spec = shape_spec(
            conf.shaping, {"bandwidth": str(allocated)}, conf.runtime_bandwidth, mtu=mtu, device="a"
        )
    except InvalidConfigError as exc:
        assert exc.code == 7 and any(key in exc.msg for key in _KEYS), exc.msg
        return
    for tbf in (spec.egress, spec.ingress) if spec is not None else ():
        if tbf is not None:
            assert holds_as_asked(tbf, mtu)
            assert allocated <= 0 or tbf.rate_bps <= allocated  # lowered, never raised


# -- the record and CHECK's comparison ----------------------------------------------------------


def _info(egress: Tbf | None = None, ingress: Tbf | None = None) -> ShapeInfo:
    return ShapeInfo("eth0", egress, ingress, "ifb-eth0" if ingress else None)


def test_record_keeps_what_is_shaped() -> None:
    tbf = Tbf.for_rate(300 * M)
    assert record(_info(tbf, tbf)) == {
        "egress": {"rateBps": 300 * M, "burstBytes": tbf.burst_bytes, "limitBytes": tbf.limit_bytes},
        "ingress": {"rateBps": 300 * M, "burstBytes": tbf.burst_bytes, "limitBytes": tbf.limit_bytes},
        "ifb": "ifb-eth0",
    }
    assert record(_info(egress=tbf)) == {
        "egress": {"rateBps": 300 * M, "burstBytes": tbf.burst_bytes, "limitBytes": tbf.limit_bytes}
    }


def test_mismatch_names_what_differs() -> None:
    tbf = Tbf.for_rate(300 * M)
    rec = record(_info(tbf, tbf))
    assert mismatch(rec, _info(tbf, tbf)) is None
    assert (
        mismatch(rec, _info(Tbf(tbf.rate_bps, tbf.burst_bytes + 10, tbf.limit_bytes), tbf)) is None
    )  # rounding
    assert mismatch(rec, None) == "egress is not shaped (the root tbf qdisc is missing), expected 300Mbit/s"
    assert mismatch(rec, _info(egress=tbf)) == (
        "ingress is not shaped (the ingress redirect to ifb-eth0 and its tbf is missing), expected 300Mbit/s"
    )
    assert mismatch(rec, _info(Tbf.for_rate(100 * M), tbf)) == "egress rate is 100Mbit/s, expected 300Mbit/s"
    assert mismatch(rec, _info(tbf, Tbf(tbf.rate_bps, tbf.burst_bytes, 5))) == (
        f"ingress queue limit is 5 bytes, expected {tbf.limit_bytes}"
    )
    assert mismatch(rec, _info(tbf, Tbf(tbf.rate_bps, 1000, tbf.limit_bytes))) == (
        f"ingress burst is 1000 bytes, expected {tbf.burst_bytes}"
    )
    assert (
        mismatch(rec, ShapeInfo("eth0", tbf, tbf, "ifb-other"))
        == "ingress goes through ifb-other, expected ifb-eth0"
    )
    assert mismatch(rec, ShapeInfo("eth0", tbf, tbf, "ifb-eth0", ifb_up=True)) is None
    assert mismatch(rec, ShapeInfo("eth0", tbf, tbf, "ifb-eth0", ifb_up=False)) == (
        "ingress goes through ifb device ifb-eth0, which is down (it drops every packet the pod receives)"
    )


def test_a_burst_as_the_kernel_rounds_it_matches_its_record() -> None:
    """The kernel keeps a bucket as whole microseconds of the rate: a small burst at a high
    rate comes back up to a microsecond of the rate short, which CHECK accepts."""
    tbf = Tbf.for_rate(34_000 * M, 100_000)
    held = as_the_kernel_holds_it(tbf)
    assert tbf.burst_bytes - held.burst_bytes > 1000  # 2.94 µs of 4.25 GB/s: 2 µs kept
    got = Tbf(tbf.rate_bps, round(held.burst_bytes), tbf.limit_bytes)
    assert mismatch(record(_info(got, got)), _info(tbf, tbf)) is None
    # a direction that was not shaped is not checked (a chained plugin may add its own qdisc)
    assert mismatch(record(_info(egress=tbf)), _info(tbf, Tbf.for_rate(M))) is None


# -- ADD, DEL, CHECK through the entry point, kernel faked ---------------------------------------


class FakeKernel(FakeHost):
    """The in-memory host with NIC eth9, and what ADD/DEL/CHECK shaped, removed and created."""

    def __init__(self) -> None:
        super().__init__()
        self.add_nic("eth9", 7)
        self.shaped: list[ShapeSpec] = []
        self.removed: list[str] = []

    @property
    def links_made(self) -> list[str]:
        return [spec.ifname for spec, _temp in self.called("rename_and_up")]

    @property
    def probes(self) -> int:
        return len(self.called("probe_shaping"))

    @property
    def ipam_calls(self) -> int:
        return len(self.called("ipam_add"))

    @property
    def installed(self) -> ShapeInfo | None:
        """The shaping on eth0 of the pod's namespace, as the kernel holds it."""
        return self.shaping.get((self._ident(POD), "eth0"))

    @installed.setter
    def installed(self, info: ShapeInfo) -> None:
        self.shaping[(self._ident(POD), "eth0")] = info

    def apply_shaping(self, netns: str, ifname: str, spec: ShapeSpec, *, new_link: bool = False) -> ShapeInfo:
        assert new_link  # ADD shapes the link it just made
        self.shaped.append(spec)
        for tbf in (spec.egress, spec.ingress):  # encoded as the real one encodes them
            if tbf is not None:
                as_the_kernel_holds_it(tbf)
        return super().apply_shaping(netns, ifname, spec, new_link=new_link)

    def remove_shaping(self, netns: str, ifname: str) -> bool:
        self.removed.append(ifname)
        return super().remove_shaping(netns, ifname)

    def delete_shaped_link(self, netns: str, ifname: str) -> tuple[bool, bool]:
        self.removed.append(ifname)
        return super().delete_shaped_link(netns, ifname)


POD = "/var/run/netns/pod"


def _node(tmp_path: Path, **conf: Any) -> tuple[dict[str, str], dict[str, Any]]:
    write_slice(tmp_path / "slice.yaml", [device("nic-a", "eth9")], name="s")
    c = {
        "cniVersion": "1.1.0",
        "name": "net",
        "type": "cni-dra",
        "stateDir": str(tmp_path / "state"),
        "inventory": str(tmp_path / "slice.yaml"),
        "ipam": {"type": "host-local"},
        "capacity": {"requests": {"bandwidth": "300M"}},
        **conf,
    }
    env = {
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/var/run/netns/pod",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
        "PATH": "/usr/bin:/bin",
    }
    return env, c


def _run(host: FakeHost, command: str, env: dict[str, str], conf: dict[str, Any]) -> tuple[int, Any]:
    out = io.StringIO()
    code = run({**env, "CNI_COMMAND": command}, json.dumps(conf).encode(), out, host=host)
    return code, json.loads(out.getvalue()) if out.getvalue().strip() else None


def _attachments(tmp_path: Path) -> list[Any]:
    return list(StateStore(tmp_path / "state").read().attachments)


def test_add_shapes_from_the_consumed_capacity_and_records_it(tmp_path) -> None:
    kernel = FakeKernel()
    env, conf = _node(tmp_path)
    code, res = _run(kernel, "ADD", env, conf)
    assert code == 0, res
    assert kernel.shaped == [ShapeSpec.symmetric(300 * M)]
    (att,) = _attachments(tmp_path)
    assert att.shaping == record(kernel.installed) and att.shaping["ingress"]["rateBps"] == 300 * M
    # CHECK: as added, then with the egress gone
    assert _run(kernel, "CHECK", env, {**conf, "prevResult": res}) == (0, None)
    assert kernel.installed is not None
    kernel.installed = ShapeInfo("eth0", None, kernel.installed.ingress, "ifb-eth0")
    code, out = _run(kernel, "CHECK", env, {**conf, "prevResult": res})
    assert code == 1 and out["code"] == 105
    assert out["msg"] == (
        "failed to check interface eth0 of container c1: egress is not shaped (the root tbf qdisc "
        "is missing), expected 300Mbit/s"
    )
    # DEL removes it
    assert _run(kernel, "DEL", env, conf) == (0, None)
    assert kernel.removed == ["eth0"] and _attachments(tmp_path) == []


def test_add_with_runtime_bandwidth_lowers(tmp_path) -> None:
    kernel = FakeKernel()
    env, conf = _node(
        tmp_path,
        capabilities={"bandwidth": True},
        runtimeConfig={"bandwidth": {"egressRate": 50 * M, "egressBurst": MAX_U32}},
    )
    assert _run(kernel, "ADD", env, conf)[0] == 0
    assert kernel.shaped == [
        ShapeSpec(egress_rate_bps=50 * M, egress_burst_bytes=MIN_BURST_BYTES, ingress_rate_bps=300 * M)
    ]


def test_add_with_containerds_go_spelling_lowers(tmp_path) -> None:
    # containerd marshals its Go struct without JSON tags: IngressRate, EgressRate...
    kernel = FakeKernel()
    env, conf = _node(
        tmp_path,
        capabilities={"bandwidth": True},
        runtimeConfig={
            "bandwidth": {
                "IngressRate": 5000 * M,
                "IngressBurst": MAX_U32,
                "EgressRate": 50 * M,
                "EgressBurst": MAX_U32,
            }
        },
    )
    assert _run(kernel, "ADD", env, conf)[0] == 0
    assert kernel.shaped == [
        ShapeSpec(
            egress_rate_bps=50 * M,
            egress_burst_bytes=MIN_BURST_BYTES,
            ingress_rate_bps=300 * M,
            ingress_burst_bytes=MIN_BURST_BYTES,
        )
    ]


@pytest.mark.parametrize(
    ("conf", "says"),
    [
        (
            {
                "capabilities": {"bandwidth": True},
                "runtimeConfig": {"bandwidth": {"ingressRate": 1000, "ingressBurst": MAX_U32}},
            },  # ingress-bandwidth: 1k
            "invalid shaping: ingress rate 1kbit/s (runtimeConfig.bandwidth.ingressRate) is below 2824bit/s, the lowest "
            "at which tbf passes a full frame on an interface of MTU 1500 (1514 bytes in 4.29 s of the rate)",
        ),
        (
            {"capabilities": {"bandwidth": True}, "runtimeConfig": {"bandwidth": {"egressBurst": 800}}},
            "invalid shaping: runtimeConfig.bandwidth.egressBurst 800 bits (100 bytes) is below 1589 bytes",
        ),
        (
            {"shaping": {"capacity": "egressBW"}},
            "invalid shaping: shaping.capacity names capacity 'egressBW', which device nic-a does not have (its "
            "capacities: bandwidth)",
        ),
    ],
)
def test_add_refuses_shaping_it_cannot_install_before_any_effect(tmp_path, conf, says) -> None:
    kernel = FakeKernel()
    env, c = _node(tmp_path, **conf)
    code, out = _run(kernel, "ADD", env, c)
    assert code == 1 and out["code"] == 7 and out["msg"].startswith(says), out
    assert kernel.links_made == [] and kernel.ipam_calls == 0 and kernel.shaped == []
    assert _attachments(tmp_path) == []


def test_the_bounds_are_those_of_the_link_mtu(tmp_path) -> None:
    """A 1500-byte bucket cannot hold a full frame of the parent's MTU 1500; on a link made
    with MTU 1400 it can."""
    kernel = FakeKernel()
    env, c = _node(tmp_path, shaping={"egressBurstBytes": 1500})
    code, out = _run(kernel, "ADD", env, c)
    assert (
        code == 1 and out["code"] == 7 and "shaping.egressBurstBytes 1500 is below 1589 bytes" in out["msg"]
    ), out
    code, out = _run(kernel, "ADD", env, {**c, "mtu": 1400})
    assert code == 0, out
    assert kernel.shaped[0].mtu == 1400 and kernel.shaped[0].egress is not None
    assert kernel.shaped[0].egress.burst_bytes == 1500


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.fixed_dictionaries(
        {}, optional={k: _ANY_INT for k in ("ingressRate", "ingressBurst", "egressRate", "egressBurst")}
    ),
    st.fixed_dictionaries({}, optional={"ingressBurstBytes": _ANY_INT, "egressBurstBytes": _ANY_INT}),
)
def test_add_never_crashes_on_a_rate_or_burst(runtime: dict, bursts: dict) -> None:
    """Through the entry point, every rate and burst gives a shaped ADD or code 7, never 999."""
    import tempfile

    kernel = FakeKernel()
    with tempfile.TemporaryDirectory() as tmp:
        env, c = _node(
            Path(tmp), shaping=bursts, capabilities={"bandwidth": True}, runtimeConfig={"bandwidth": runtime}
        )
        code, out = _run(kernel, "ADD", env, c)
    assert code == 0 or out["code"] == 7, out


def test_unshaped_add_records_nothing_and_del_leaves_shaping_alone(tmp_path) -> None:
    kernel = FakeKernel()
    env, conf = _node(tmp_path, shaping=False)
    code, res = _run(kernel, "ADD", env, conf)
    assert code == 0 and kernel.shaped == []
    (att,) = _attachments(tmp_path)
    assert att.shaping is None
    assert _run(kernel, "CHECK", env, {**conf, "prevResult": res}) == (0, None)
    assert _run(kernel, "DEL", env, conf) == (0, None)
    assert kernel.removed == []  # never shaped: no netlink round trip for it


def test_a_shaping_failure_fails_the_add_and_undoes_it(tmp_path) -> None:
    kernel = FakeKernel()
    kernel.fail["apply_shaping"] = NetlinkError(
        "failed to create ifb device ifb-eth0 in netns /var/run/netns/pod: kernel lacks ifb", lacks="ifb"
    )
    env, conf = _node(tmp_path)
    code, out = _run(kernel, "ADD", env, conf)
    assert code == 1 and out["code"] == 102 and out["msg"].endswith("kernel lacks ifb")
    assert kernel.removed == ["eth0"] and _attachments(tmp_path) == []
    # shaping off: the kernel's gap does not matter
    kernel.shaped.clear()
    assert _run(kernel, "ADD", env, {**conf, "shaping": False})[0] == 0 and kernel.shaped == []


def test_a_later_failure_removes_the_shaping(tmp_path) -> None:
    from cni_dra.errors import IpamError

    kernel = FakeKernel()
    kernel.fail["ipam_add"] = IpamError("failed to allocate: no addresses left")
    env, conf = _node(tmp_path)
    code, out = _run(kernel, "ADD", env, conf)
    assert code == 1 and "no addresses left" in out["msg"]
    assert len(kernel.shaped) == 1 and kernel.removed == ["eth0"] and kernel.installed is None
    assert _attachments(tmp_path) == []


@pytest.mark.parametrize(
    ("shaping_rec", "phase", "removes"),
    [
        ({"egress": {"rateBps": 1, "burstBytes": 1, "limitBytes": 1}}, "ready", True),
        (None, "ready", False),
        (None, "adding", True),  # an ADD that never completed may have made its ifb device
    ],
)
def test_release_removes_shaping_when_there_may_be_some(shaping_rec, phase, removes) -> None:
    from cni_dra.attach.release import release_attachment

    host = FakeKernel()
    att = attachment("c1", netns=POD, phase=phase, shaping=shaping_rec)

    def made() -> None:  # the link, and its shaping with an ifb device
        host.links.clear()
        host.add_sublink(
            sublink.SubLinkSpec.macvlan(parent="eth9", netns=POD, ifname="eth0"),
            parent_link=None,
            temp="cdra0000000001",
        )
        host.rename_and_up(
            sublink.SubLinkSpec.macvlan(parent="eth9", netns=POD, ifname="eth0"), "cdra0000000001"
        )
        host.installed = ShapeInfo("eth0", None, Tbf.for_rate(M), "ifb-eth0", True)
        host.calls.clear()

    made()
    done = release_attachment(att, {}, None, host=host)
    deleted = [op for op, _args in host.calls if op in ("delete_link", "delete_shaped_link")]
    assert deleted == (["delete_shaped_link"] if removes else ["delete_link"])
    assert host.link(POD, "eth0") is None
    assert done[0] == "link eth0 deleted in /var/run/netns/pod"
    if removes:
        assert done[1] == "shaping of eth0 (ifb-eth0) removed in /var/run/netns/pod"
    # a netns that is gone or the host's: nothing is touched
    made()
    release_attachment(att, {}, None, host=host, delete_link=False)
    assert host.calls == [] and host.link(POD, "eth0") is not None


# -- status and metrics -------------------------------------------------------------------------


def _state_with_a_shaped_attachment(tmp_path: Path) -> tuple[str, str]:
    write_slice(tmp_path / "slice.yaml", [device("nic-a", "eth9")], name="s")
    tbf = Tbf.for_rate(300 * M)
    with StateStore(tmp_path / "state").transaction() as txn:
        txn.put(
            attachment(
                "c1",
                pool="s",
                podNamespace="ns",
                podName="p",
                consumedCapacity={"bandwidth": "300M"},
                shaping=record(ShapeInfo("eth0", tbf, Tbf.for_rate(100 * M), "ifb-eth0")),
            )
        )
        txn.put(attachment("c2", pool="s", consumedCapacity={"bandwidth": "1G"}))
    return str(tmp_path / "state"), str(tmp_path / "slice.yaml")


def test_status_shows_shaped_rates(tmp_path) -> None:
    from click.testing import CliRunner

    from cni_dra.cli import cli
    from cni_dra.report import status_report

    state_dir, inventory = _state_with_a_shaped_attachment(tmp_path)
    shaped, plain = status_report(state_dir, inventory)["attachments"]
    tbf = Tbf.for_rate(300 * M)
    assert shaped["shaping"]["egress"] == {
        "rate": "300M",
        "rateBps": 300 * M,
        "burstBytes": tbf.burst_bytes,
        "limitBytes": tbf.limit_bytes,
    }
    assert shaped["shaping"]["ingress"]["rate"] == "100M" and shaped["shaping"]["ifb"] == "ifb-eth0"
    assert plain["shaping"] is None
    table = CliRunner().invoke(cli, ["status", "--state-dir", state_dir, "--inventory", inventory])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    header = next(line for line in lines if line.startswith("POD"))
    assert "SHAPED" in header.split()
    row = next(line for line in lines if line.startswith("ns/p"))
    assert "egress=300M,ingress=100M" in row.split()
    other = next(line for line in lines if " c2 " in f" {line} ")
    assert other.split()[header.split().index("SHAPED")] == "-"


def test_metrics_show_shaped_rates(tmp_path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from cni_dra.agent.metrics import NodeCollector

    state_dir, inventory = _state_with_a_shaped_attachment(tmp_path)
    registry = CollectorRegistry()
    registry.register(NodeCollector(state_dir, inventory))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    samples = {
        (s.labels["container"], s.labels["direction"]): (s.value, s.labels)
        for s in families["cni_dra_attachment_shaped_rate"].samples
    }
    assert {k: v for k, (v, _) in samples.items()} == {("c1", "egress"): 300 * M, ("c1", "ingress"): 100 * M}
    labels = samples[("c1", "egress")][1]
    assert labels == {
        "device": "nic-a",
        "network": "net1",
        "pod": "ns/p",
        "container": "c1",
        "ifname": "eth0",
        "direction": "egress",
    }


# -- STATUS: the kernel's pieces of shaping, probed once per boot ----------------------------------


def _status_node(tmp_path: Path, **conf: Any) -> tuple[FakeKernel, dict, dict]:
    """A node whose NIC exists; no IPAM plugin."""
    kernel = FakeKernel()
    env, c = _node(tmp_path, **conf)
    del c["ipam"]
    return kernel, {"CNI_PATH": env["CNI_PATH"], "PATH": env["PATH"]}, c


LACKS_IFB = (
    'plugin not available: the network shapes traffic ("shaping") and this kernel lacks ifb; '
    'load the kernel module ifb (modprobe ifb) or set "shaping": false in the network config'
)


def test_status_is_code_50_naming_the_missing_piece_and_the_fix(tmp_path, monkeypatch) -> None:
    from cni_dra.state import owner
    from cni_dra.verbs.status import SHAPING_PROBE_FILE

    kernel, env, conf = _status_node(tmp_path)
    kernel.kernel_lacks = "ifb"
    code, out = _run(kernel, "STATUS", env, conf)
    assert code == 1 and out["code"] == 50 and out["msg"] == LACKS_IFB
    assert kernel.probes == 1
    probe_file = tmp_path / "state" / SHAPING_PROBE_FILE
    assert not probe_file.exists()  # a gap is never remembered: the operator may load the module
    assert _run(kernel, "STATUS", env, conf) == (code, out) and kernel.probes == 2
    # shaping off: the kernel's gap does not matter, and nothing is probed
    assert _run(kernel, "STATUS", env, {**conf, "shaping": False}) == (0, None) and kernel.probes == 2
    # the module loaded: the next STATUS passes, and a complete kernel is remembered for the boot
    kernel.kernel_lacks = None
    assert _run(kernel, "STATUS", env, conf) == (0, None) and kernel.probes == 3
    assert json.loads(probe_file.read_text()) == {"bootID": owner.boot_id(), "lacks": None}
    assert _run(kernel, "STATUS", env, conf) == (0, None) and kernel.probes == 3
    # another boot: probed again (the boot id is the kernel's: no port for it)
    monkeypatch.setattr(owner, "boot_id", lambda: "another-boot")
    assert _run(kernel, "STATUS", env, conf) == (0, None) and kernel.probes == 4
    assert json.loads(probe_file.read_text()) == {"bootID": "another-boot", "lacks": None}


@pytest.mark.parametrize(
    ("piece", "fix"),
    [
        ("the tbf qdisc", "load the kernel module sch_tbf (modprobe sch_tbf)"),
        (
            "the ingress qdisc, u32 classifier or mirred action",
            "load the kernel modules sch_ingress, cls_u32, act_mirred (modprobe -a sch_ingress cls_u32 act_mirred)",
        ),
    ],
)
def test_status_names_each_piece_and_its_modules(tmp_path, piece: str, fix: str) -> None:
    kernel, env, conf = _status_node(tmp_path)
    kernel.kernel_lacks = piece
    code, out = _run(kernel, "STATUS", env, conf)
    assert code == 1 and out["code"] == 50
    assert out["msg"] == (
        f'plugin not available: the network shapes traffic ("shaping") and this kernel lacks '
        f'{piece}; {fix} or set "shaping": false in the network config'
    )


def test_status_with_shaping_off_does_not_probe(tmp_path) -> None:
    kernel, env, conf = _status_node(tmp_path, shaping=False)
    kernel.fail["probe_shaping"] = AssertionError("probed")
    assert _run(kernel, "STATUS", env, conf) == (0, None)
    assert not (tmp_path / "state").exists()


def test_status_when_the_probe_itself_fails_is_code_50_and_not_kept(tmp_path) -> None:
    from cni_dra.errors import IOFailureError

    kernel, env, conf = _status_node(tmp_path)
    kernel.fail["probe_shaping"] = IOFailureError(
        "failed to create a network namespace: Operation not permitted"
    )
    code, out = _run(kernel, "STATUS", env, conf)
    assert code == 1 and out["code"] == 50
    assert out["msg"] == (
        "plugin not available: cannot check the kernel's traffic control for shaping: "
        "failed to create a network namespace: Operation not permitted"
    )
    assert not (tmp_path / "state" / "shaping-probe.json").exists()


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        ("ifb-eth0", True),
        (shaping.ifb_name("podinterface0"), True),
        ("ifb-" + "x" * 11, True),
        ("myifb0", False),
        ("ifb0", False),
        ("ifb-", False),
        ("ifb3F2A00000000", False),
        ("ifb3f2a0000000", False),
    ],
)
def test_ifb_names_of_the_rule(name: str, ours: bool) -> None:
    assert shaping.is_ifb_name(name) is ours


def test_status_keeps_nothing_in_a_state_directory_others_can_write(tmp_path) -> None:
    from cni_dra.verbs.status import SHAPING_PROBE_FILE

    kernel, env, conf = _status_node(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state").chmod(0o777)
    for n in (1, 2):  # probed each time, answered each time
        assert _run(kernel, "STATUS", env, conf) == (0, None) and kernel.probes == n
    assert not (tmp_path / "state" / SHAPING_PROBE_FILE).exists()
