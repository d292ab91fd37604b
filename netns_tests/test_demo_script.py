"""`make demo`'s script itself (scripts/demo.sh): runs to the end, leaves nothing behind,
and refuses to start when a name it would create is taken (without touching it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from netns_tests.runner import CNI_EXE, CNI_PATH

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("eth-a", "eth-a-peer", "eth-b", "eth-b-peer")


def _leftovers() -> list[str]:
    links = [n for n in NAMES if os.path.exists(f"/sys/class/net/{n}")]
    netns = [
        n
        for n in (os.listdir("/var/run/netns") if os.path.isdir("/var/run/netns") else [])
        if n.startswith("cni-dra-demo")
    ]
    return links + netns


def _demo() -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "CNI_DRA_EXE": CNI_EXE,
        "CNI_PATH": CNI_PATH,
    }
    return subprocess.run(
        ["bash", str(ROOT / "scripts/demo.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


def test_demo_script_runs_and_cleans_up():
    if _leftovers():
        pytest.skip(f"demo names in use on this host: {_leftovers()}")
    proc = _demo()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "pod4" in out and "remaining bandwidth 3G < 8G" in out and "remaining bandwidth 0 < 8G" in out
    assert "claim mode" in out and "capacity back" in out
    assert _leftovers() == []


def test_demo_refuses_when_a_name_is_taken():
    if _leftovers():
        pytest.skip(f"demo names in use on this host: {_leftovers()}")
    subprocess.run(["ip", "link", "add", "eth-a", "type", "veth", "peer", "name", "eth-a-peer"], check=True)
    try:
        proc = _demo()
        assert proc.returncode != 0
        assert "refusing to start" in proc.stderr and "link eth-a" in proc.stderr
        assert os.path.exists("/sys/class/net/eth-a")  # ours, untouched
        assert not os.path.exists("/sys/class/net/eth-b")
    finally:
        subprocess.run(["ip", "link", "del", "eth-a"], check=False, capture_output=True)
    assert _leftovers() == []
