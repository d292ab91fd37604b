"""``make bench --strict``: the targets are the ones the project promises, checked on every ratio."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "run.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cni_dra_bench_run", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def results(
    *,
    ref: float = 0.020,
    dra: float = 0.024,
    unshaped: float = 0.020,
    ref_wall: float = 2.0,
    dra_wall: float = 2.4,
    local: float | None = 0.160,
    small: float = 0.024,
    large: float = 0.0288,
) -> dict[str, Any]:
    r: dict[str, Any] = {
        "add_del": {
            "reference": {"median_s": ref},
            "cni-dra": {"median_s": dra},
            "cni-dra-unshaped": {"median_s": unshaped},
        },
        "check": {"reference": {"median_s": 0.005}, "cni-dra": {"median_s": 0.006}},
        "concurrent": {
            "reference": {"wall_s": ref_wall, "cpu_s": 3.0},
            "cni-dra": {"wall_s": dra_wall, "cpu_s": 3.3},
        },
        "scale": {"10": {"add_del_median_s": small}, "10000": {"add_del_median_s": large}},
    }
    if local is not None:
        r["local"] = {"add_del_median_s": local}
    return r


def test_every_target_met_at_its_limit(bench: ModuleType) -> None:
    # 24/20 = 1.2, 20/20 = 1.0, 2.4/2.0 = 1.2, 160/20 = 8, 28.8/24 = 1.2: all exactly at the limit
    met = bench.acceptance(bench.ratios_of(results()), failures=[])
    assert met == {
        "ADD+DEL, shaping on <= 1.2x": True,
        "ADD+DEL, shaping off <= 1.0x": True,
        "200 concurrent ADDs then DELs, wall <= 1.2x": True,
        "without the agent <= 8x": True,
        "largest state <= 1.2x smallest": True,
        "no failed invocation": True,
    }


@pytest.mark.parametrize(
    ("override", "failed"),
    [
        ({"dra": 0.0250}, "ADD+DEL, shaping on <= 1.2x"),
        ({"unshaped": 0.0201}, "ADD+DEL, shaping off <= 1.0x"),
        ({"dra_wall": 2.5}, "200 concurrent ADDs then DELs, wall <= 1.2x"),
        ({"local": 0.170}, "without the agent <= 8x"),
        ({"local": None}, "without the agent <= 8x"),
        ({"large": 0.030}, "largest state <= 1.2x smallest"),
    ],
)
def test_each_target_fails_alone_past_its_limit(
    bench: ModuleType, override: dict[str, Any], failed: str
) -> None:
    met = bench.acceptance(bench.ratios_of(results(**override)), failures=[])
    assert [name for name, ok in met.items() if not ok] == [failed]


def test_a_failed_invocation_fails_the_run(bench: ModuleType) -> None:
    met = bench.acceptance(bench.ratios_of(results()), failures=["ADD p3: exit 1"])
    assert met["no failed invocation"] is False
