"""What the differential test (netns_tests/e2e/test_differential.py) adds to the e2e bed,
and its random inputs. Loaded with the bed's own module (scripts/e2e/cluster.py), whose
processes, paths and credentials it reuses; it never changes what the bed started.

* :class:`GateOnControlPlane`: a second kube-apiserver (on the bed's etcd, port
  ``APISERVER_PORT + 1``) and a second kube-scheduler (its own ``schedulerName``,
  :data:`SCHEDULER_ON`, talking to that API server), both with
  ``--min-compatibility-version=1.37``: the way a 1.37 control plane gets the beta
  ``DRAFractionalCapacityRange`` gate on by default. The bed's API server and scheduler
  keep 1.37's default (off). A pod picks its scheduler by ``spec.schedulerName``; objects
  of a gate-on batch are written through the gate-on API server, which validates a
  requestPolicy in its own arithmetic (it drops nothing either way).
* Nodes without a kubelet (:func:`fake_node`, one per batch), tainted so that no other
  pod lands there, whose ResourceSlices the test publishes itself (driver :data:`DRIVER`,
  DeviceClass :data:`CLASS`): the scheduler allocates claims for pods bound to them,
  which never run.
* the generators of slices and claims (every choice from one ``random.Random``, so a
  seed replays a batch) and the two outcomes compared: the scheduler's (the claim's
  ``status.allocation``, or the pod's ``PodScheduled`` condition) and ``cni-dra
  allocate``'s, run as a user runs it.
"""

from __future__ import annotations

import functools
import json
import random
import re
import subprocess
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

DRIVER = "diff.cni-dra.dev"
CLASS = "cni-dra-diff"
NAMESPACE = "cni-dra-diff"
SCHEDULER_ON = "cni-dra-fractional"
GATE = "DRAFractionalCapacityRange"
MIN_COMPAT = "--min-compatibility-version=1.37"
SCHEDULER_ON_PORT = 10369
TAINT = {"key": "cni-dra.dev/differential", "value": "true", "effect": "NoSchedule"}


# -- the gate-on control plane -----------------------------------------------------------------------


def _kubeconfig_on(cluster: ModuleType, src: Path, dst: Path, port: int) -> Path:
    cfg = json.loads(src.read_text())
    for c in cfg["clusters"]:
        c["cluster"]["server"] = f"https://{cluster.HOST_IP}:{port}"
    dst.write_text(json.dumps(cfg))
    dst.chmod(0o600)
    return dst


class GateOnControlPlane:
    """A kube-apiserver and a kube-scheduler with the gate on beside the bed's (see the module
    docstring). ``admin_kubeconfig`` reaches the gate-on API server; both processes are
    stopped on exit (their logs stay in the bed's ``logs/``)."""

    APISERVER = "kube-apiserver-gate-on"
    SCHEDULER = "kube-scheduler-gate-on"

    def __init__(self, cluster: ModuleType) -> None:
        self.cluster = cluster
        self.port = cluster.APISERVER_PORT + 1
        self.dir = cluster.p("differential")
        self.admin_kubeconfig = self.dir / "admin-gate-on.kubeconfig"

    def __enter__(self) -> GateOnControlPlane:
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        c = self.cluster
        self.dir.mkdir(parents=True, exist_ok=True)
        saved = json.loads(c.p("pids", "kube-apiserver.cmd").read_text())
        args = [
            a.replace(f"--secure-port={c.APISERVER_PORT}", f"--secure-port={self.port}")
            for a in saved["args"]
        ]
        # on the bed's address (where its certificate is valid), beside the bed's API server;
        # it leaves the kubernetes Service's endpoints to that one (both advertise one address)
        c.start(self.APISERVER, [*args, MIN_COMPAT, "--endpoint-reconciler-type=none"], saved["env"])
        _kubeconfig_on(c, c.admin_kubeconfig(), self.admin_kubeconfig, self.port)
        kc = _kubeconfig_on(
            c, c.p("pki", "scheduler.kubeconfig"), self.dir / "scheduler-gate-on.kubeconfig", self.port
        )
        c.wait(
            lambda: self.api_get("/readyz") == "ok", "gate-on kube-apiserver ready", 90, proc=self.APISERVER
        )
        config = self.dir / "scheduler-gate-on.json"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(kc)},
                    "leaderElection": {"leaderElect": False},
                    "profiles": [{"schedulerName": SCHEDULER_ON}],
                }
            )
        )
        kube_bin = Path(json.loads(c.p("pids", "kube-scheduler.cmd").read_text())["args"][0]).parent
        c.start(
            self.SCHEDULER,
            [
                str(kube_bin / "kube-scheduler"),
                f"--config={config}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={SCHEDULER_ON_PORT}",
                MIN_COMPAT,
                c.FEATURE_GATES,
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                "--v=2",
            ],
        )
        c.wait(
            lambda: _https(f"https://127.0.0.1:{SCHEDULER_ON_PORT}/healthz") == "ok",
            "gate-on kube-scheduler healthy",
            60,
            proc=self.SCHEDULER,
        )

    def api_get(self, path: str) -> str:
        pki = self.cluster.p("pki")
        return _https(
            f"https://{self.cluster.HOST_IP}:{self.port}{path}",
            cert=(pki / "admin.crt", pki / "admin.key"),
            ca=pki / "ca.crt",
        )

    def __exit__(self, *exc: object) -> None:
        for name in (self.SCHEDULER, self.APISERVER):
            self.cluster.stop(name, timeout_s=10)


def _https(url: str, *, cert: tuple[Path, Path] | None = None, ca: Path | None = None) -> str:
    """GET ``url``: the body on 200, else ``HTTP <status>``. Without ``ca`` the server's
    certificate is not checked (a scheduler's self-signed one, on 127.0.0.1)."""
    import warnings

    import urllib3

    kw: dict[str, Any] = (
        {"cert_reqs": "CERT_REQUIRED", "ca_certs": str(ca)} if ca else {"cert_reqs": "CERT_NONE"}
    )
    if cert:
        kw.update(cert_file=str(cert[0]), key_file=str(cert[1]))
    with warnings.catch_warnings(), urllib3.PoolManager(**kw) as pool:
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        resp = pool.request("GET", url, timeout=10, retries=False)
        return resp.data.decode(errors="replace") if resp.status == 200 else f"HTTP {resp.status}"


def gate_in(metrics_text: str) -> bool | None:
    """The ``kubernetes_feature_enabled`` sample of the gate in a component's /metrics text."""
    m = re.search(r'^kubernetes_feature_enabled\{[^}]*name="' + GATE + r'"[^}]*\} (\S+)$', metrics_text, re.M)
    return None if m is None else float(m[1]) == 1.0


def component_gates(cluster: ModuleType, on: GateOnControlPlane) -> dict[str, bool | None]:
    """The gate as each control-plane component of both runs reports it (its own /metrics)."""
    pki = cluster.p("pki")
    admin = (pki / "admin.crt", pki / "admin.key")
    q = "/metrics?name[]=kubernetes_feature_enabled"
    return {
        "kube-apiserver": gate_in(_https(f"{cluster.APISERVER_URL}{q}", cert=admin, ca=pki / "ca.crt")),
        "kube-scheduler": gate_in(_https(f"https://127.0.0.1:10359{q}", cert=admin)),
        on.APISERVER: gate_in(on.api_get(q)),
        on.SCHEDULER: gate_in(_https(f"https://127.0.0.1:{SCHEDULER_ON_PORT}{q}")),
    }


# -- the kubelet-less node -------------------------------------------------------------------------


def fake_node(name: str) -> dict[str, Any]:
    """A Node without a kubelet, its status as a kubelet would register it; one per batch,
    so that a batch's pods can only land where its own slice is."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, TAINT["key"]: "true"}},
        "spec": {"taints": [TAINT]},
        "status": {
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "1000"},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "1000"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "no kubelet: the differential test's node",
                }
            ],
        },
    }


def class_and_namespace() -> list[dict[str, Any]]:
    """The DeviceClass of :data:`DRIVER`'s devices and the test's namespace."""
    klass = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    return [klass, ns]


def pod_for(name: str, claim: str, scheduler: str, *, image: str, node: str) -> dict[str, Any]:
    """A pod naming ``claim``, for Node ``node`` (by name; every taint tolerated), scheduled
    by ``scheduler``."""
    on_node = {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "schedulerName": scheduler,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": on_node}},
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "nic", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "app",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "resources": {"claims": [{"name": "nic"}]},
                }
            ],
        },
    }


# -- random slices and claims ------------------------------------------------------------------------


def q(milli: int) -> str:
    """A quantity string for ``milli`` milli-units (whole numbers without the suffix)."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


G = 10**12  # 1G in milli-units


def _range_policy(
    rng: random.Random, value: int, mins: list[int], steps: list[int | None], loose_default: bool
) -> dict[str, Any]:
    mn = rng.choice([m for m in mins if m < value])
    step = rng.choice([s for s in steps if s is None or mn + s <= value])
    r: dict[str, Any] = {"min": q(mn)}
    top = value
    if step is not None:
        r["step"] = q(step)
        if rng.random() < 0.5:
            top = mn + rng.randint(0, (value - mn) // step) * step
            r["max"] = q(top)
    elif rng.random() < 0.4:
        top = rng.randint(mn, value)
        r["max"] = q(top)
    default = (
        mn if step is None or rng.random() < 0.7 else mn + rng.randint(0, min(3, (top - mn) // step)) * step
    )
    if loose_default and step is not None:  # off the exact grid: a gate-off API server may take it
        default = min(top, default + rng.randint(0, step))
    return {"default": q(default), "validRange": r}


def _values_policy(rng: random.Random, value: int, pool: list[int]) -> dict[str, Any]:
    values = sorted(rng.sample([v for v in pool if v <= value], k=min(len(pool), rng.randint(2, 4))))
    return {"default": q(rng.choice(values)), "validValues": [q(v) for v in values]}


def _capacity(rng: random.Random, kind: str, shared: bool, gate_on: bool) -> dict[str, Any]:
    if kind == "bandwidth":
        value = rng.choice([10, 25, 40, 100]) * G
        pick = rng.random()
        policy = (
            None
            if not shared or pick < 0.12
            else (
                _range_policy(
                    rng, value, [G // 10, G // 4, G // 2, G], [None, G // 10, G // 4, G // 2, G], False
                )
                if pick < 0.7
                else _values_policy(rng, value, [G // 2, G, 2 * G, 5 * G // 2, 5 * G, 10 * G])
            )
        )
    else:  # "slots": small numbers, the fractional policies
        value = rng.choice([2000, 4000, 7500, 8000, 16000])
        pick = rng.random()
        policy = (
            None
            if not shared or pick < 0.15
            else (
                _range_policy(
                    rng,
                    value,
                    [0, 100, 250, 500, 1000, 1500],
                    [None, 100, 250, 500, 750, 1000, 1500, 2500],
                    not gate_on and rng.random() < 0.3,
                )
                if pick < 0.75
                else _values_policy(rng, value, [250, 500, 750, 1000, 1500, 2000, 2500, 4000])
            )
        )
    out: dict[str, Any] = {"value": q(value)}
    if policy is not None:
        out["requestPolicy"] = policy
    return out


def gen_slice(rng: random.Random, name: str, gate_on: bool, node: str) -> dict[str, Any]:
    """A ResourceSlice of Node ``node`` (pool ``name``): 2 to 4 NICs (mostly shared), each with a
    ``bandwidth`` (G-scale, whole policies) and most with ``slots`` (small numbers,
    fractional policies), attributes ``index`` (unique), ``zone`` and ``speed``; devices in
    name order, as cni-dra tries them and the scheduler walks them."""
    devices = []
    for i in range(rng.randint(2, 4)):
        shared = rng.random() < 0.85
        caps = {"bandwidth": _capacity(rng, "bandwidth", shared, gate_on)}
        if rng.random() < 0.75:
            caps["slots"] = _capacity(rng, "slots", shared, gate_on)
        speed = int(caps["bandwidth"]["value"]) // 10**9  # G
        dev: dict[str, Any] = {
            "name": f"nic-{i}",
            "capacity": caps,
            "attributes": {
                "index": {"int": i},
                "zone": {"string": rng.choice("ab")},
                "speed": {"int": speed},
            },
        }
        if shared:
            dev["allowMultipleAllocations"] = True
        devices.append(dev)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _milli(text: str) -> int:
    return int(Decimal(text.rstrip("m")) * (1 if text.endswith("m") else 1000))


def _amount(rng: random.Random, devices: list[dict[str, Any]], cap: str, gate_on: bool) -> str:
    """A request for ``cap``: on a device's grid, between grid points, below its min, above its
    max, between and beyond its validValues; now and then finer than a milli-unit."""
    caps = [d["capacity"][cap] for d in devices if cap in d["capacity"]] or [{"value": "1"}]
    c = rng.choice(caps)
    value, pol = _milli(c["value"]), c.get("requestPolicy") or {}
    if "validRange" in pol:
        r = pol["validRange"]
        mn, step = _milli(r["min"]), _milli(r.get("step", "0")) or max(1, value // 7)
        mx = _milli(r["max"]) if "max" in r else value
        k = rng.randint(0, max(0, min(6, (mx - mn) // step)))
        milli = rng.choice(
            [mn + k * step, mn + k * step, mn + k * step + rng.randint(1, step), mn // 2, mx, mx + 1]
        )
    elif "validValues" in pol:
        vals = [_milli(v) for v in pol["validValues"]]
        i = rng.randrange(len(vals))
        milli = rng.choice([vals[i], vals[i] - 1, vals[i] + 1, vals[-1] + 1])
    else:
        milli = rng.choice([value, value + 1, rng.randint(1, value // 4), rng.randint(1, value // 4)])
    milli = max(0, milli)
    if rng.random() < (0.12 if gate_on else 0.06):
        return f"{milli * 10**6 + 500}n"  # finer than 1m: rounded up with the gate off, refused with it on
    return q(milli)


SELECTORS = [
    f'device.attributes["{DRIVER}"].zone == "a"',
    f'device.attributes["{DRIVER}"].speed >= 25',
    f'device.capacity["{DRIVER}"].bandwidth.compareTo(quantity("25G")) >= 0',
    f'device.attributes["{DRIVER}"].index != 0',
    "device.allowMultipleAllocations == true",
]


def _exact(rng: random.Random, devices: list[dict[str, Any]], gate_on: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"deviceClassName": CLASS}
    mode = rng.random()
    if mode < 0.08:
        spec["allocationMode"] = "All"
    elif mode < 0.23:
        spec["count"] = rng.choice([2, 2, 3])
    caps = {}
    for cap, named in (("bandwidth", 0.75), ("slots", 0.5)):
        if rng.random() < named:
            caps[f"{DRIVER}/{cap}" if rng.random() < 0.05 else cap] = _amount(rng, devices, cap, gate_on)
    if caps:
        spec["capacity"] = {"requests": caps}
    if rng.random() < 0.25:
        spec["selectors"] = [{"cel": {"expression": rng.choice(SELECTORS)}}]
    return spec


def gen_claim(rng: random.Random, slice_: dict[str, Any], name: str, gate_on: bool) -> dict[str, Any]:
    """A ResourceClaim of 1 to 3 requests (``exactly`` or ``firstAvailable`` of two), counts,
    ``allocationMode: All``, capacity requests (now and then under the qualified name),
    CEL selectors and, with several requests, a constraint."""
    devices = slice_["spec"]["devices"]
    reqs: list[dict[str, Any]] = []
    for r in range(rng.choices([1, 2, 3], [65, 28, 7])[0]):
        if rng.random() < 0.15:
            reqs.append(
                {
                    "name": f"r{r}",
                    "firstAvailable": [{"name": f"s{j}", **_exact(rng, devices, gate_on)} for j in range(2)],
                }
            )
        else:
            reqs.append({"name": f"r{r}", "exactly": _exact(rng, devices, gate_on)})
    spec: dict[str, Any] = {"requests": reqs}
    if len(reqs) > 1 and rng.random() < 0.3:
        spec["constraints"] = [
            rng.choice([{"matchAttribute": f"{DRIVER}/zone"}, {"distinctAttribute": f"{DRIVER}/index"}])
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": spec},
    }


# -- the two outcomes ------------------------------------------------------------------------------


class InputRefused(AssertionError):
    """``cni-dra allocate`` refused its input (exit 2): the slice or a claim."""


@functools.cache
def knows_the_gate(exe: str) -> bool:
    """Whether ``exe``'s ``allocate`` takes ``--fractional-capacity-range`` (a cni-dra from
    before it, run through ``CNI_DRA_DIFF_EXE`` to see what it got wrong, rounds one way)."""
    res = subprocess.run([exe, "allocate", "--help"], capture_output=True, text=True, timeout=60)
    return "--fractional-capacity-range" in res.stdout


def predict(
    exe: str,
    workdir: Path,
    slice_: dict[str, Any],
    claims: list[dict[str, Any]],
    *,
    gate_on: bool | None,
    consumed: dict[str, dict[str, str]] | None = None,
    state_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """``cni-dra allocate`` as a user runs it: the slice, the claims in order, the node's
    usage (``--consumed`` or ``--state-dir``), ``--fractional-capacity-range on|off`` (or
    ``auto`` when ``gate_on`` is None). Returns its JSON entries (exit 0 when every claim
    fits, else 1); raises :class:`InputRefused` on exit 2."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "slice.json").write_text(json.dumps(slice_))
    args = [exe, "allocate", "--inventory", str(workdir / "slice.json")]
    for i, claim in enumerate(claims):
        (workdir / f"claim-{i}.json").write_text(json.dumps(claim))
        args += ["--claim", str(workdir / f"claim-{i}.json")]
    if consumed is not None:
        (workdir / "consumed.json").write_text(json.dumps(consumed))
        args += ["--consumed", str(workdir / "consumed.json")]
    if state_dir is not None:
        args += ["--state-dir", str(state_dir)]
    if knows_the_gate(exe):
        args += ["--fractional-capacity-range", "auto" if gate_on is None else "on" if gate_on else "off"]
    res = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if res.returncode == 2:
        raise InputRefused(res.stderr.strip())
    if res.returncode != (0 if all("allocation" in e for e in json.loads(res.stdout or "[]")) else 1):
        raise AssertionError(f"{' '.join(args)}: exit {res.returncode}: {res.stderr}")
    return list(json.loads(res.stdout))


def _nanos(text: str) -> int:
    from cni_dra.quantity import Quantity

    return Quantity.parse(text).nanos


def results_key(results: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Allocation results without shareIDs, consumed amounts as exact values, in result order."""
    return [
        (
            r["request"],
            r["pool"],
            r["device"],
            None
            if r.get("consumedCapacity") is None
            else tuple(sorted((k, _nanos(v)) for k, v in r["consumedCapacity"].items())),
        )
        for r in results
    ]


def consumed_after(
    slice_: dict[str, Any], allocations: list[list[dict[str, Any]]]
) -> dict[str, dict[str, str]]:
    """``--consumed`` for what ``allocations`` (each a claim's results) hold: shared results
    summed per capacity; a dedicated device held whole (every capacity's value)."""
    from cni_dra.quantity import Quantity

    values = {d["name"]: {k: c["value"] for k, c in d["capacity"].items()} for d in slice_["spec"]["devices"]}
    out: dict[str, dict[str, Quantity]] = {}
    for results in allocations:
        for r in results:
            slot = out.setdefault(r["device"], {})
            held = r.get("consumedCapacity") if r.get("shareID") else values[r["device"]]
            for k, v in (held or {}).items():
                slot[k] = slot.get(k, Quantity.ZERO) + Quantity.parse(v)
    return {dev: {k: str(v) for k, v in caps.items()} for dev, caps in out.items()}


def wait_until(cond: Callable[[], Any], what: str, timeout_s: float) -> Any:
    """Poll ``cond`` every 0.2 s until it is true; AssertionError naming ``what`` after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what}: not reached in {timeout_s:.0f}s")


def wait_scheduled(read_pod: Callable[[], dict[str, Any] | None], timeout_s: float = 30.0) -> dict[str, Any]:
    """The pod's ``PodScheduled`` condition once the scheduler has decided: True, or False
    for a claim it cannot allocate (``cannot allocate all claims``) or an allocation error
    (reason ``SchedulerError``). Other False conditions (say, a claim its informer has not
    seen yet) are waited out."""
    end = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while time.monotonic() < end:
        pod = read_pod() or {}
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled":
                last = cond
        if (
            last.get("status") == "True"
            or last.get("reason") == "SchedulerError"
            or "cannot allocate all claims" in (last.get("message") or "")
        ):
            return last
        time.sleep(0.05)
    raise AssertionError(f"no scheduling decision in {timeout_s:.0f}s (last condition: {last})")
