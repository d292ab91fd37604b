"""200 concurrent ADDs, then 200 concurrent DELs, against three 10G stand-in NICs.

Judged independently of the plugin's report:

* a checker thread reads the state under the plugin's own lock over and over: the sum of
  ``consumedCapacity`` per NIC never exceeds its value at any read;
* every ADD either succeeds or fails with code 100 (no room), and a failed request would
  not fit on any NIC even at the end of the ADD phase (charges only grow during it, so it
  did not fit when it ran either): all that fit succeed;
* no IP is handed out twice; each pod has exactly one link, on the NIC its attachment names;
* after the DELs: no link in any pod netns, no host-local reservation, no attachment.

Sizes cycle over 100M/200M/300M (40G asked, 30G available).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cni_dra.netlink.info import host_link_by_index, link_in_netns
from cni_dra.quantity import Quantity
from cni_dra.state import StateStore
from netns_tests import runner
from netns_tests.bed import NodeBed, pod_args

N = 200
SIZES = ("100M", "200M", "300M")
TIMEOUT_S = 300  # 200 plugin processes share 2 cores: one invocation waits far longer than alone

run_plugin = runner.run_plugin


def own_totals(state: Any) -> dict[str, Quantity]:
    """Bandwidth per device as this test counts it, not as the product's ledger does: the
    sum of every attachment's own record (standalone mode: each its own share)."""
    totals: dict[str, Quantity] = {}
    for a in state.attachments:
        totals[a.device] = totals.get(a.device, Quantity.ZERO) + a.consumedCapacity["bandwidth"]
    return totals


class Checker(threading.Thread):
    """Reads the state under the lock until stopped; records every over-commit it sees."""

    def __init__(self, node: NodeBed) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.stop = threading.Event()
        self.reads = 0
        self.max_seen: dict[str, Quantity] = {}
        self.violations: list[str] = []

    def run(self) -> None:
        store = StateStore(self.node.state_dir, lock_timeout_s=120)
        path = self.node.state_dir / "state.json"
        while not self.stop.is_set():
            with store.locked():
                state = store.read_files() if path.exists() else None  # snapshot + journal
            if state is not None:
                for dev, bw in own_totals(state).items():
                    if dev not in self.max_seen or bw > self.max_seen[dev]:
                        self.max_seen[dev] = bw
                    if bw > self.node.capacity:
                        self.violations.append(f"{dev}: {bw} > {self.node.capacity}")
                self.reads += 1
            time.sleep(0.01)


def test_200_concurrent_add_then_del(make_node, make_netns):
    node = make_node(nics=3, network="relnet")
    pods = [(f"pod-{i:03d}", make_netns(), SIZES[i % len(SIZES)]) for i in range(N)]
    checker = Checker(node)
    checker.start()
    t0 = time.monotonic()
    try:

        def add(pod):
            cid, ns, size = pod
            conf = node.conf(size, lockTimeoutSeconds=120)
            return run_plugin(
                "ADD",
                conf,
                container_id=cid,
                netns=ns,
                ifname="eth0",
                cni_args=pod_args(cid),
                timeout_s=TIMEOUT_S,
            )

        with ThreadPoolExecutor(max_workers=N) as pool:
            added = list(pool.map(add, pods))
        t_add = time.monotonic() - t0

        ok = [(pod, out) for pod, (code, out, _) in zip(pods, added, strict=True) if code == 0]
        failed = [
            (pod, code, out, err) for pod, (code, out, err) in zip(pods, added, strict=True) if code != 0
        ]
        assert all(out and out.get("code") == 100 for _, _, out, _ in failed), failed[:3]
        assert len(ok) >= 100, f"only {len(ok)} of {N} ADDs succeeded"

        state = node.state()
        assert {a.containerID for a in state.attachments} == {pod[0] for pod, _ in ok}
        assert all(a.phase == "ready" for a in state.attachments)
        by_cid = {a.containerID: a for a in state.attachments}
        for (cid, _, size), _ in ok:  # each record holds at least what its pod asked for
            assert by_cid[cid].consumedCapacity["bandwidth"] >= Quantity.parse(size), cid
        consumed = own_totals(state)
        for dev in node.parents:
            assert consumed.get(dev, Quantity.ZERO) <= node.capacity, dev
        # all that fit succeed: each refused request fits nowhere even now
        free = [node.capacity - consumed.get(dev, Quantity.ZERO) for dev in node.parents]
        for (cid, _, size), _, _, _ in failed:
            assert all(Quantity.parse(size) > f for f in free), (cid, size, free)

        ips = [out["ips"][0]["address"] for _, out in ok]
        assert len(set(ips)) == len(ips), "duplicate IP"
        assert sorted(node.ip_holders().values()) == sorted(pod[0] for pod, _ in ok)
        by_cid = {a.containerID: a for a in state.attachments}
        for (cid, ns, _), out in ok:
            link = link_in_netns(ns, "eth0")
            assert link is not None and link.kind == "macvlan", cid
            assert host_link_by_index(link.parent_index).name == by_cid[cid].parent, cid
            assert out["ips"][0]["address"] in link.addresses, cid
        for (cid, ns, _), _, _, _ in failed:
            assert link_in_netns(ns, "eth0") is None, cid

        def delete(pod):
            cid, ns, size = pod
            return run_plugin(
                "DEL",
                node.conf(size, lockTimeoutSeconds=120),
                container_id=cid,
                netns=ns,
                ifname="eth0",
                cni_args=pod_args(cid),
                timeout_s=TIMEOUT_S,
            )

        t1 = time.monotonic()
        with ThreadPoolExecutor(max_workers=N) as pool:
            deleted = list(pool.map(delete, pods))
        t_del = time.monotonic() - t1
        assert [c for c, _, _ in deleted] == [0] * N, [e for c, _, e in deleted if c][:3]
    finally:
        checker.stop.set()
        checker.join(30)

    assert checker.reads > 20, checker.reads
    assert checker.violations == [], checker.violations[:5]
    assert node.state().attachments == []
    assert node.ip_holders() == {}
    for cid, ns, _ in pods:
        assert link_in_netns(ns, "eth0") is None, cid
    print(
        f"\nstress: {len(ok)} ADD ok, {len(failed)} refused (code 100) in {t_add:.1f}s; "
        f"{N} DEL in {t_del:.1f}s; checker read the state {checker.reads} times, max per NIC "
        + ", ".join(f"{d}={q}" for d, q in sorted(checker.max_seen.items()))
    )
