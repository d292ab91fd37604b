"""What scripts/e2e/smoke-runtimes's checks share: running commands, the logging CNI shim,
and removing what a check leaves behind (processes, mounts, cgroups, libcni's cache)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent  # scripts/e2e
CACHE = Path(os.environ.get("CNI_DRA_E2E_CACHE", "/var/cache/cni-dra-e2e"))
TAG = f"cni-dra-smoke-{os.getpid()}"  # cgroup parent, network name, netns prefix
SUBNET = f"10.250.{os.getpid() % 250}"  # /24 of this run's pods
SHIM = """#!/usr/bin/python3 -I
# Logs every CNI call to {log} (one JSON object a line), then runs {real}.
import json, os, subprocess, sys, time
data = sys.stdin.buffer.read()
t = time.time()
netns_exists = os.path.exists(os.environ.get("CNI_NETNS") or "/nonexistent")  # before the plugin runs
p = subprocess.run([{real!r}], input=data, capture_output=True)
env = {{k: v for k, v in os.environ.items() if k.startswith("CNI_")}}
try:
    conf = json.loads(data) if data.strip() else None
except ValueError:
    conf = data.decode(errors="replace")
with open({log!r}, "a") as f:
    f.write(json.dumps({{"t": t, "plugin": {name!r}, "env": env, "conf": conf, "rc": p.returncode,
                        "netns_exists": netns_exists,
                        "out": p.stdout.decode(errors="replace")}}) + "\\n")
sys.stdout.buffer.write(p.stdout)
sys.stderr.buffer.write(p.stderr)
sys.exit(p.returncode)
"""


class SmokeError(Exception):
    pass


def log(msg: str) -> None:
    print(f"smoke: {msg}", file=sys.stderr, flush=True)


def run(*args: str, check: bool = True, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise SmokeError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def last_line(*args: str) -> str:
    """Run a build script (its progress passes through to stderr); its last stdout line."""
    p = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=True)
    return p.stdout.strip().splitlines()[-1]


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.2)
    raise SmokeError(f"timed out after {timeout_s} s waiting for {what}")


# -- what the checks leave behind: processes, mounts, cgroups --------------------------------


def cgroup_hierarchies() -> list[Path]:
    out: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[fields.index("-") + 1] in ("cgroup", "cgroup2") and Path(fields[4]) not in out:
            out.append(Path(fields[4]))
    return out


def make_cgroup_parent() -> None:
    """/TAG in every hierarchy, with cpuset's cpus and mems filled (v1 leaves them empty)."""
    for h in cgroup_hierarchies():
        d = h / TAG
        d.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (h / knob).exists() and not (d / knob).read_text().strip():
                (d / knob).write_text((h / knob).read_text().strip())


def remove_cgroup_parent() -> None:
    """Kill what still runs under /TAG (conmon, containers), then remove those cgroups."""
    left: list[Path] = []
    for _ in range(5):
        for h in cgroup_hierarchies():
            for procs in (h / TAG).rglob("cgroup.procs") if (h / TAG).is_dir() else []:
                with contextlib.suppress(OSError):
                    for pid in procs.read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.3)
        left = []
        for h in cgroup_hierarchies():
            root = h / TAG
            if not root.is_dir():
                continue
            dirs = sorted(
                (d for d in root.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True
            )
            for d in [*dirs, root]:
                try:
                    d.rmdir()
                except OSError:
                    left.append(d)
        if not left:
            return
    raise SmokeError(f"cgroups left: {left[:5]}")


def mounts_under(prefix: Path) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if mp == str(prefix) or mp.startswith(f"{prefix}/"):
            out.append(mp)
    return out


def unmount_under(prefix: Path) -> None:
    for _ in range(10):
        mps = mounts_under(prefix)
        if not mps:
            return
        for mp in sorted(set(mps), key=lambda m: m.count("/"), reverse=True):
            if run("umount", mp, check=False).returncode != 0:
                run("umount", "-l", mp, check=False)
    raise SmokeError(f"mounts left: {mounts_under(prefix)[:5]}")


def kill_mentioning(needle: str) -> None:
    """Processes whose command line names our temporary directory (conmon, a stuck crio)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle.encode() in (d / "cmdline").read_bytes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(d.name), signal.SIGKILL)


def remove_cni_cache(network: str) -> None:
    """libcni's cached results (CRI-O keeps the default /var/lib/cni)."""
    for f in Path("/var/lib/cni/results").glob(f"{network}-*"):
        f.unlink(missing_ok=True)


def write_shim(bin_dir: Path, real: Path, calls: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / real.name
    shim.write_text(SHIM.format(log=str(calls), real=str(real), name=real.name))
    shim.chmod(0o755)


def read_calls(calls: Path) -> list[dict[str, Any]]:
    if not calls.exists():
        return []
    return [json.loads(line) for line in calls.read_text().splitlines() if line.strip()]


def ping(ip: str, timeout_s: float = 2.0) -> bool:
    """One ICMP echo (the host has no ping binary); True when the reply comes."""
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as s:
        s.settimeout(timeout_s)
        ident, payload = os.getpid() & 0xFFFF, b"cni-dra-smoke"
        msg = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + payload  # echo request
        padded = msg + b"\0" * (len(msg) % 2)
        total = sum(struct.unpack(f"!{len(padded) // 2}H", padded))
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        s.sendto(msg[:2] + struct.pack("!H", ~total & 0xFFFF) + msg[4:], (ip, 0))
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                data, addr = s.recvfrom(1500)
            except TimeoutError:
                return False
            ihl = (data[0] & 0xF) * 4
            if addr[0] == ip and data[ihl] == 0 and struct.unpack("!H", data[ihl + 4 : ihl + 6])[0] == ident:
                return True
    return False


def netns_ipv4(netns: str, ifname: str) -> list[str]:
    """The interface's IPv4 addresses inside a netns (iproute2's JSON; a smoke check)."""
    out = run("nsenter", f"--net={netns}", "ip", "-j", "-4", "addr", "show", "dev", ifname).stdout
    return [f"{a['local']}/{a['prefixlen']}" for link in json.loads(out) for a in link.get("addr_info", [])]


def last_lines(*args: str) -> list[str]:
    p = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=True)
    return p.stdout.strip().splitlines()
