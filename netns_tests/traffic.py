"""Real TCP traffic for the shaping tests: Debian's ``iperf3``, servers in a "remote" netns,
clients in pod namespaces.

A "remote" netns holds the peer end of a stand-in NIC (a veth pair made by
``make_parent_nic``), so what a pod on that NIC sends leaves through the NIC as it would on
a node. :func:`remote_end` moves the peer there and addresses it; :class:`IperfServer`
runs a server in it; :func:`iperf_bps` / :func:`median_bps` run one client (egress: the pod
sends; ingress: ``-R``, the pod receives) and :func:`concurrent_median_bps` several at once
(pods sharing one NIC). Rates are what the receiver got, in bits per second: TCP goodput,
about 4.4 % below a shaped rate at MTU 1500 (tbf counts whole frames, 1514 bytes for 1448
of payload).

Nothing here asserts, except where a helper cannot go on (a server that does not start, a
client that fails): those raise ``RuntimeError`` with iperf3's own words.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = [
    "IPERF3",
    "RUNS",
    "SECONDS",
    "TOLERANCE",
    "M",
    "IperfServer",
    "Client",
    "remote_end",
    "iperf_bps",
    "median_bps",
    "concurrent_median_bps",
]

IPERF3 = shutil.which("iperf3")
RUNS, SECONDS, TOLERANCE = 3, 3, 0.10
"""Median of :data:`RUNS` runs of :data:`SECONDS` s; a shaped rate is met within ±:data:`TOLERANCE`."""
M = 1_000_000
_REFUSED_RETRY_S = 10.0


def remote_end(nic: str, remote: str, address: str, prefix: int = 24) -> None:
    """Move the peer (``<nic>p``) of stand-in NIC ``nic`` into netns ``remote``, give it
    ``address/prefix`` and bring it (and ``lo``) up."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        (peer,) = ipr.link_lookup(ifname=nic + "p")
        ipr.link("set", index=peer, net_ns_fd=os.path.basename(remote))
    with IPRoute(netns=remote) as ipr:
        (lo,) = ipr.link_lookup(ifname="lo")
        ipr.link("set", index=lo, state="up")
        (idx,) = ipr.link_lookup(ifname=nic + "p")
        ipr.addr("add", index=idx, address=address, prefixlen=prefix)
        ipr.link("set", index=idx, state="up")


class IperfServer:
    """``iperf3 -s`` bound to ``address`` (port ``port``) in netns ``netns``, its log in
    ``log_dir``; a context manager that waits until it listens and kills and reaps it on exit."""

    def __init__(self, netns: str, address: str, log_dir: Path, port: int = 5201) -> None:
        self.netns, self.address, self.port = netns, address, port
        self.log = log_dir / f"iperf3-server-{port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> IperfServer:
        if IPERF3 is None:
            raise RuntimeError("iperf3 not installed (make deps installs it)")
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [
                    "nsenter",
                    f"--net={self.netns}",
                    IPERF3,
                    "-s",
                    "-B",
                    self.address,
                    "-p",
                    str(self.port),
                    "--forceflush",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 10
        while "Server listening" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._stop()
                raise RuntimeError(f"iperf3 server did not start: {self.log.read_text()!r}")
            time.sleep(0.05)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@dataclass(frozen=True)
class Client:
    """One iperf3 client: from pod netns ``netns`` to the server at ``server``:``port``;
    ``reverse``: the server sends (the pod's ingress)."""

    netns: str
    server: str
    reverse: bool = False
    port: int = 5201

    def command(self, seconds: int) -> list[str]:
        assert IPERF3 is not None
        return [
            "nsenter",
            f"--net={self.netns}",
            IPERF3,
            "-c",
            self.server,
            "-p",
            str(self.port),
            "-t",
            str(seconds),
            "-J",
            *(["-R"] if self.reverse else []),
        ]


def _received_bps(stdout: str, stderr: str, returncode: int) -> float | None:
    """Bits per second the receiver got, or None when the server refused the connection
    (it closes and reopens its listening socket between two tests: worth a retry)."""
    try:
        out = json.loads(stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"iperf3 printed no JSON (exit {returncode}): {stdout[-2000:]}{stderr}") from exc
    if "Connection refused" in out.get("error", ""):
        return None
    if returncode != 0 or "error" in out:
        raise RuntimeError(f"iperf3 failed (exit {returncode}): {stdout[-2000:]}{stderr}")
    return float(out["end"]["sum_received"]["bits_per_second"])


def iperf_bps(client: Client, seconds: int = SECONDS) -> float:
    """One TCP run of ``seconds``; bits per second the receiver got. A refused connection is
    retried for a few seconds."""
    deadline = time.monotonic() + _REFUSED_RETRY_S
    while True:
        proc = subprocess.run(client.command(seconds), capture_output=True, text=True, timeout=seconds + 20)
        bps = _received_bps(proc.stdout, proc.stderr, proc.returncode)
        if bps is not None:
            return bps
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"iperf3 server {client.server}:{client.port} kept refusing: {proc.stdout[-2000:]}"
            )
        time.sleep(0.2)


def median_bps(client: Client, runs: int = RUNS, seconds: int = SECONDS) -> float:
    """Median of ``runs`` runs of :func:`iperf_bps`."""
    return statistics.median(iperf_bps(client, seconds) for _ in range(runs))


def _together(clients: Sequence[Client], seconds: int) -> list[float]:
    """One run of every client started at once (each to its own server); their rates. The
    whole round is repeated when a server refused one of them."""
    deadline = time.monotonic() + _REFUSED_RETRY_S
    while True:
        procs = [
            subprocess.Popen(c.command(seconds), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for c in clients
        ]
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=seconds + 20)
            results.append(_received_bps(out, err, proc.returncode))
        if all(r is not None for r in results):
            return [float(r) for r in results if r is not None]
        if time.monotonic() > deadline:
            raise RuntimeError("an iperf3 server kept refusing")
        time.sleep(0.2)


def concurrent_median_bps(clients: Sequence[Client], runs: int = RUNS, seconds: int = SECONDS) -> list[float]:
    """Per client, the median over ``runs`` rounds in which every client sends at once."""
    rounds = [_together(clients, seconds) for _ in range(runs)]
    return [statistics.median(r[i] for r in rounds) for i in range(len(clients))]
