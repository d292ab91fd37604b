"""``make bench-cluster``: pod start-up and tear-down in the real two-node cluster
(scripts/e2e/cluster.py), cni-dra against the reference macvlan + host-local plugins, on
the same node, the same runtime and kubelet, in one run.

Every round is a burst: N pods (``--pods``, default 50) created at once, pinned to the
first node, waited for until all are Ready, then deleted at once and waited for until all
are gone (and their generated ResourceClaims, and the node's books empty). Variants:

* ``reference``: the node's primary network is the reference macvlan (bridge mode on the
  node's NIC ``cde2e-nic0``) with host-local (Debian's containernetworking-plugins, as
  ``make install`` links them into /opt/cni/bin; the node's copy is the same), pods
  without claims;
* ``reference+claim``: the same network, each pod with a ResourceClaim from a template
  (one 100M share of a NIC): the claim is created, allocated by the scheduler and prepared
  by the kubelet through cni-dra's DRA driver, but the pod's interface is the
  reference's. What it adds over ``reference`` is the Kubernetes DRA path (claim
  controller, scheduler, kubelet DRA manager and cni-dra's NodePrepareResources);
* ``cni-dra``: the node's own network, cni-dra (as the chart installs it), the same pods
  with claims: what it adds over ``reference+claim`` is cni-dra's CNI ADD and DEL
  against the reference's.

The network is switched by writing (or removing) ``/etc/cni/net.d/00-bench-reference.conflist``
in the node: the runtime takes the first conflist by name and reloads on a change; a
probe pod after each switch checks which network answers (its address range). Rounds
alternate: each round runs every variant, in reverse order every other round.

Measured by the bench itself (watch events on the pods, monotonic clock, ms resolution):
per pod, create request → the first event with its node set → the first with Ready=True,
delete request → DELETED; the burst's first create → last Ready, first delete → last
gone. From the components' own ``/metrics``, as deltas over each burst: the kubelet's
``kubelet_runtime_operations_duration_seconds`` (run_podsandbox, stop_podsandbox),
``kubelet_pod_start_sli_duration_seconds``, ``dra_operations_duration_seconds``
(PrepareResources, UnprepareResources), ``dra_grpc_operations_duration_seconds``
(NodePrepareResources, NodeUnprepareResources to cni-dra), and cni-dra's agent's
``cni_dra_prepare_seconds`` and ``cni_dra_unprepare_seconds``. Under CRI-O, from its log
(the part written during the burst), each pod's CNI ADD and CHECK.

Bed: when ``scripts/e2e/cluster.py status`` says it is up, the bench uses it and leaves it
up; otherwise it brings it up and takes it down at the end, failure or not (runtime:
``CNI_DRA_E2E_RUNTIME``). Prints the table and writes ``bench/cluster-results.json``.
Needs root (the bed, nsenter into the node)."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the e2e tests' helpers
from cluster_stats import (
    Histogram,
    PodTimes,
    Round,
    crio_cni_calls,
    histogram,
    parse_metrics,
    render_table,
    summarize,
)

from netns_tests.e2e.helpers import NS, load_cluster_module, make_template, node_http

REPO = Path(__file__).resolve().parents[1]

LABEL = "cni-dra-bench"
TEMPLATE = "cni-dra-bench-share"
REF_CONFLIST = "/etc/cni/net.d/00-bench-reference.conflist"
REF_NETWORK = "bench-reference"
REF_SUBNET = "10.246.1.0/24"
REF_PARENT = "cde2e-nic0"
VARIANTS = ("reference", "reference+claim", "cni-dra")
CLAIMS = {"reference": False, "reference+claim": True, "cni-dra": True}
KUBELET_HISTOGRAMS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("run_podsandbox", "kubelet_runtime_operations_duration_seconds", {"operation_type": "run_podsandbox"}),
    (
        "create_container",
        "kubelet_runtime_operations_duration_seconds",
        {"operation_type": "create_container"},
    ),
    ("start_container", "kubelet_runtime_operations_duration_seconds", {"operation_type": "start_container"}),
    ("pod_start_sli", "kubelet_pod_start_sli_duration_seconds", {}),
    ("dra_prepare", "dra_operations_duration_seconds", {"operation_name": "PrepareResources"}),
    (
        "dra_grpc_prepare",
        "dra_grpc_operations_duration_seconds",
        {"method_name": "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"},
    ),
    ("stop_podsandbox", "kubelet_runtime_operations_duration_seconds", {"operation_type": "stop_podsandbox"}),
    ("dra_unprepare", "dra_operations_duration_seconds", {"operation_name": "UnprepareResources"}),
    (
        "dra_grpc_unprepare",
        "dra_grpc_operations_duration_seconds",
        {"method_name": "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"},
    ),
)
AGENT_HISTOGRAMS = (
    ("agent_prepare", "cni_dra_prepare_seconds"),
    ("agent_unprepare", "cni_dra_unprepare_seconds"),
)
AGENT_METRICS_URL = "http://127.0.0.1:9412/metrics"


def log(msg: str) -> None:
    print(f"bench-cluster: {msg}", file=sys.stderr, flush=True)


# -- the network of the node -----------------------------------------------------------------


def reference_conflist() -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": REF_NETWORK,
        "plugins": [
            {
                "type": "macvlan",
                "master": REF_PARENT,
                "mode": "bridge",
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": REF_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }


def use_reference(node, on: bool) -> None:
    """Make the reference conflist the node's first (``on``) or remove it; atomically (a
    runtime may read the directory at any moment)."""
    path = node.host_path(REF_CONFLIST)
    if on:
        tmp = path.with_name(".bench-reference.tmp")
        tmp.write_text(json.dumps(reference_conflist(), indent=1))
        tmp.rename(path)
    else:
        path.unlink(missing_ok=True)


# -- the API objects -------------------------------------------------------------------------


def pod_body(cluster, name: str, node: str, *, claim: bool, tag: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [{"name": "app", "image": cluster.TEST_IMAGE, "imagePullPolicy": "Never"}],
    }
    if claim:
        spec["resourceClaims"] = [{"name": "nic", "resourceClaimTemplateName": TEMPLATE}]
        spec["containers"][0]["resources"] = {"claims": [{"name": "nic"}]}
    meta = {"name": name, "namespace": NS, "labels": {LABEL: tag}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def is_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


class PodWatch:
    """One watch on the bench's pods for the whole run (re-established when it ends),
    recording the first time each pod name is seen with a node, Ready, and DELETED."""

    def __init__(self, api) -> None:
        self.api = api
        self.lock = threading.Lock()
        self.times: dict[str, PodTimes] = {}
        self.ips: dict[str, str] = {}
        self.changed = threading.Condition(self.lock)
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def track(self, name: str) -> PodTimes:
        with self.lock:
            return self.times.setdefault(name, PodTimes())

    def _run(self) -> None:
        from kubernetes import client, watch
        from kubernetes.client.exceptions import ApiException

        core = client.CoreV1Api(self.api)
        rv = None
        while not self.stopped:
            try:
                if rv is None:
                    rv = self._relist(core)
                w = watch.Watch()
                for ev in w.stream(
                    core.list_namespaced_pod,
                    NS,
                    label_selector=LABEL,
                    resource_version=rv,
                    timeout_seconds=300,
                ):
                    now = time.monotonic()
                    pod = ev["object"]
                    rv = pod.metadata.resource_version
                    self._record(ev["type"], pod, now)
                    if self.stopped:
                        w.stop()
            except ApiException as exc:
                if exc.status == 410:  # expired: list again (what changed meanwhile is recorded then)
                    rv = None
                else:
                    log(f"pod watch: {exc.status} {exc.reason}; watching again")
                time.sleep(0.1)
            except Exception as exc:  # noqa: BLE001 - a broken stream is watched again from where it was
                log(f"pod watch: {type(exc).__name__}: {exc}; watching again")
                time.sleep(0.1)

    def _relist(self, core) -> str:
        """List the pods and record what a lost watch would have said; the list's resourceVersion."""
        listed = core.list_namespaced_pod(NS, label_selector=LABEL)
        now = time.monotonic()
        names = set()
        for pod in listed.items:
            names.add(pod.metadata.name)
            self._record("MODIFIED", pod, now)
        with self.changed:
            for name, t in self.times.items():
                if name not in names and t.created is not None and t.gone is None and t.ready is not None:
                    t.gone = now
            self.changed.notify_all()
        return listed.metadata.resource_version

    def _record(self, kind: str, pod, now: float) -> None:
        name = pod.metadata.name
        with self.changed:
            t = self.times.setdefault(name, PodTimes())
            if kind == "DELETED":
                t.gone = t.gone or now
            else:
                if pod.spec.node_name and t.scheduled is None:
                    t.scheduled = now
                if is_ready(pod) and t.ready is None:
                    t.ready = now
                    self.ips[name] = pod.status.pod_ip or ""
            self.changed.notify_all()

    def wait(self, names: list[str], attr: str, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        with self.changed:
            while True:
                missing = [n for n in names if getattr(self.times.get(n, PodTimes()), attr) is None]
                if not missing:
                    return
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(missing)} of {len(names)} pods not {attr} in {timeout_s:.0f}s")
                self.changed.wait(min(left, 1.0))


# -- metrics -----------------------------------------------------------------------------------


def kubelet_metrics(api, node: str) -> str:
    """The kubelet's /metrics through the API server's node proxy (admin credentials)."""
    from kubernetes import client

    return client.CoreV1Api(api).connect_get_node_proxy_with_path(node, "metrics", _request_timeout=30)


def agent_metrics(cluster, node: str) -> str:
    try:
        return node_http(cluster, node, AGENT_METRICS_URL, timeout_s=30)
    except subprocess.CalledProcessError:
        return ""


def scrape(api, cluster, node: str, dump: str | None = None) -> dict[str, Histogram]:
    """The histograms of :data:`KUBELET_HISTOGRAMS` and :data:`AGENT_HISTOGRAMS` now
    (``dump``: a directory where the raw texts are written too)."""
    kubelet_text, agent_text = kubelet_metrics(api, node), agent_metrics(cluster, node)
    if dump:
        Path(dump).mkdir(parents=True, exist_ok=True)
        (Path(dump) / "kubelet.metrics").write_text(kubelet_text)
        (Path(dump) / "agent.metrics").write_text(agent_text)
    kubelet, agent = parse_metrics(kubelet_text), parse_metrics(agent_text)
    out = {key: histogram(kubelet, name, **labels) for key, name, labels in KUBELET_HISTOGRAMS}
    out.update({key: histogram(agent, name) for key, name in AGENT_HISTOGRAMS})
    return out


def deltas(
    after: dict[str, Histogram], before: dict[str, Histogram], keys: list[str]
) -> dict[str, Histogram]:
    return {k: after[k].minus(before[k]) for k in keys if after[k].count - before[k].count > 0}


# -- a round ---------------------------------------------------------------------------------


class Bench:
    def __init__(self, cluster, api, args) -> None:
        from kubernetes import client

        self.cluster, self.api, self.args = cluster, api, args
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.node_name = cluster.NODE
        self.node = cluster.node(self.node_name)
        self.watch = PodWatch(cluster.api_client())
        self.pool = ThreadPoolExecutor(max_workers=args.parallel)
        held = self.node.books()
        self.baseline = (len(held["attachments"]), len(held["preparedClaims"]))
        """What the node held before the bench (pods of others): what :meth:`settle` waits for."""

    def claims(self) -> list[str]:
        """The bench's pods' generated claims that still exist."""
        return [
            c.metadata.name
            for c in self.resource.list_namespaced_resource_claim(NS).items
            if any(o.kind == "Pod" and o.name.startswith("bench-") for o in c.metadata.owner_references or [])
        ]

    def create(self, name: str, body: dict[str, Any], t: PodTimes) -> None:
        t.created = time.monotonic()
        self.core.create_namespaced_pod(NS, body)

    def delete(self, name: str, t: PodTimes) -> None:
        t.delete_sent = time.monotonic()
        self.core.delete_namespaced_pod(name, NS, grace_period_seconds=1)

    def switch(self, variant: str, tag: str) -> None:
        """The variant's network as the node's first, checked with a probe pod's address."""
        want = "reference" if variant.startswith("reference") else "cni-dra"
        use_reference(self.node, want == "reference")
        ref = ipaddress.ip_network(REF_SUBNET)
        end = time.monotonic() + 60
        attempt = 0
        while True:
            attempt += 1
            name = f"bench-probe-{tag}-{attempt}"
            t = self.watch.track(name)
            self.create(name, pod_body(self.cluster, name, self.node_name, claim=CLAIMS[variant], tag=tag), t)
            self.watch.wait([name], "ready", 120)
            ip = self.watch.ips.get(name, "")
            self.delete(name, t)
            self.watch.wait([name], "gone", 120)
            if bool(ip) and (ipaddress.ip_address(ip) in ref) == (want == "reference"):
                break
            if time.monotonic() > end:
                raise RuntimeError(f"the node still gives {ip} after 60 s, not the {want} network")
            time.sleep(1)

    def settle(self) -> None:
        """Until the node's books hold no more than before the bench and the bench's claims are gone."""
        end = time.monotonic() + 120
        while time.monotonic() < end:
            held = self.node.books()
            attachments, prepared = len(held["attachments"]), len(held["preparedClaims"])
            if attachments <= self.baseline[0] and prepared <= self.baseline[1] and not self.claims():
                return
            time.sleep(0.5)
        raise RuntimeError("the node's books or the bench's claims did not empty in 120 s")

    def round(self, variant: str, index: int) -> Round:
        args = self.args
        tag = f"{variant.replace('+', '-')}-{index}"
        self.switch(variant, tag)
        self.settle()
        time.sleep(args.pause)
        names = [f"bench-{tag}-{i:03d}" for i in range(args.pods)]
        times = {n: self.watch.track(n) for n in names}
        bodies = {n: pod_body(self.cluster, n, self.node_name, claim=CLAIMS[variant], tag=tag) for n in names}
        before = scrape(self.api, self.cluster, self.node_name)
        crio_log = self.node.logfile("crio")
        crio_from = crio_log.stat().st_size if self.cluster.RUNTIME == "cri-o" else 0
        load0 = os.getloadavg()[0]
        for f in [self.pool.submit(self.create, n, bodies[n], times[n]) for n in names]:
            f.result()
        self.watch.wait(names, "ready", args.timeout)
        up = scrape(self.api, self.cluster, self.node_name)
        if self.cluster.RUNTIME == "cri-o":  # containerd logs no CNI call at its default level
            with crio_log.open("rb") as f:  # what it logged since the burst began
                f.seek(crio_from)
                text = f.read().decode(errors="replace")
            for name, (add_s, check_s) in crio_cni_calls(text, names).items():
                times[name].cni_add_s, times[name].cni_check_s = add_s, check_s
        for f in [self.pool.submit(self.delete, n, times[n]) for n in names]:
            f.result()
        self.watch.wait(names, "gone", args.timeout)
        claims_gone = None
        if CLAIMS[variant]:
            first_delete = min(t.delete_sent for t in times.values() if t.delete_sent is not None)
            end = time.monotonic() + args.timeout
            while self.claims():
                if time.monotonic() > end:
                    raise TimeoutError("the round's claims were not deleted")
                time.sleep(0.1)
            claims_gone = time.monotonic() - first_delete
        self.settle()
        down = scrape(self.api, self.cluster, self.node_name, self.args.dump_metrics)
        keys_up = [
            "run_podsandbox",
            "create_container",
            "start_container",
            "pod_start_sli",
            "dra_prepare",
            "dra_grpc_prepare",
            "agent_prepare",
        ]
        keys_down = ["stop_podsandbox", "dra_unprepare", "dra_grpc_unprepare", "agent_unprepare"]
        r = Round(variant, index, pods=times, claims_gone_s=claims_gone, load=(load0, os.getloadavg()[0]))
        r.histograms = {**deltas(up, before, keys_up), **deltas(down, up, keys_down)}
        log(
            f"{variant} round {index}: all Ready {r.all_ready_s:.2f}s, all gone {r.all_gone_s:.2f}s, "
            f"load {load0:.1f}→{r.load[1]:.1f}"
        )
        return r

    def cleanup(self) -> None:
        from kubernetes.client.exceptions import ApiException

        use_reference(self.node, False)
        for p in self.core.list_namespaced_pod(NS, label_selector=LABEL).items:
            try:
                self.core.delete_namespaced_pod(p.metadata.name, NS, grace_period_seconds=1)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        end = time.monotonic() + 120
        while self.core.list_namespaced_pod(NS, label_selector=LABEL).items and time.monotonic() < end:
            time.sleep(0.5)
        try:
            self.resource.delete_namespaced_resource_claim_template(TEMPLATE, NS)
        except ApiException as exc:
            if exc.status != 404:
                raise
        self.pool.shutdown()
        self.watch.stopped = True


def keep_logs(cluster, dest: Path) -> None:
    """The bed's component logs and each node's agent log, copied to ``dest``."""
    try:
        shutil.copytree(cluster.p("logs"), dest, dirs_exist_ok=True)
        for n in cluster.NODES:
            (dest / n.name).mkdir(parents=True, exist_ok=True)
            (dest / n.name / "agent.log").write_text(cluster.agent_log(n))
        log(f"logs: {dest}")
    except OSError as exc:
        log(f"logs not kept: {exc}")


def round_json(r: Round) -> dict[str, Any]:
    t0 = min((t.created for t in r.pods.values() if t.created is not None), default=0.0)

    def rel(x: float | None) -> float | None:
        return None if x is None else round(x - t0, 4)

    return {
        "variant": r.variant,
        "round": r.index,
        "load": r.load,
        "all_ready_s": r.all_ready_s,
        "all_gone_s": r.all_gone_s,
        "claims_gone_s": r.claims_gone_s,
        "histograms": {
            k: {"count": h.count, "sum": h.sum, "buckets": h.buckets} for k, h in r.histograms.items()
        },
        "pods": {
            n: {
                **{k: rel(getattr(t, k)) for k in ("created", "scheduled", "ready", "delete_sent", "gone")},
                "cni_add_s": t.cni_add_s,
                "cni_check_s": t.cni_check_s,
            }
            for n, t in sorted(r.pods.items())
        },
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=int(os.environ.get("CNI_DRA_BENCH_PODS", "50")))
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every variant (default 2)")
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}"
    )
    ap.add_argument("--bandwidth", default="100M", help="each claim's request (default 100M)")
    ap.add_argument(
        "--parallel", type=int, default=10, help="API requests in flight when creating or deleting"
    )
    ap.add_argument("--pause", type=float, default=3.0, help="seconds of quiet before each burst")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for a burst to be Ready or gone")
    ap.add_argument("--out", default=str(REPO / "bench/cluster-results.json"))
    ap.add_argument(
        "--helm-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="helm upgrade the chart with this value first (repeatable; e.g. logLevel=debug); "
        "a bed that was up gets the bed's values back at the end",
    )
    ap.add_argument("--logs", metavar="DIR", help="copy the bed's component logs there at the end")
    ap.add_argument("--dump-metrics", metavar="DIR", help="write the last raw /metrics texts there")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if unknown := set(variants) - set(VARIANTS):
        ap.error(f"unknown variant(s): {', '.join(sorted(unknown))}")
    if os.geteuid() != 0:
        ap.error("needs root (the cluster bed)")

    cluster = load_cluster_module()
    own_bed = not cluster.status_line().startswith("up")
    t_start = time.time()
    if own_bed:
        log("bringing the bed up (scripts/e2e/cluster.py up); it goes down at the end")
        cluster.up()
    rounds: list[Round] = []
    bench = None
    try:
        api = cluster.api_client()
        versions = json.loads((cluster.DIR / "versions.json").read_text())
        if args.helm_set:
            log(f"helm upgrade with --set {' --set '.join(args.helm_set)}")
            cluster.helm_upgrade(api, *[x for kv in args.helm_set for x in ("--set", kv)])
        bench = Bench(cluster, api, args)
        bench.watch.start()
        make_template(api, TEMPLATE, args.bandwidth)
        for i in range(args.rounds):
            for v in variants if i % 2 == 0 else list(reversed(variants)):
                rounds.append(bench.round(v, i))
    finally:
        if bench is not None:
            try:
                bench.cleanup()
            except Exception as exc:  # noqa: BLE001 - the bed's removal below cleans up anyway
                log(f"cleanup: {type(exc).__name__}: {exc}")
        if args.logs:
            keep_logs(cluster, Path(args.logs))
        if args.helm_set and not own_bed:
            log("helm upgrade back to the bed's values")
            cluster.helm_upgrade(cluster.api_client())
        if own_bed:
            cluster.down(quiet=True)
    summary = summarize(rounds)
    table = render_table(summary, [("cni-dra", "reference"), ("cni-dra", "reference+claim")])
    print(table)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t_start)),
        "machine": {"cpus": os.cpu_count(), "kernel": os.uname().release, "load_end": os.getloadavg()},
        "versions": versions,
        "runtime": cluster.RUNTIME,
        "node": cluster.NODE,
        "args": vars(args),
        "summary": summary,
        "table": table,
        "rounds": [round_json(r) for r in rounds],
    }
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    log(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
