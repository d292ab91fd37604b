"""``make bench``: cni-dra side by side with the reference macvlan + host-local plugins.

Runs as root on one machine, in one run, alternating the reference plugin
(``/usr/lib/cni/macvlan``, Debian's containernetworking-plugins) and cni-dra
(``/opt/cni/bin/cni-dra`` served by an agent: ``python -m cni_dra.fastpath.server``)
on the same work, exec'ing each plugin as a runtime does (env + stdin, one process per
verb). Parents are veth ends (stand-in NICs); every pod gets its own netns.

Measured (wall: per invocation as the driver sees it; CPU: user+system of every process
involved — plugin processes, the IPAM plugins they run and, for cni-dra, the agent —
divided by the number of operations):

* ``add_del``: ADD then DEL of one pod, N times (median, p95 of ADD+DEL wall); cni-dra
  also with ``"shaping": false`` (``cni-dra-unshaped``), so the table shows what shaping
  (tbf and an ifb device per pod) adds to ADD and DEL;
* ``check``: CHECK of an existing attachment with its prevResult;
* ``concurrent``: 200 ADDs started at once, then 200 DELs at once (wall of each batch);
* ``scale``: cni-dra ADD+DEL with 10 / 1,000 / 10,000 attachments already in its state;
* ``local``: cni-dra ADD+DEL with no agent (the in-process fallback);
* memory: peak RSS of one plugin process (``ru_maxrss``), the agent's RSS.

The targets (:data:`TARGETS`, all ratios in the same run) are printed under the table;
``--strict`` exits 1 when one is not met.

Writes the table to stdout and everything to ``bench/results.json``. Cleans up the veth,
the netns and its temporary directory even when interrupted. Absolute times vary from
machine to machine (and with load on it); the ratios, measured in the same run, are the
claim.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REF_DIR = "/usr/lib/cni"
DRA_EXE = "/opt/cni/bin/cni-dra"
PARENT = "cdb-par0"
NS_PREFIX = "cdb-ns-"
DRIVER = "net.cni-dra.dev"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Between the ADD+DEL pairs of the alternating runs. A link deletion ends in the kernel's RCU
# barrier (14-16 ms here); cni-dra's DEL answers before it, and a pair of the other plugin
# started meanwhile waited for that barrier too in its own DEL (the reference's pairs right
# after cni-dra's took 37 ms instead of 24 ms in one run). Not counted in any figure.
SETTLE_S = 0.025
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sh(*args: str) -> None:
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def sh_quiet(*args: str) -> None:
    subprocess.run(args, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[k]


class Proc:
    """One plugin exec: started now, collected by :meth:`finish` (wait4 for its rusage)."""

    def __init__(self, exe: str, env: dict[str, str], stdin: bytes, errlog: Any) -> None:
        self.t0 = time.perf_counter()
        self.p = subprocess.Popen(
            [exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog, env=env, cwd="/"
        )
        assert self.p.stdin is not None
        self.p.stdin.write(stdin)
        self.p.stdin.close()

    def finish(self) -> tuple[int, bytes, float, int]:
        """(exit code, stdout, wall seconds, max RSS KiB)."""
        assert self.p.stdout is not None
        out = self.p.stdout.read()
        _, status, ru = os.wait4(self.p.pid, 0)
        wall = time.perf_counter() - self.t0
        self.p.returncode = os.waitstatus_to_exitcode(status)
        self.p.stdout.close()
        return self.p.returncode, out, wall, ru.ru_maxrss


class Agent:
    """``python -m cni_dra.fastpath.server`` as a child; CPU read from /proc (ticks)."""

    def __init__(
        self, python: str, socket_path: str, errlog: Any, pythonpath: str = "", workers: int = 0
    ) -> None:
        self.socket_path = socket_path
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        self.p = subprocess.Popen(
            [python, "-m", "cni_dra.fastpath.server", "--socket", socket_path, "--cwd", "/"]
            + (["--workers", str(workers)] if workers else []),
            stdout=subprocess.PIPE,
            stderr=errlog,
            cwd="/",
            env=env,
        )
        assert self.p.stdout is not None
        line = self.p.stdout.readline().decode()
        if not line.startswith("ready"):
            raise RuntimeError(f"agent did not start: {line!r}")
        # "ready <socket> pids=<agent>,<worker process>,...": CPU and memory count them all
        pids = [w for w in line.split() if w.startswith("pids=")]
        self.pids = [int(p) for p in pids[0][5:].split(",")] if pids else [self.p.pid]

    def cpu_s(self) -> float:
        """User+system CPU of the agent processes and their reaped children (IPAM plugins), seconds."""
        total = 0
        for pid in self.pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            # fields[0] is state (field 3); utime..cstime are fields 14..17
            total += sum(int(x) for x in fields[11:15])
        return total / CLK_TCK

    def rss_kib(self) -> dict[str, int]:
        """VmRSS and VmHWM (peak), summed over the agent's processes."""
        out = {"VmRSS": 0, "VmHWM": 0, "processes": len(self.pids)}
        for pid in self.pids:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in ("VmRSS", "VmHWM"):
                        out[key] += int(value.split()[0])
        return out

    def stop(self) -> None:
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


# Runs argv[1] with this stdin/env; prints its stdout, then a line with its ru_maxrss (KiB).
_LAUNCHER = """
import os, sys
r, w = os.pipe()
pid = os.posix_spawn(sys.argv[1], [sys.argv[1]], os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_CLOSE, r)])
os.close(w)
out = b""
while chunk := os.read(r, 65536):
    out += chunk
_, status, ru = os.wait4(pid, 0)
code = os.waitstatus_to_exitcode(status)
sys.stdout.buffer.write(out + b"\\n" + str(ru.ru_maxrss).encode())
sys.exit(code)
"""


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class Bench:
    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        self.work = work
        self.args = args
        self.errlog = open(work / "stderr.log", "ab")
        self.failures: list[str] = []
        self.agent: Agent | None = None
        self.maxrss: dict[str, list[int]] = {"reference": [], "cni-dra": [], "cni-dra-local": []}

    # -- configs -----------------------------------------------------------------
    def ref_conf(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "bench-ref",
            "type": "macvlan",
            "master": PARENT,
            "mode": "bridge",
            "ipam": {
                "type": "host-local",
                "dataDir": str(self.work / "ipam-ref"),
                "ranges": [[{"subnet": "10.240.0.0/16"}]],
            },
        }

    def dra_conf(self, state: str = "state", shaping: bool = True) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "bench-dra",
            "type": "cni-dra",
            "mode": "bridge",
            "stateDir": str(self.work / state),
            "inventory": str(self.work / "slice.yaml"),
            "capacity": {"requests": {"bandwidth": "1M"}},
            "shaping": shaping,
            "ipam": {
                "type": "host-local",
                "dataDir": str(self.work / f"ipam-{state}"),
                "ranges": [[{"subnet": "10.241.0.0/16"}]],
            },
        }

    def conf_of(self, who: str) -> dict[str, Any]:
        if who == "reference":
            return self.ref_conf()
        return self.dra_conf(shaping=who != "cni-dra-unshaped")

    def env(self, command: str, cid: str, ns: int, mode: str) -> dict[str, str]:
        env = {
            "PATH": PATH_ENV,
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": cid,
            "CNI_NETNS": f"/var/run/netns/{NS_PREFIX}{ns}",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": REF_DIR,
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=p-{cid};K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={cid}",
        }
        if mode == "agent":
            assert self.agent is not None
            env.update(CNI_DRA_AGENT="require", CNI_DRA_AGENT_SOCKET=self.agent.socket_path)
        elif mode == "local":
            env["CNI_DRA_AGENT"] = "off"
        return env

    def start(self, who: str, command: str, cid: str, ns: int, conf: dict[str, Any]) -> Proc:
        if who == "reference":
            return Proc(
                f"{REF_DIR}/macvlan", self.env(command, cid, ns, "-"), json.dumps(conf).encode(), self.errlog
            )
        mode = "local" if who == "cni-dra-local" else "agent"
        return Proc(self.args.exe, self.env(command, cid, ns, mode), json.dumps(conf).encode(), self.errlog)

    def once(self, who: str, command: str, cid: str, ns: int, conf: dict[str, Any]) -> tuple[float, bytes]:
        rc, out, wall, _ = self.start(who, command, cid, ns, conf).finish()
        if rc != 0:
            self.failures.append(f"{who} {command} {cid}: exit {rc}: {out[:300]!r}")
        return wall, out

    # -- setup -------------------------------------------------------------------
    def exe_fingerprint(self) -> str:
        import hashlib

        return hashlib.sha256(Path(self.args.exe).read_bytes()).hexdigest()

    def check_exe_is_thin_client(self) -> None:
        """``CNI_DRA_AGENT=require`` with no agent must fail with code 11; an executable that
        answers instead is not the fast-path client (an older install)."""
        env = {
            "PATH": PATH_ENV,
            "CNI_COMMAND": "VERSION",
            "CNI_DRA_AGENT": "require",
            "CNI_DRA_AGENT_SOCKET": str(self.work / "no-agent.sock"),
        }
        proc = subprocess.run(
            [self.args.exe], input=b'{"cniVersion": "1.0.0"}', env=env, capture_output=True, cwd="/"
        )
        try:
            code = json.loads(proc.stdout).get("code")
        except ValueError:
            code = None
        if code != 11:
            raise RuntimeError(
                f"{self.args.exe} is not the cni-dra fast-path client (make install from this tree)"
            )

    def setup(self) -> None:
        self.check_exe_is_thin_client()
        self.fingerprint = self.exe_fingerprint()
        sh_quiet("ip", "link", "del", PARENT)
        sh("ip", "link", "add", PARENT, "type", "veth", "peer", "name", PARENT + "p")
        sh("ip", "link", "set", PARENT, "up")
        sh("ip", "link", "set", PARENT + "p", "up")
        for i in range(self.args.concurrency):
            sh_quiet("ip", "netns", "del", f"{NS_PREFIX}{i}")
            sh("ip", "netns", "add", f"{NS_PREFIX}{i}")
        import yaml  # the documented inventory format (conf/resourceslice.yaml)

        (self.work / "slice.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": "bench"},
                    "spec": {
                        "driver": DRIVER,
                        "nodeName": "bench",
                        "pool": {"name": "bench", "generation": 1, "resourceSliceCount": 1},
                        "devices": [
                            {
                                "name": "nic-a",
                                "allowMultipleAllocations": True,
                                "attributes": {"ifName": {"string": PARENT}},
                                "capacity": {
                                    "bandwidth": {
                                        "value": "1000T",
                                        "requestPolicy": {
                                            "default": "1M",
                                            "validRange": {"min": "1M", "step": "1M"},
                                        },
                                    }
                                },
                            }
                        ],
                    },
                }
            )
        )
        agent_dir = self.work / "agent"
        self.agent = Agent(
            self.args.python,
            str(agent_dir / "agent.sock"),
            self.errlog,
            self.args.pythonpath,
            self.args.agent_workers,
        )

    def teardown(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        for i in range(self.args.concurrency):
            sh_quiet("ip", "netns", "del", f"{NS_PREFIX}{i}")
        sh_quiet("ip", "link", "del", PARENT)
        self.errlog.close()

    def seed(self, state: str, count: int) -> None:
        """``count`` ready attachments of other pods in ``<work>/<state>`` (a filled node)."""
        from cni_dra.state import Attachment, StateStore

        conf = json.dumps(self.dra_conf(state))
        atts = []
        for i in range(count):
            cid = f"seed{i:06d}"
            atts.append(
                Attachment(
                    network="bench-dra",
                    containerID=cid,
                    ifname="eth0",
                    netns=f"/var/run/netns/seed-{i}",
                    podUID=str(uuid.UUID(int=i)),
                    podNamespace="bench",
                    podName=f"seed-{i}",
                    driver=DRIVER,
                    pool="bench",
                    device="nic-a",
                    parent=PARENT,
                    consumedCapacity={"bandwidth": "1M"},
                    shareID=str(uuid.UUID(int=i + 1)),
                    phase="ready",
                    ipamType="host-local",
                    ipamConf=conf,
                    result={
                        "cniVersion": "1.1.0",
                        "interfaces": [
                            {
                                "name": "eth0",
                                "mac": "02:00:00:00:00:01",
                                "sandbox": f"/var/run/netns/seed-{i}",
                            }
                        ],
                        "ips": [
                            {
                                "interface": 0,
                                "address": f"10.{100 + i // 65536}.{i // 256 % 256}.{i % 256}/16",
                            }
                        ],
                    },
                )
            )
        with StateStore(self.work / state).transaction() as txn:
            txn.put_all(atts)

    # -- scenarios ---------------------------------------------------------------
    def add_del(self, who: str, n: int, state: str = "state", tag: str = "") -> dict[str, Any]:
        conf = self.ref_conf() if who == "reference" else self.dra_conf(state)
        adds, dels, pairs = [], [], []
        cpu0 = children_cpu_s() + (self.agent.cpu_s() if who == "cni-dra" else 0.0)
        for i in range(n):
            cid = f"ad{tag}{who[:3]}{i}"
            a, _ = self.once(who, "ADD", cid, 0, conf)
            d, _ = self.once(who, "DEL", cid, 0, conf)
            adds.append(a)
            dels.append(d)
            pairs.append(a + d)
        cpu = children_cpu_s() + (self.agent.cpu_s() if who == "cni-dra" else 0.0) - cpu0
        return {
            "n": n,
            "add_del_median_s": statistics.median(pairs),
            "add_del_p95_s": pct(pairs, 0.95),
            "add_median_s": statistics.median(adds),
            "del_median_s": statistics.median(dels),
            "cpu_per_add_del_s": cpu / n,
        }

    def _cpu(self, who: str) -> float:
        return children_cpu_s() + (self.agent.cpu_s() if who in ("cni-dra", "cni-dra-unshaped") else 0.0)

    def interleaved_add_del(self, whos: list[str], n: int) -> dict[str, dict[str, Any]]:
        """ADD then DEL ``n`` times per plugin, alternating plugins pair by pair (the order
        flips every pair) so that both see the same machine load; :data:`SETTLE_S` between
        pairs, for every plugin, so that no pair waits for the kernel's work left by the one
        before (a DEL answered before the kernel freed the link, ``cni_dra.netlink.dellink``)."""
        acc: dict[str, dict[str, Any]] = {w: {"adds": [], "dels": [], "cpu": 0.0} for w in whos}
        for i in range(n):
            for w in whos if i % 2 == 0 else whos[::-1]:
                conf = self.conf_of(w)
                cpu0 = self._cpu(w)
                a, _ = self.once(w, "ADD", f"ad{w[:3]}{i}", 0, conf)
                d, _ = self.once(w, "DEL", f"ad{w[:3]}{i}", 0, conf)
                acc[w]["cpu"] += self._cpu(w) - cpu0
                acc[w]["adds"].append(a)
                acc[w]["dels"].append(d)
                time.sleep(SETTLE_S)
        out = {}
        for w, x in acc.items():
            pairs = [a + d for a, d in zip(x["adds"], x["dels"], strict=True)]
            out[w] = {
                "n": n,
                "median_s": statistics.median(pairs),
                "p95_s": pct(pairs, 0.95),
                "add_median_s": statistics.median(x["adds"]),
                "del_median_s": statistics.median(x["dels"]),
                "cpu_s": x["cpu"] / n,
                "pairs_s": pairs,
            }
        return out

    def interleaved_check(self, whos: list[str], n: int) -> dict[str, dict[str, Any]]:
        """One attachment per plugin, then ``n`` CHECKs each, alternating one by one."""
        confs, walls = {}, {w: [] for w in whos}
        for w in whos:
            conf = self.ref_conf() if w == "reference" else self.dra_conf()
            _, out = self.once(w, "ADD", f"ck{w[:3]}", 1 + whos.index(w), conf)
            try:
                confs[w] = (conf, {**conf, "prevResult": json.loads(out)})
            except ValueError:
                confs[w] = (conf, None)
        for i in range(n):
            for w in whos if i % 2 == 0 else whos[::-1]:
                if confs[w][1] is not None:
                    walls[w].append(self.once(w, "CHECK", f"ck{w[:3]}", 1 + whos.index(w), confs[w][1])[0])
        for w in whos:
            self.once(w, "DEL", f"ck{w[:3]}", 1 + whos.index(w), confs[w][0])
        return {
            w: {"n": len(v), "median_s": statistics.median(v) if v else float("nan"), "p95_s": pct(v, 0.95)}
            for w, v in walls.items()
        }

    def alternate(self, fn, whos: list[str], rounds: int, **kw: Any) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {w: [] for w in whos}
        for r in range(rounds):
            for w in whos if r % 2 == 0 else list(reversed(whos)):
                out[w].append(fn(w, tag=str(r), **kw))
        return out

    def peak_rss(self, who: str, n: int) -> None:
        """ru_maxrss of ADD and DEL processes, exec'd from a small launcher.

        A child's ru_maxrss includes the image it was forked from until exec; the bench
        process is large, so a ~9 MiB ``python -IS`` launcher spawns the plugin instead.
        The figure covers the plugin and the IPAM plugin it waits for (not the agent)."""
        conf = self.ref_conf() if who == "reference" else self.dra_conf()
        exe = f"{REF_DIR}/macvlan" if who == "reference" else self.args.exe
        mode = "local" if who == "cni-dra-local" else ("agent" if who == "cni-dra" else "-")
        for i in range(n):
            cid = f"mem{who[:3]}{who[-3:]}{i}"
            for command in ("ADD", "DEL"):
                env = self.env(command, cid, 2, mode)
                proc = subprocess.run(
                    [self.args.python, "-IS", "-c", _LAUNCHER, exe],
                    input=json.dumps(conf).encode(),
                    env=env,
                    capture_output=True,
                    cwd="/",
                    check=False,
                )
                if proc.returncode != 0:
                    self.failures.append(f"{who} {command} (memory): {proc.stdout[-300:]!r}")
                    continue
                self.maxrss[who].append(int(proc.stdout.rsplit(b"\n", 1)[-1]))

    def concurrent(self, who: str, tag: str = "") -> dict[str, Any]:
        conf = self.ref_conf() if who == "reference" else self.dra_conf()
        k = self.args.concurrency
        res: dict[str, Any] = {"pods": k}
        for command in ("ADD", "DEL"):
            cpu0 = children_cpu_s() + (self.agent.cpu_s() if who == "cni-dra" else 0.0)
            t0 = time.perf_counter()
            procs = [self.start(who, command, f"cc{tag}{who[:3]}{i}", i, conf) for i in range(k)]
            for p in procs:
                rc, out, _, rss = p.finish()
                if rc != 0:
                    self.failures.append(f"{who} concurrent {command}: exit {rc}: {out[:300]!r}")
            wall = time.perf_counter() - t0
            cpu = children_cpu_s() + (self.agent.cpu_s() if who == "cni-dra" else 0.0) - cpu0
            res[f"{command.lower()}_wall_s"] = wall
            res[f"{command.lower()}_cpu_s"] = cpu
        res["wall_s"] = res["add_wall_s"] + res["del_wall_s"]
        res["cpu_s"] = res["add_cpu_s"] + res["del_cpu_s"]
        return res


def summarize(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exe", default=DRA_EXE)
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the agent")
    parser.add_argument(
        "--pythonpath", default="", help="PYTHONPATH of the agent (a work tree instead of the install)"
    )
    parser.add_argument(
        "--agent-workers", type=int, default=0, help="worker threads of the agent (0: its default)"
    )
    parser.add_argument("--pairs", type=int, default=100, help="ADD+DEL pairs per plugin")
    parser.add_argument("--checks", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the concurrent batch per plugin")
    parser.add_argument("--scale", default="10,1000,10000", help="attachments pre-seeded in the state")
    parser.add_argument("--scale-pairs", type=int, default=15)
    parser.add_argument(
        "--local-pairs", type=int, default=5, help="ADD+DEL pairs without the agent (0: skip)"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target ratio is not met")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results.json"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench: must run as root (network namespaces, veth)", file=sys.stderr)
        return 2
    for exe in (f"{REF_DIR}/macvlan", f"{REF_DIR}/host-local", args.exe):
        if not os.access(exe, os.X_OK):
            print(f"bench: {exe} missing (make install installs it)", file=sys.stderr)
            return 2
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="cni-dra-bench-"))
    bench = Bench(work, args)
    results: dict[str, Any] = {}
    try:
        try:
            bench.setup()
        except RuntimeError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 2
        print(f"bench: work dir {work}, agent pid {bench.agent.p.pid}", file=sys.stderr)
        # warm-up (page cache, agent first request), not recorded
        bench.add_del("reference", 2, tag="w")
        bench.add_del("cni-dra", 2, tag="w")
        whos = ["reference", "cni-dra"]
        results["add_del"] = bench.interleaved_add_del([*whos, "cni-dra-unshaped"], args.pairs)
        print("bench: add_del done", file=sys.stderr)
        results["check"] = bench.interleaved_check(whos, args.checks)
        print("bench: check done", file=sys.stderr)
        cc = bench.alternate(
            lambda w, tag: bench.concurrent(w, tag=tag), ["reference", "cni-dra"], args.rounds
        )
        results["concurrent"] = {
            w: {k: summarize(r, k) for k in ("wall_s", "cpu_s", "add_wall_s", "del_wall_s")}
            | {"pods": args.concurrency, "runs": r}
            for w, r in cc.items()
        }
        print("bench: concurrent done", file=sys.stderr)
        agent_rss_steady = bench.agent.rss_kib()  # before the 10,000-attachment states pass through it
        counts = [int(x) for x in args.scale.split(",") if x]
        for count in counts:
            bench.seed(f"state-{count}", count)
            bench.add_del("cni-dra", 1, state=f"state-{count}", tag=f"sw{count}")
        # pair by pair across the state sizes (order flipped each time): same load for all
        runs: dict[int, list[dict[str, Any]]] = {c: [] for c in counts}
        for i in range(args.scale_pairs):
            for count in counts if i % 2 == 0 else counts[::-1]:
                runs[count].append(bench.add_del("cni-dra", 1, state=f"state-{count}", tag=f"s{count}-{i}"))
        results["scale"] = {
            str(c): {
                "n": len(r),
                "add_del_median_s": statistics.median(x["add_del_median_s"] for x in r),
                "add_del_p95_s": pct([x["add_del_median_s"] for x in r], 0.95),
                "add_median_s": statistics.median(x["add_median_s"] for x in r),
                "del_median_s": statistics.median(x["del_median_s"] for x in r),
                "cpu_per_add_del_s": statistics.mean(x["cpu_per_add_del_s"] for x in r),
            }
            for c, r in runs.items()
        }
        print("bench: scale done", file=sys.stderr)
        if args.local_pairs:
            results["local"] = bench.add_del("cni-dra-local", args.local_pairs, tag="l")
        for who in ("reference", "cni-dra") + (("cni-dra-local",) if args.local_pairs else ()):
            bench.peak_rss(who, 3)
        results["memory_kib"] = {
            "plugin_peak_rss": {w: max(v) for w, v in bench.maxrss.items() if v},
            "agent": agent_rss_steady,
            "agent_after_scale": bench.agent.rss_kib(),
        }
    finally:
        if getattr(bench, "fingerprint", None) and bench.exe_fingerprint() != bench.fingerprint:
            bench.failures.insert(
                0, f"{args.exe} was replaced during the run (another install?): results are not valid"
            )
        bench.teardown()
        shutil.rmtree(work, ignore_errors=True)
    results["failures"] = bench.failures
    results["elapsed_s"] = time.perf_counter() - started
    results["machine"] = {
        "nproc": os.cpu_count(),
        "kernel": os.uname().release,
        "python": sys.version.split()[0],
        "load_avg_1m": os.getloadavg()[0],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    results["ratios"] = ratios_of(results)
    results["acceptance"] = acceptance(results["ratios"], failures=bench.failures)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print(f"results: {args.out}")
    if bench.failures:
        return 1
    return 0 if all(results["acceptance"].values()) or not args.strict else 1


# The targets a run must meet (``--strict`` exits 1 otherwise): (name, ratio key, limit).
TARGETS: tuple[tuple[str, str, float], ...] = (
    ("ADD+DEL, shaping on <= 1.2x", "add_del", 1.2),
    ("ADD+DEL, shaping off <= 1.0x", "add_del_unshaped", 1.0),
    ("200 concurrent ADDs then DELs, wall <= 1.2x", "concurrent_wall", 1.2),
    ("without the agent <= 8x", "local", 8.0),
    ("largest state <= 1.2x smallest", "scale_max_vs_min", 1.2),
)


def ratios_of(results: dict[str, Any]) -> dict[str, float]:
    """The ratios the targets are set on, from the medians (and walls) of one run."""
    ad = results["add_del"]
    ref = ad["reference"]["median_s"]
    ratios = {
        "add_del": ad["cni-dra"]["median_s"] / ref,
        "check": results["check"]["cni-dra"]["median_s"] / results["check"]["reference"]["median_s"],
        "concurrent_wall": results["concurrent"]["cni-dra"]["wall_s"]
        / results["concurrent"]["reference"]["wall_s"],
        "concurrent_cpu": results["concurrent"]["cni-dra"]["cpu_s"]
        / results["concurrent"]["reference"]["cpu_s"],
    }
    if "cni-dra-unshaped" in ad:
        ratios["add_del_unshaped"] = ad["cni-dra-unshaped"]["median_s"] / ref
    if "local" in results:
        ratios["local"] = results["local"]["add_del_median_s"] / ref
    counts = sorted(int(c) for c in results.get("scale", {}))
    if len(counts) >= 2:
        ratios["scale_max_vs_min"] = (
            results["scale"][str(counts[-1])]["add_del_median_s"]
            / results["scale"][str(counts[0])]["add_del_median_s"]
        )
    return ratios


def acceptance(ratios: dict[str, float], failures: list[str]) -> dict[str, bool]:
    """Each target met or not; a target whose figure was not measured (skipped) is not met."""
    met = {name: ratios.get(key, float("inf")) <= limit for name, key, limit in TARGETS}
    met["no failed invocation"] = not failures
    return met


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def table(r: dict[str, Any]) -> str:
    ad, ck, cc, ratios = r["add_del"], r["check"], r["concurrent"], r["ratios"]
    rows = [
        ("", "reference", "cni-dra", "ratio"),
        (
            "ADD+DEL median",
            ms(ad["reference"]["median_s"]),
            ms(ad["cni-dra"]["median_s"]),
            f"{ratios['add_del']:.2f}x",
        ),
        (
            "ADD+DEL p95",
            ms(ad["reference"]["p95_s"]),
            ms(ad["cni-dra"]["p95_s"]),
            f"{ad['cni-dra']['p95_s'] / ad['reference']['p95_s']:.2f}x",
        ),
        (
            "ADD+DEL CPU",
            ms(ad["reference"]["cpu_s"]),
            ms(ad["cni-dra"]["cpu_s"]),
            f"{ad['cni-dra']['cpu_s'] / ad['reference']['cpu_s']:.2f}x",
        ),
    ]
    if "cni-dra-unshaped" in ad:
        un = ad["cni-dra-unshaped"]
        rows += [
            (
                "  cni-dra with shaping off: ADD+DEL",
                "",
                f"{ms(un['median_s'])} ({ms(un['add_median_s'])} / {ms(un['del_median_s'])})",
                f"{un['median_s'] / ad['reference']['median_s']:.2f}x",
            ),
            (
                "  what shaping adds: ADD / DEL",
                "",
                f"{ms(ad['cni-dra']['add_median_s'] - un['add_median_s'])} / {ms(ad['cni-dra']['del_median_s'] - un['del_median_s'])}",
                "",
            ),
        ]
    rows += [
        (
            "CHECK median",
            ms(ck["reference"]["median_s"]),
            ms(ck["cni-dra"]["median_s"]),
            f"{ratios['check']:.2f}x",
        ),
        (
            "CHECK p95",
            ms(ck["reference"]["p95_s"]),
            ms(ck["cni-dra"]["p95_s"]),
            f"{ck['cni-dra']['p95_s'] / ck['reference']['p95_s']:.2f}x",
        ),
        (
            f"{cc['reference']['pods']} concurrent ADDs wall",
            f"{cc['reference']['add_wall_s']:.2f} s",
            f"{cc['cni-dra']['add_wall_s']:.2f} s",
            f"{cc['cni-dra']['add_wall_s'] / cc['reference']['add_wall_s']:.2f}x",
        ),
        (
            f"{cc['reference']['pods']} concurrent DELs wall",
            f"{cc['reference']['del_wall_s']:.2f} s",
            f"{cc['cni-dra']['del_wall_s']:.2f} s",
            f"{cc['cni-dra']['del_wall_s'] / cc['reference']['del_wall_s']:.2f}x",
        ),
        (
            "  ADDs+DELs wall",
            f"{cc['reference']['wall_s']:.2f} s",
            f"{cc['cni-dra']['wall_s']:.2f} s",
            f"{ratios['concurrent_wall']:.2f}x",
        ),
        (
            "  ADDs+DELs CPU",
            f"{cc['reference']['cpu_s']:.2f} s",
            f"{cc['cni-dra']['cpu_s']:.2f} s",
            f"{ratios['concurrent_cpu']:.2f}x",
        ),
    ]
    scale = r["scale"]
    counts = sorted(int(c) for c in scale)
    for c in counts:
        s = scale[str(c)]
        rows.append(
            (
                f"cni-dra ADD+DEL, {c} in state",
                "",
                f"{ms(s['add_del_median_s'])} (p95 {ms(s['add_del_p95_s'])})",
                f"{s['add_del_median_s'] / scale[str(counts[0])]['add_del_median_s']:.2f}x of {counts[0]}",
            )
        )
    if "local" in r:
        rows.append(
            (
                "cni-dra ADD+DEL, no agent",
                "",
                ms(r["local"]["add_del_median_s"]),
                f"{r['local']['add_del_median_s'] / ad['reference']['median_s']:.2f}x",
            )
        )
    mem = r["memory_kib"]
    peak = mem["plugin_peak_rss"]
    rows.append(
        (
            "peak RSS of one plugin process",
            f"{peak.get('reference', 0) / 1024:.1f} MiB",
            f"{peak.get('cni-dra', 0) / 1024:.1f} MiB",
            "",
        )
    )
    if "cni-dra-local" in peak:
        rows.append(("  same, no agent (in-process)", "", f"{peak['cni-dra-local'] / 1024:.1f} MiB", ""))
    after = mem["agent_after_scale"]
    rows.append(
        (
            "agent RSS after the scale runs (peak)",
            "",
            f"{after['VmRSS'] / 1024:.1f} MiB ({after['VmHWM'] / 1024:.1f} MiB)",
            "",
        )
    )
    rows.insert(
        len(rows) - 1,
        (
            "agent RSS before the scale runs (peak)",
            "",
            f"{mem['agent'].get('VmRSS', 0) / 1024:.1f} MiB ({mem['agent'].get('VmHWM', 0) / 1024:.1f} MiB)",
            "",
        ),
    )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    lines.append("")
    lines.append(
        "targets (on the medians above): "
        + ", ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in r["acceptance"].items())
    )
    if r["failures"]:
        lines.append(f"{len(r['failures'])} failed invocations, first: {r['failures'][0]}")
    lines.append(
        f"elapsed {r['elapsed_s']:.0f} s on {r['machine']['nproc']} CPUs, load {r['machine']['load_avg_1m']:.2f}. "
        "Absolute times vary by machine and load; the ratios (same run, alternating) are the claim."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
