"""KEP-5075 capacity rules and single-request device selection (phase-1 allocator API)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_dra.allocator import (
    NoFit,
    RequestNotRepresentable,
    Selection,
    check_fits,
    consumed_amount,
    device_consumption,
    remaining,
    select_device,
)
from cni_dra.dra.objects import Device, DeviceCapacity
from cni_dra.quantity import Quantity

Q = Quantity.parse


def cap(value: str | int, policy: dict[str, Any] | None = None) -> DeviceCapacity:
    raw: dict[str, Any] = {"value": value}
    if policy is not None:
        raw["requestPolicy"] = policy
    return DeviceCapacity.model_validate(raw)


def dev(name: str, shared: bool = True, **caps: DeviceCapacity) -> Device:
    return Device(name=name, allow_multiple_allocations=shared or None, capacity=caps)


RANGE_MIN1 = {"default": 1, "validRange": {"min": 1}}
RANGE_STEP2 = {"default": 1, "validRange": {"min": 1, "step": 2}}
VALUES_1_3 = {"default": 1, "validValues": [1, 3]}
RANGE_MAX4 = {"default": 2, "validRange": {"min": 2, "step": 2, "max": 4}}
BW_POLICY = {"default": "1M", "validRange": {"min": "1M", "step": "8"}}


# (id, value, policy, requested, expected consumed string or None for "does not fit")
CONSUMED_CASES: list[tuple[str, str | int, dict[str, Any] | None, str | None, str | None]] = [
    ("unnamed-default", 2, RANGE_MIN1, None, "1"),
    ("unnamed-no-policy-whole-value", "10G", None, None, "10G"),
    ("unnamed-policy-without-default-whole-value", 10, {"validRange": {"min": 1}}, None, "10"),
    ("named-no-policy-as-is", "10G", None, "3G", "3G"),
    ("named-no-policy-milli", "2", None, "250m", "250m"),
    ("range-below-min-is-min", 10, {"default": 2, "validRange": {"min": 2}}, "1", "2"),
    ("range-no-step-as-is", 10, RANGE_MIN1, "7", "7"),
    ("range-step-rounds-up", 3, RANGE_STEP2, "2", "3"),
    ("range-step-on-grid", 5, RANGE_STEP2, "3", "3"),
    ("range-above-max", 10, RANGE_MAX4, "6", None),
    ("range-at-max", 10, RANGE_MAX4, "4", "4"),
    ("range-round-up-to-max", 10, RANGE_MAX4, "3", "4"),
    ("range-no-step-above-max", 10, {"default": 2, "validRange": {"min": 2, "max": 4}}, "5", None),
    ("values-round-up", 3, VALUES_1_3, "2", "3"),
    ("values-exact", 3, VALUES_1_3, "1", "1"),
    ("values-below-first", 3, {"default": 2, "validValues": [2, 3]}, "1", "2"),
    ("values-above-all", 3, VALUES_1_3, "4", None),
    ("bandwidth-1G-on-step-8", "10G", BW_POLICY, "1G", "1G"),
    ("bandwidth-not-on-step-8", "10G", BW_POLICY, "1000001", "1000008"),
    ("bandwidth-between-steps", "10G", BW_POLICY, "1000009", "1000016"),
    ("bandwidth-unnamed-default", "10G", BW_POLICY, None, "1M"),
    ("milli-values", "2", {"default": "500m", "validValues": ["500m", "1500m"]}, "600m", "1500m"),
    (
        "binary-step",
        "4Gi",
        {"default": "1Gi", "validRange": {"min": "1Gi", "step": "512Mi"}},
        "1.2Gi",
        "1536Mi",
    ),
    ("binary-request-decimal-policy", "10G", {"default": "1G", "validRange": {"min": "1G"}}, "1Gi", "1Gi"),
]


@pytest.mark.parametrize(
    ("value", "policy", "requested", "expected"),
    [c[1:] for c in CONSUMED_CASES],
    ids=[c[0] for c in CONSUMED_CASES],
)
def test_consumed_amount(
    value: str | int, policy: dict[str, Any] | None, requested: str | None, expected: str | None
) -> None:
    got = consumed_amount(cap(value, policy), None if requested is None else Q(requested))
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert str(got) == expected


def test_negative_consumed_amount_aborts() -> None:
    # upstream CmpRequestOverCapacity: a negative consumed amount aborts the allocation
    # (errNegativeCapacity), it does not merely rule the device out
    with pytest.raises(RequestNotRepresentable, match="consumed amount -1G is negative"):
        consumed_amount(cap("10G"), Q("-1G"))


def test_step_result_keeps_step_format() -> None:
    # 1G on a step of "8" (DecimalSI) prints "1G", not a BinarySI "1000000000".
    got = consumed_amount(cap("10G", BW_POLICY), Q("1G"))
    assert got is not None and got.format == "DecimalSI" and str(got) == "1G"


def test_device_consumption_covers_every_capacity() -> None:
    d = dev(
        "eth-a",
        bandwidth=cap("10G", BW_POLICY),
        queues=cap(8, {"default": 1, "validRange": {"min": 1}}),
        vfs=cap(4),
    )
    got = device_consumption(d, {"bandwidth": Q("2G")})
    assert isinstance(got, dict)
    assert {k: str(v) for k, v in got.items()} == {"bandwidth": "2G", "queues": "1", "vfs": "4"}


def test_device_consumption_missing_capacity_is_nofit() -> None:
    got = device_consumption(dev("eth-a", bandwidth=cap("10G")), {"latency": Q("1")})
    assert isinstance(got, NoFit)
    assert got.reasons == {"eth-a": "no capacity latency"}


def test_device_consumption_policy_violation_reason() -> None:
    got = device_consumption(dev("d", mem=cap(10, RANGE_MAX4)), {"mem": Q(6)})
    assert isinstance(got, NoFit)
    assert got.reasons["d"] == "mem 6 above validRange max 4"


def test_qualified_capacity_names_resolve_both_ways() -> None:
    d1 = dev("a", bandwidth=cap("10G"))
    d2 = dev("b", **{"drv.io/bandwidth": cap("10G")})
    got1 = device_consumption(d1, {"drv.io/bandwidth": Q("1G")}, driver="drv.io")
    got2 = device_consumption(d2, {"bandwidth": Q("1G")}, driver="drv.io")
    assert got1 == {"bandwidth": Q("1G")}
    assert got2 == {"drv.io/bandwidth": Q("1G")}
    assert isinstance(device_consumption(d1, {"other.io/bandwidth": Q("1G")}, driver="drv.io"), NoFit)


def test_dedicated_device_consumes_whole_value_and_filters() -> None:
    d = dev("d", shared=False, bandwidth=cap("10G"))
    assert device_consumption(d, {"bandwidth": Q("1G")}) == {"bandwidth": Q("10G")}
    got = device_consumption(d, {"bandwidth": Q("20G")})
    assert isinstance(got, NoFit)
    assert got.reasons == {"d": "capacity bandwidth 10G < 20G requested"}


def test_remaining() -> None:
    d = dev("d", bandwidth=cap("10G"), vfs=cap(4))
    assert {k: str(v) for k, v in remaining(d, {"bandwidth": Q("7G")}).items()} == {
        "bandwidth": "3G",
        "vfs": "4",
    }


@pytest.mark.parametrize(
    ("already", "amount", "expected"),
    [
        ("0", "10G", None),
        ("2G", "8G", None),  # equality fits
        ("2G", "8000000001", "remaining bandwidth 8G < 8000000001"),
        ("7G", "8G", "remaining bandwidth 3G < 8G"),
    ],
)
def test_check_fits(already: str, amount: str, expected: str | None) -> None:
    d = dev("eth-a", bandwidth=cap("10G"))
    assert check_fits(d, {"bandwidth": Q(already)}, {"bandwidth": Q(amount)}) == expected


def test_check_fits_unknown_capacity_and_dedicated() -> None:
    assert check_fits(dev("a", bandwidth=cap("1G")), {}, {"x": Q(1)}) == "no capacity x"
    d = dev("d", shared=False, bandwidth=cap("10G"))
    assert check_fits(d, {}, {"bandwidth": Q("10G")}) is None
    assert (
        check_fits(d, {"bandwidth": Q("10G")}, {"bandwidth": Q("10G")})
        == "dedicated device already allocated"
    )


def test_multi_device_with_consumed_fits_at_equality() -> None:
    # value 4, 2 already consumed, {default 2, validRange{min 2, step 2, max 4}}, request 2 → fits, consumes 2.
    d = dev("d", mem=cap(4, RANGE_MAX4))
    sel = select_device([d], {"d": {"mem": Q(2)}}, {"mem": Q(2)})
    assert isinstance(sel, Selection)
    assert sel.consumed_capacity == {"mem": Q(2)}


# -- select_device ---------------------------------------------------------------------

NICS = [
    dev("eth-a", bandwidth=cap("10G")),
    dev("eth-b", bandwidth=cap("25G")),
    dev("eth-c", bandwidth=cap("10G")),
]


@pytest.mark.parametrize(
    ("consumed", "request_bw", "policy", "expected"),
    [
        ({}, "1G", "best-fit", "eth-a"),  # eth-a and eth-c tie (9G left) → name
        ({}, "1G", "least-allocated", "eth-b"),
        ({"eth-a": {"bandwidth": "5G"}}, "1G", "best-fit", "eth-a"),
        ({"eth-a": {"bandwidth": "5G"}}, "1G", "least-allocated", "eth-b"),
        (
            {"eth-a": {"bandwidth": "5G"}, "eth-b": {"bandwidth": "20G"}},
            "5G",
            "best-fit",
            "eth-a",
        ),  # 0 left beats 0? eth-b 0 left too → name
        ({"eth-a": {"bandwidth": "9G"}, "eth-c": {"bandwidth": "9G"}}, "2G", "best-fit", "eth-b"),
        (
            {"eth-b": {"bandwidth": "20G"}},
            "5G",
            "least-allocated",
            "eth-a",
        ),  # a, b(0 left), c → a/c tie 5G → name
        ({}, "11G", "best-fit", "eth-b"),
    ],
)
def test_select_device_policies(
    consumed: dict[str, dict[str, str]], request_bw: str, policy: str, expected: str
) -> None:
    used = {d: {c: Q(v) for c, v in m.items()} for d, m in consumed.items()}
    sel = select_device(NICS, used, {"bandwidth": Q(request_bw)}, policy)  # type: ignore[arg-type]
    assert isinstance(sel, Selection), sel
    assert sel.device.name == expected
    assert sel.consumed_capacity == {"bandwidth": Q(request_bw)}
    assert sel.shared


def test_select_device_nofit_reasons_name_remaining() -> None:
    used = {
        "eth-a": {"bandwidth": Q("7G")},
        "eth-b": {"bandwidth": Q("20G")},
        "eth-c": {"bandwidth": Q("4G")},
    }
    got = select_device(NICS, used, {"bandwidth": Q("8G")}, "best-fit")
    assert isinstance(got, NoFit)
    assert got.reasons == {
        "eth-a": "remaining bandwidth 3G < 8G",
        "eth-b": "remaining bandwidth 5G < 8G",
        "eth-c": "remaining bandwidth 6G < 8G",
    }
    assert (
        str(got)
        == "eth-a: remaining bandwidth 3G < 8G; eth-b: remaining bandwidth 5G < 8G; eth-c: remaining bandwidth 6G < 8G"
    )


def test_select_device_exclude() -> None:
    got = select_device(NICS, {}, {"bandwidth": Q("1G")}, "best-fit", exclude={"eth-a", "eth-c"})
    assert isinstance(got, Selection) and got.device.name == "eth-b"
    none = select_device(NICS, {}, {"bandwidth": Q("1G")}, "best-fit", exclude={"eth-a", "eth-b", "eth-c"})
    assert isinstance(none, NoFit) and none.reasons == {
        "eth-a": "excluded",
        "eth-b": "excluded",
        "eth-c": "excluded",
    }


def test_select_device_empty_inventory() -> None:
    got = select_device([], {}, {"bandwidth": Q("1G")}, "best-fit")
    assert isinstance(got, NoFit) and str(got) == "no devices"


def test_select_device_unknown_policy() -> None:
    with pytest.raises(ValueError, match="policy"):
        select_device(NICS, {}, {}, "random")  # type: ignore[arg-type]


def test_select_dedicated_device_once() -> None:
    d = dev("d", shared=False, bandwidth=cap(2))
    first = select_device([d], {}, {"bandwidth": Q(1)}, "best-fit")
    assert isinstance(first, Selection) and not first.shared
    assert first.consumed_capacity == {"bandwidth": Q(2)}
    second = select_device([d], {"d": first.consumed_capacity}, {"bandwidth": Q(1)}, "best-fit")
    assert isinstance(second, NoFit)
    assert second.reasons == {"d": "dedicated device already allocated"}


def test_select_with_several_capacities_ranks_by_sorted_names() -> None:
    # Ranking tuple is (bandwidth, queues): bandwidth decides first.
    a = dev("a", bandwidth=cap("10G"), queues=cap(8))
    b = dev("b", bandwidth=cap("5G"), queues=cap(64))
    sel = select_device([a, b], {}, {"queues": Q(1), "bandwidth": Q("1G")}, "best-fit")
    assert isinstance(sel, Selection) and sel.device.name == "b"
    c = dev("c", bandwidth=cap("5G"), queues=cap(4))
    sel2 = select_device([a, b, c], {}, {"queues": Q(1), "bandwidth": Q("1G")}, "best-fit")
    assert isinstance(sel2, Selection) and sel2.device.name == "c"


# -- properties -------------------------------------------------------------------------


@st.composite
def policies(draw: st.DrawFn) -> tuple[int, dict[str, Any] | None]:
    """(value in milli-units, requestPolicy dict) with a valid policy."""
    value = draw(st.integers(min_value=1, max_value=10**6))
    kind = draw(st.sampled_from(["none", "range", "values"]))
    if kind == "none":
        return value, None
    if kind == "range":
        mn = draw(st.integers(min_value=0, max_value=value))
        step = draw(st.one_of(st.none(), st.integers(min_value=1, max_value=max(1, value))))
        mx = draw(st.one_of(st.none(), st.integers(min_value=mn, max_value=value)))
        rng: dict[str, Any] = {"min": f"{mn}m"}
        if step is not None:
            rng["step"] = f"{step}m"
        if mx is not None:
            rng["max"] = f"{mx}m"
        return value, {"default": f"{mn}m", "validRange": rng}
    vals = sorted(set(draw(st.lists(st.integers(min_value=0, max_value=value), min_size=1, max_size=10))))
    return value, {"default": f"{vals[0]}m", "validValues": [f"{v}m" for v in vals]}


@given(policies(), st.integers(min_value=0, max_value=2 * 10**6))
def test_consumed_at_least_requested_and_on_policy(
    pol: tuple[int, dict[str, Any] | None], req_milli: int
) -> None:
    value, policy = pol
    c = cap(f"{value}m", policy)
    req = Q(f"{req_milli}m")
    got = consumed_amount(c, req, fractional_capacity_range=True)  # milli-units: the exact grid
    if got is None:
        assert policy is not None
        return
    assert got >= req
    if policy is None:
        assert got == req
    elif "validValues" in policy:
        assert got in [Q(v) for v in policy["validValues"]]
        smaller = [Q(v) for v in policy["validValues"] if req <= Q(v)]
        assert got == min(smaller)
    else:
        rng = policy["validRange"]
        mn = Q(rng["min"])
        assert got >= mn
        if "max" in rng:
            assert got <= Q(rng["max"])
        if "step" in rng:
            step = Q(rng["step"])
            assert (got.nanos - mn.nanos) % step.nanos == 0
            assert got.nanos - step.nanos < max(req.nanos, mn.nanos)  # smallest grid point ≥ request


@st.composite
def inventories(draw: st.DrawFn) -> list[Device]:
    n = draw(st.integers(min_value=1, max_value=5))
    out = []
    for i in range(n):
        value = draw(st.integers(min_value=1, max_value=40))
        policy = draw(
            st.sampled_from(
                [
                    None,
                    {"default": 1, "validRange": {"min": 1, "step": 2}},
                    {"default": 2, "validValues": [2, 5, 10]},
                ]
            )
        )
        out.append(dev(f"nic-{i}", shared=draw(st.booleans()), bandwidth=cap(value, policy)))
    return out


@settings(max_examples=200)
@given(
    inventories(),
    st.lists(
        st.tuples(
            st.booleans(),
            st.integers(min_value=0, max_value=12),
            st.sampled_from(["best-fit", "least-allocated"]),
        ),
        max_size=30,
    ),
)
def test_no_sequence_over_commits(devices: list[Device], ops: list[tuple[bool, int, str]]) -> None:
    by_name = {d.name: d for d in devices}
    live: list[tuple[str, dict[str, Quantity]]] = []
    for is_alloc, amount, policy in ops:
        if is_alloc or not live:
            used: dict[str, dict[str, Quantity]] = {}
            for name, cons in live:
                slot = used.setdefault(name, {})
                for k, v in cons.items():
                    slot[k] = slot.get(k, Quantity.ZERO) + v
            sel = select_device(devices, used, {"bandwidth": Q(amount)}, policy)  # type: ignore[arg-type]
            if isinstance(sel, Selection):
                live.append((sel.device.name, sel.consumed_capacity))
        else:
            live.pop(amount % len(live))
        totals: dict[str, Quantity] = {}
        counts: dict[str, int] = {}
        for name, cons in live:
            totals[name] = totals.get(name, Quantity.ZERO) + cons["bandwidth"]
            counts[name] = counts.get(name, 0) + 1
        for name, total in totals.items():
            assert total <= by_name[name].capacity["bandwidth"].value
            if not by_name[name].shared:
                assert counts[name] == 1


@given(
    inventories(),
    st.integers(min_value=0, max_value=12),
    st.sampled_from(["best-fit", "least-allocated"]),
    st.randoms(),
)
def test_result_independent_of_inventory_order(
    devices: list[Device], amount: int, policy: str, rnd: Any
) -> None:
    shuffled = list(devices)
    rnd.shuffle(shuffled)
    a = select_device(devices, {}, {"bandwidth": Q(amount)}, policy)  # type: ignore[arg-type]
    b = select_device(shuffled, {}, {"bandwidth": Q(amount)}, policy)  # type: ignore[arg-type]
    assert a == b
