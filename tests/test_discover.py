"""``cni-dra inventory discover`` without the host: which NICs a slice gets, with what
bandwidth and requestPolicy (defaults, the operator's ``--request-policy``, a ``--devices``
list such as the Helm chart writes), and the CLI's refusals. The real links:
netns_tests/test_discover.py."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from cni_dra.discover import NicSpec, build_slice
from cni_dra.dra.inventory import parse_inventory
from cni_dra.netlink.info import LinkInfo

DRIVER = "net.cni-dra.dev"


def link(
    name: str, kind: str | None = None, mac: str | None = "02:00:00:00:00:01", mtu: int = 1500
) -> LinkInfo:
    return LinkInfo(
        name=name,
        index=1,
        kind=kind,
        mac=mac,
        mtu=mtu,
        operstate="UP",
        admin_up=True,
        parent_index=None,
        parent_netnsid=None,
        mode=None,
    )


LINKS = [
    link("lo", mac=None, mtu=65536),
    link("eth1"),
    link("eth0", mtu=9000),
    link("macvlan0", kind="macvlan"),
    link("veth9", kind="veth"),
]
SPEEDS = {"eth0": 25_000_000_000}  # Mb/s from sysfs, as bits/s; the others report none


def slice_of(**kw):
    args = {"interfaces": [], "default_bandwidth": "10G", "driver": DRIVER, "node": "node-a", **kw}
    doc = build_slice(LINKS, SPEEDS.get, **args)
    parse_inventory(json.dumps(doc))  # what the plugin and the agent accept
    return doc


def caps(doc):
    return {d["name"]: d["capacity"]["bandwidth"] for d in doc["spec"]["devices"]}


def test_every_eligible_nic_by_name_with_the_default_policy():
    doc = slice_of()
    assert doc["spec"]["nodeName"] == "node-a" and doc["spec"]["pool"]["name"] == "node-a"
    assert caps(doc) == {
        "eth0": {"value": "25G", "requestPolicy": {"default": "1G", "validRange": {"min": "1M"}}},
        "eth1": {"value": "10G", "requestPolicy": {"default": "1G", "validRange": {"min": "1M"}}},
        "veth9": {"value": "10G", "requestPolicy": {"default": "1G", "validRange": {"min": "1M"}}},
    }
    eth0 = doc["spec"]["devices"][0]
    assert eth0["attributes"] == {
        "ifName": {"string": "eth0"},
        "mac": {"string": "02:00:00:00:00:01"},
        "mtu": {"int": 9000},
    }


def test_a_small_nic_defaults_to_its_whole_bandwidth():
    assert caps(slice_of(interfaces=["eth1"], default_bandwidth="500M")) == {
        "eth1": {"value": "500M", "requestPolicy": {"default": "500M", "validRange": {"min": "1M"}}}
    }


def test_the_operators_request_policy_for_every_nic():
    policy = {"default": "2G", "validRange": {"min": "100M", "step": "100M"}}
    assert caps(slice_of(interfaces=["eth0", "eth1"], request_policy=policy)) == {
        "eth0": {"value": "25G", "requestPolicy": policy},
        "eth1": {"value": "10G", "requestPolicy": policy},
    }


def test_a_devices_list_is_exactly_those_nics_in_its_order_each_with_its_own_settings():
    policy = {"default": "2G"}
    devices = [
        NicSpec.model_validate(d)
        for d in [
            {
                "ifName": "eth1",
                "bandwidth": "40G",
                "requestPolicy": {"default": "1G", "validValues": ["1G", "5G"]},
            },
            {"ifName": "eth0", "name": "fast"},
            {"ifName": "ens9"},  # not on this host (yet): kept, with the default bandwidth
        ]
    ]
    doc = slice_of(interfaces=["veth9"], request_policy=policy, devices=devices)
    assert [d["name"] for d in doc["spec"]["devices"]] == ["eth1", "fast", "ens9"]
    assert caps(doc) == {
        "eth1": {"value": "40G", "requestPolicy": {"default": "1G", "validValues": ["1G", "5G"]}},
        "fast": {"value": "25G", "requestPolicy": policy},
        "ens9": {"value": "10G", "requestPolicy": policy},
    }
    assert doc["spec"]["devices"][2]["attributes"] == {"ifName": {"string": "ens9"}}


def _discover(tmp_path, *args):
    from cni_dra.cli import cli

    return CliRunner().invoke(
        cli, ["inventory", "discover", "--node-name", "n", *args, "-o", str(tmp_path / "s.yaml")]
    )


@pytest.mark.parametrize(
    ("devices", "words"),
    [
        ([{"name": "x"}], "ifName"),
        ([{"ifName": "eth0", "speed": "1G"}], "speed"),
        ({"ifName": "eth0"}, "must be a list"),
        ([{"ifName": "eth0", "bandwidth": "lots"}], "lots"),
    ],
)
def test_a_bad_devices_list_is_refused_and_nothing_is_written(tmp_path, devices, words):
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(devices))
    res = _discover(tmp_path, "--devices", str(tmp_path / "d.yaml"))
    assert res.exit_code != 0 and words in res.output, res.output
    assert not (tmp_path / "s.yaml").exists()


def test_a_policy_the_inventory_refuses_is_refused_and_nothing_is_written(tmp_path):
    (tmp_path / "d.yaml").write_text(yaml.safe_dump([{"ifName": "cdt-absent0", "bandwidth": "1G"}]))
    res = _discover(tmp_path, "--devices", str(tmp_path / "d.yaml"), "--request-policy", '{"default": "5G"}')
    assert res.exit_code == 1 and "cdt-absent0" in res.output and "default" in res.output, res.output
    assert not (tmp_path / "s.yaml").exists()


def test_the_devices_list_writes_the_slice(tmp_path):
    (tmp_path / "d.yaml").write_text(yaml.safe_dump([{"ifName": "cdt-absent0", "bandwidth": "25G"}]))
    res = _discover(
        tmp_path,
        "--devices",
        str(tmp_path / "d.yaml"),
        "--request-policy",
        "default: 1G\nvalidRange: {min: 100M, step: 100M}",
    )
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load((tmp_path / "s.yaml").read_text())
    assert caps(doc) == {
        "cdt-absent0": {
            "value": "25G",
            "requestPolicy": {"default": "1G", "validRange": {"min": "100M", "step": "100M"}},
        }
    }
