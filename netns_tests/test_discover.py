"""`cni-dra inventory discover` on real links: the slice it writes loads and names the NIC."""

from __future__ import annotations

import subprocess

from cni_dra.dra.inventory import load_inventory
from cni_dra.dra.objects import device_attribute
from cni_dra.netlink.info import host_link, link_speed_bps
from cni_dra.quantity import Quantity
from netns_tests.runner import CNI_EXE


def test_discover_writes_a_valid_slice_for_the_named_nic(make_parent_nic, tmp_path):
    nic = make_parent_nic()
    out = tmp_path / "slice.yaml"
    r = subprocess.run(
        [
            CNI_EXE,
            "inventory",
            "discover",
            "-i",
            nic,
            "--node-name",
            "node-x",
            "--default-bandwidth",
            "25G",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    slice_ = load_inventory(str(out))
    assert slice_.spec.node_name == "node-x" and slice_.spec.pool.name == "node-x"
    (dev,) = slice_.spec.devices
    assert device_attribute(dev, "ifName", slice_.spec.driver) == nic
    assert device_attribute(dev, "mac", slice_.spec.driver) == host_link(nic).mac
    speed = link_speed_bps(nic)
    want = Quantity.parse(speed) if speed else Quantity.parse("25G")
    assert dev.capacity["bandwidth"].value == want
    assert dev.allow_multiple_allocations is True


def test_discover_with_a_devices_list_keeps_each_nics_settings(make_parent_nic, tmp_path):
    """What the Helm chart's init container runs: ``--devices`` (each NIC's bandwidth and
    requestPolicy) and ``--request-policy`` (the others'), on the host's real links."""
    import yaml

    fast, plain = make_parent_nic(), make_parent_nic(mtu=9000)
    devices = tmp_path / "devices.yaml"
    devices.write_text(
        yaml.safe_dump(
            [
                {"ifName": fast, "bandwidth": "40G", "requestPolicy": {"default": "4G"}},
                {"ifName": plain, "name": "jumbo"},
            ]
        )
    )
    out = tmp_path / "slice.yaml"
    r = subprocess.run(
        [
            CNI_EXE,
            "inventory",
            "discover",
            "--devices",
            str(devices),
            "--node-name",
            "node-x",
            "--default-bandwidth",
            "25G",
            "--request-policy",
            '{"default": "1G", "validRange": {"min": "100M"}}',
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    slice_ = load_inventory(str(out))
    first, second = slice_.spec.devices
    assert (first.name, device_attribute(first, "ifName", slice_.spec.driver)) == (fast.lower(), fast)
    assert first.capacity["bandwidth"].value == Quantity.parse("40G")
    assert str(first.capacity["bandwidth"].request_policy.default) == "4G"
    assert (second.name, device_attribute(second, "mtu", slice_.spec.driver)) == ("jumbo", 9000)
    speed = link_speed_bps(plain)
    assert second.capacity["bandwidth"].value == (Quantity.parse(speed) if speed else Quantity.parse("25G"))
    assert str(second.capacity["bandwidth"].request_policy.valid_range.min) == "100M"
