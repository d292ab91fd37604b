"""CEL selectors in the DRA environment; the CEL library stays unloaded without selectors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cni_dra.allocator import NoFit, Selection, select_device
from cni_dra.allocator.cel import compile_selector, device_matches
from cni_dra.dra.objects import Device
from cni_dra.errors import InvalidConfigError
from cni_dra.quantity import Quantity

DEV = Device.model_validate(
    {
        "name": "eth-a",
        "allowMultipleAllocations": True,
        "attributes": {
            "ifName": {"string": "eth0"},
            "drv/speedGbps": {"int": 25},
            "sriov": {"bool": True},
            "fw": {"version": "1.2.3-rc.1"},
            "vendor.io/model": {"string": "x710"},
        },
        "capacity": {"bandwidth": {"value": "25G"}, "vendor.io/queues": {"value": 64}},
    }
)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('device.driver == "drv"', True),
        ('device.driver == "other"', False),
        ('device.attributes["drv"].ifName == "eth0"', True),
        ('device.attributes["drv"].speedGbps >= 25', True),
        ('device.attributes["drv"].speedGbps > 25', False),
        ('device.attributes["drv"].sriov', True),
        ('device.attributes["vendor.io"].model == "x710"', True),
        ('"model" in device.attributes["drv"]', False),
        ('"x" in device.attributes["unused.io"]', False),
        ("device.allowMultipleAllocations", True),
        ('device.capacity["drv"].bandwidth.isGreaterThan(quantity("10G"))', True),
        ('device.capacity["drv"].bandwidth.isLessThan(quantity("10G"))', False),
        ('device.capacity["drv"].bandwidth.compareTo(quantity("25000M")) == 0', True),
        ('device.capacity["drv"].bandwidth == quantity("25e9")', True),
        ('device.capacity["vendor.io"].queues.compareTo(quantity("64")) == 0', True),
        ('device.capacity["drv"].bandwidth.sub(quantity("5G")).compareTo(quantity("20G")) == 0', True),
        ('device.capacity["drv"].bandwidth.add(1).isInteger()', True),
        ('quantity("1.5").isInteger()', False),
        ('quantity("2k").asInteger() == 2000', True),
        ('quantity("-1").sign() == -1', True),
        ('isQuantity("10Gi") && !isQuantity("10GB")', True),
        ('device.attributes["drv"].fw.isLessThan(semver("1.2.3"))', True),
        ('device.attributes["drv"].fw.compareTo(semver("1.2.3-rc.1")) == 0', True),
        ('semver("1.10.0").isGreaterThan(semver("1.9.9"))', True),
        ('semver("1.0.0-alpha.2").isGreaterThan(semver("1.0.0-alpha.10"))', False),
        (
            'semver("2.3.4").major() == 2 && semver("2.3.4").minor() == 3 && semver("2.3.4").patch() == 4',
            True,
        ),
        ('isSemver("1.2.3") && !isSemver("1.2")', True),
    ],
)
def test_selector(expr: str, expected: bool) -> None:
    assert device_matches([expr], DEV, "drv") is expected


def test_all_selectors_must_hold() -> None:
    assert device_matches(['device.driver == "drv"', "device.allowMultipleAllocations"], DEV, "drv")
    assert not device_matches(['device.driver == "drv"', "!device.allowMultipleAllocations"], DEV, "drv")
    assert device_matches([], DEV, "drv")


@pytest.mark.parametrize(
    ("expr", "needle"),
    [
        ("1 +", "failed to compile CEL selector"),
        ('device.attributes["drv"].nope == 1', "no such key"),
        ("1", "is not a bool"),
        ('quantity("ten") == quantity("1")', "failed to evaluate"),
    ],
)
def test_selector_errors(expr: str, needle: str) -> None:
    with pytest.raises(InvalidConfigError) as ei:
        device_matches([expr], DEV, "drv")
    assert needle in ei.value.msg and ei.value.code == 7


def test_compiled_once() -> None:
    expr = 'device.driver == "cached"'
    assert compile_selector(expr) is compile_selector(expr)


def test_select_device_with_selectors() -> None:
    slow = Device.model_validate(
        {
            "name": "a",
            "allowMultipleAllocations": True,
            "attributes": {"speedGbps": {"int": 10}},
            "capacity": {"bandwidth": {"value": "10G"}},
        }
    )
    fast = Device.model_validate(
        {
            "name": "b",
            "allowMultipleAllocations": True,
            "attributes": {"speedGbps": {"int": 25}},
            "capacity": {"bandwidth": {"value": "25G"}},
        }
    )
    sel = select_device(
        [slow, fast],
        {},
        {"bandwidth": Quantity.parse("1G")},
        "best-fit",
        driver="drv",
        selectors=['device.attributes["drv"].speedGbps >= 25'],
    )
    assert isinstance(sel, Selection) and sel.device.name == "b"
    none = select_device(
        [slow],
        {},
        {"bandwidth": Quantity.parse("1G")},
        "best-fit",
        driver="drv",
        selectors=['device.attributes["drv"].speedGbps >= 25'],
    )
    assert isinstance(none, NoFit) and none.reasons == {"a": "does not match selectors"}


def test_no_cel_import_without_selectors() -> None:
    code = (
        "import sys\n"
        "from cni_dra.allocator import select_device\n"
        "from cni_dra.dra.objects import Device\n"
        "from cni_dra.quantity import Quantity\n"
        "d = Device.model_validate({'name': 'a', 'allowMultipleAllocations': True, 'capacity': {'bw': {'value': '1G'}}})\n"
        "select_device([d], {}, {'bw': Quantity.parse('1')}, 'best-fit')\n"
        "bad = [m for m in ('cel', 'yaml', 'click', 'kubernetes', 'pyroute2') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
