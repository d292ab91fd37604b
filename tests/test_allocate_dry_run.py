"""``cni-dra allocate`` as a dry run: it creates nothing in --state-dir, slices of other
drivers (no ``ifName``) are accepted, and a claim that does not fit says why per request."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_dra.cli import cli
from cni_dra.dra.inventory import parse_inventory, validate_slice
from cni_dra.dra.objects import ResourceSlice
from cni_dra.errors import InventoryError
from cni_dra.quantity import Quantity
from cni_dra.state import Attachment, StateStore

DRV = "gpu.example.com"  # another driver: its devices have no ifName attribute


def _slice(devices: list[dict[str, Any]], driver: str = DRV) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "n"},
        "spec": {
            "driver": driver,
            "nodeName": "n",
            "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _dev(name: str, bw: str, shared: bool = True, **attrs: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": name,
        "attributes": {k: {"string": v} for k, v in attrs.items()},
        "capacity": {"bw": {"value": bw}},
    }
    if shared:
        d["allowMultipleAllocations"] = True
    return d


def _claim(*requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": devices},
    }


def _req(name: str, bw: str | None = None, sel: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"deviceClassName": "x"}
    if bw is not None:
        spec["capacity"] = {"requests": {"bw": bw}}
    if sel is not None:
        spec["selectors"] = [{"cel": {"expression": sel}}]
    return {"name": name, "exactly": spec}


def _write(tmp: Path, name: str, data: Any) -> str:
    p = tmp / name
    p.write_text(json.dumps(data))
    return str(p)


# -- the ifName rule is the plugin's, not the API server's ------------------------------


def test_validate_slice_api_rules_only_accepts_a_slice_without_ifname() -> None:
    sl = ResourceSlice.model_validate(_slice([_dev("gpu-0", "10G")]))
    with pytest.raises(InventoryError, match="ifName: required attribute missing"):
        validate_slice(sl)  # the plugin's rule stays the default
    validate_slice(sl, plugin_rules=False)


def test_api_rules_only_still_enforced_without_plugin_rules() -> None:
    bad = _dev("gpu-0", "10G", shared=False)
    bad["capacity"]["bw"]["requestPolicy"] = {"default": "1G"}
    text = json.dumps(_slice([bad]))
    with pytest.raises(
        InventoryError, match="requestPolicy: allowed only when allowMultipleAllocations is true"
    ):
        parse_inventory(text, source="s.json", plugin_rules=False)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(["eth0", "eth1", None]), min_size=1, max_size=4))
def test_plugin_rules_only_add_ifname_problems(ifnames: list[str | None]) -> None:
    """With or without the plugin rules the API-server verdict is the same; the plugin
    rules reject exactly when some device lacks ifName or two share one."""
    devices = []
    for i, ifn in enumerate(ifnames):
        d = _dev(f"d{i}", "10G")
        if ifn is not None:
            d["attributes"]["ifName"] = {"string": ifn}
        devices.append(d)
    sl = ResourceSlice.model_validate(_slice(devices))
    validate_slice(sl, plugin_rules=False)
    present = [i for i in ifnames if i is not None]
    plugin_ok = len(present) == len(ifnames) and len(set(present)) == len(present)
    if plugin_ok:
        validate_slice(sl)
    else:
        with pytest.raises(InventoryError, match="ifName"):
            validate_slice(sl)


def test_cli_allocate_accepts_a_slice_of_another_driver(tmp_path: Path) -> None:
    inv = _write(tmp_path, "slice.json", _slice([_dev("gpu-0", "10G")]))
    c = _write(tmp_path, "c.json", _claim(_req("g", "4G")))
    r = CliRunner().invoke(cli, ["allocate", "--inventory", inv, "--claim", c], env={})
    assert r.exit_code == 0, r.output
    (entry,) = json.loads(r.stdout)
    (res,) = entry["allocation"]["devices"]["results"]
    assert (res["driver"], res["device"], res["consumedCapacity"]) == (DRV, "gpu-0", {"bw": "4G"})


def _hold_7g(state: Path) -> None:
    """A state in ``state`` where one ready attachment holds 7G of gpu-0."""
    with StateStore(state).transaction() as txn:
        txn.put(
            Attachment(
                network="n1",
                containerID="c1",
                ifname="eth0",
                driver=DRV,
                pool="n",
                device="gpu-0",
                parent="x",
                consumedCapacity={"bw": Quantity.parse("7G")},
                shareID="s1",
                phase="ready",
            )
        )


def test_cli_allocate_state_with_a_slice_of_another_driver(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _hold_7g(state)
    inv = _write(tmp_path, "slice.json", _slice([_dev("gpu-0", "10G")]))
    c = _write(tmp_path, "c.json", _claim(_req("g", "4G")))
    r = CliRunner().invoke(
        cli, ["allocate", "--inventory", inv, "--claim", c, "--state-dir", str(state)], env={}
    )
    assert r.exit_code == 1, r.output
    assert json.loads(r.stdout)[0]["reasons"] == {"g": "gpu-0: remaining bw 3G < 4G"}


# -- --state-dir is read-only -----------------------------------------------------------------


def test_cli_allocate_state_creates_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    inv = _write(tmp_path, "slice.json", _slice([_dev("gpu-0", "10G")]))
    c = _write(tmp_path, "c.json", _claim(_req("g", "4G")))
    r = CliRunner().invoke(
        cli, ["allocate", "--inventory", inv, "--claim", c, "--state-dir", str(state)], env={}
    )
    assert r.exit_code == 0, r.output
    assert os.listdir(state) == []


def test_cli_allocate_state_missing_dir_is_not_created(tmp_path: Path) -> None:
    state = tmp_path / "nope"
    inv = _write(tmp_path, "slice.json", _slice([_dev("gpu-0", "10G")]))
    c = _write(tmp_path, "c.json", _claim(_req("g", "4G")))
    r = CliRunner().invoke(
        cli, ["allocate", "--inventory", inv, "--claim", c, "--state-dir", str(state)], env={}
    )
    assert r.exit_code == 0, r.output
    assert not state.exists()


def test_cli_allocate_state_does_not_wait_for_the_lock(tmp_path: Path) -> None:
    """A held state lock does not block the dry run (it would time out under read())."""
    state = tmp_path / "state"
    _hold_7g(state)
    before = sorted(os.listdir(state))
    inv = _write(tmp_path, "slice.json", _slice([_dev("gpu-0", "10G")]))
    c = _write(tmp_path, "c.json", _claim(_req("g", "2G")))
    import fcntl

    fd = os.open(state / "state.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = CliRunner().invoke(
            cli, ["allocate", "--inventory", inv, "--claim", c, "--state-dir", str(state)], env={}
        )
    finally:
        os.close(fd)
    assert r.exit_code == 0, r.output
    (res,) = json.loads(r.stdout)[0]["allocation"]["devices"]["results"]
    assert res["consumedCapacity"] == {"bw": "2G"}
    assert sorted(os.listdir(state)) == before


# -- a reason per request -----------------------------------------------------------------


def _alloc(
    devices: list[dict[str, Any]], claim: dict[str, Any], consumed: dict[str, dict[str, str]] | None = None
) -> Any:
    from cni_dra.allocator import NodeUsage, allocate_claim
    from cni_dra.dra.claims import ResourceClaim

    sl = ResourceSlice.model_validate(_slice(devices))
    usage = NodeUsage.from_consumed(
        {d: {k: Quantity.parse(v) for k, v in caps.items()} for d, caps in (consumed or {}).items()},
        sl.spec.devices,
    )
    n = iter(range(1, 1000))
    return allocate_claim(
        ResourceClaim.model_validate(claim), sl, usage, lambda: f"00000000-0000-4000-8000-{next(n):012d}"
    )


def test_each_request_gets_its_device_rejections() -> None:
    from cni_dra.allocator import ClaimNoFit

    devs = [
        _dev("eth-a", "10G", numa="0"),
        _dev("eth-b", "10G", shared=False, numa="1"),
        _dev("eth-c", "10G", shared=False, numa="2"),
    ]
    claim = _claim(_req("a", "12G"), _req("b", "4G", sel='device.attributes["gpu.example.com"].numa == "1"'))
    got = _alloc(devs, claim, consumed={"eth-b": {"bw": "1"}})
    assert isinstance(got, ClaimNoFit)
    assert got.reasons == {
        "a": "eth-a: remaining bw 10G < 12G; eth-b: held by a dedicated allocation; eth-c: capacity bw 10G < 12G requested",
        "b": "eth-a: does not match selectors; eth-b: held by a dedicated allocation; eth-c: does not match selectors",
    }


def test_combined_shared_capacity_is_named() -> None:
    from cni_dra.allocator import ClaimNoFit

    got = _alloc(
        [_dev("eth-a", "10G")], _claim(_req("a", "5G"), _req("b", "5G")), consumed={"eth-a": {"bw": "2G"}}
    )
    assert isinstance(got, ClaimNoFit)
    assert got.reasons == {
        "a": "fits alone on eth-a",
        "b": "fits alone on eth-a",
        "claim": "requests a and b fit alone but not together: combined bw 12G > 10G on eth-a (2G in use + a 5G + b 5G)",
    }


def test_distinct_attribute_is_named_and_a_bystander_request_is_left_out() -> None:
    from cni_dra.allocator import ClaimNoFit

    devs = [_dev("eth-a", "10G", numa="0"), _dev("eth-b", "10G", numa="0"), _dev("eth-c", "10G", numa="1")]
    claim = _claim(
        _req("a", "1G", sel='device.attributes["gpu.example.com"].numa == "0"'),
        _req("b", "1G", sel='device.attributes["gpu.example.com"].numa == "0"'),
        _req("c", "1G"),
        constraints=[{"requests": ["a", "b"], "distinctAttribute": "gpu.example.com/numa"}],
    )
    got = _alloc(devs, claim)
    assert isinstance(got, ClaimNoFit)
    assert got.reasons["c"] == "fits alone on eth-a, eth-b, eth-c"
    assert got.reasons["claim"] == (
        "requests a and b fit alone but not together: distinctAttribute gpu.example.com/numa "
        '(a can use eth-a="0", eth-b="0"; b can use eth-a="0", eth-b="0")'
    )


def test_cli_stderr_has_a_line_per_request(tmp_path: Path) -> None:
    inv = _write(tmp_path, "slice.json", _slice([_dev("eth-a", "10G")]))
    c = _write(tmp_path, "c.json", _claim(_req("a", "6G"), _req("b", "6G")))
    r = CliRunner().invoke(cli, ["allocate", "--inventory", inv, "--claim", c], env={})
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [
        "NoCapacityError: claim ns/c cannot be allocated:",
        "  request a: fits alone on eth-a",
        "  request b: fits alone on eth-a",
        "  claim: requests a and b fit alone but not together: combined bw 12G > 10G on eth-a (a 6G + b 6G)",
    ]
    assert json.loads(r.stdout)[0]["reasons"]["claim"].startswith(
        "requests a and b fit alone but not together"
    )


@st.composite
def _cases(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    n = draw(st.integers(min_value=1, max_value=3))
    devices = [
        _dev(
            f"d{i}", str(draw(st.integers(1, 8))), shared=draw(st.booleans()), grp=draw(st.sampled_from("xy"))
        )
        for i in range(n)
    ]
    k = draw(st.integers(min_value=2, max_value=3))
    requests = [_req(f"r{i}", str(draw(st.integers(1, 6)))) for i in range(k)]
    constraints = []
    if draw(st.booleans()):
        constraints.append(
            {draw(st.sampled_from(["matchAttribute", "distinctAttribute"])): "gpu.example.com/grp"}
        )
    return devices, _claim(*requests, constraints=constraints)


@settings(max_examples=150, deadline=None)
@given(_cases())
def test_reasons_cover_every_request_and_name_a_failing_subset(
    case: tuple[list[dict[str, Any]], dict[str, Any]],
) -> None:
    """Every request gets an entry; "fits alone" exactly when its one-request claim fits;
    when all fit alone, the requests named together fail as a claim of their own."""
    import re

    from cni_dra.allocator import ClaimNoFit

    devices, claim = case
    got = _alloc(devices, claim)
    if not isinstance(got, ClaimNoFit):
        return
    requests = claim["spec"]["devices"]["requests"]
    constraints = claim["spec"]["devices"].get("constraints")
    alone = {
        r["name"]: not isinstance(_alloc(devices, _claim(r, constraints=constraints)), ClaimNoFit)
        for r in requests
    }
    for r in requests:
        assert r["name"] in got.reasons
        assert got.reasons[r["name"]].startswith("fits alone") == alone[r["name"]]
    if all(alone.values()):
        m = re.match(r"requests (.+) fit alone but not together: ", got.reasons["claim"])
        assert m is not None, got.reasons
        named = re.findall(r"r\d", m.group(1))
        assert len(named) >= 2
        subset = [r for r in requests if r["name"] in named]
        assert isinstance(_alloc(devices, _claim(*subset, constraints=constraints)), ClaimNoFit)
    else:
        assert "claim" not in got.reasons


@pytest.mark.parametrize(
    "consumed,why",
    [
        ({"gpu-9": {"bw": "9G"}}, "gpu-9: no such device in the inventory (devices: gpu-0)"),
        ({"gpu-0": {"bw": "-5G"}}, "gpu-0.bw: -5G is negative"),
    ],
)
def test_cli_allocate_refuses_a_consumed_file_that_does_not_describe_this_node(
    tmp_path: Path, consumed: dict[str, dict[str, str]], why: str
) -> None:
    """A misspelt device would charge nothing and a negative amount would add capacity: the
    dry run would say a 4G claim fits on a NIC that has 1G left. Bad input: exit 2."""
    inv = _write(tmp_path, "slice.json", _slice([_dev("gpu-0", "10G")]))
    c = _write(tmp_path, "c.json", _claim(_req("g", "4G")))
    f = _write(tmp_path, "consumed.json", consumed)
    r = CliRunner().invoke(cli, ["allocate", "--inventory", inv, "--claim", c, "--consumed", f], env={})
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == f"InvalidConfigError: failed to load consumed-capacity file {f}: {why}\n"
