#!/opt/cni-dra/venv/bin/python
"""A two-node Kubernetes cluster on this machine, as plain processes, with cni-dra as its
pod network and DRA driver.

usage: cluster.py up | down | status | versions
       cluster.py exec NODE [--] CMD...          run CMD inside NODE's namespaces
       cluster.py load-image ARCHIVE             an OCI archive into every node's runtime
       cluster.py image [VERSION]                build (cached) and print cni-dra's image archive
       cluster.py helm ARGS...                   the bed's helm, with the admin kubeconfig

``up`` starts etcd, kube-apiserver (on the host's bridge address, 10.250.0.1),
kube-controller-manager and kube-scheduler in the host's namespaces, then the nodes
``cni-dra-e2e`` and ``cni-dra-e2e-2`` (scripts/e2e/cluster_node.py): each its own network,
mount, UTS and PID namespaces, its own stand-in NICs (two veth pairs: one of MTU 1500, one
jumbo), its own runtime (containerd, or CRI-O with
``CNI_DRA_E2E_RUNTIME=cri-o``) and kubelet, all with their default paths inside the
node. Then cni-dra is installed as operators install it: ``make image``'s archive (built
once per content of the tree, cached) imported into each node's containerd, and the Helm
chart deploy/helm/cni-dra installed by the real Helm (scripts/e2e/build-helm) with
scripts/e2e/helm-values.yaml: its RBAC, admission policy and DeviceClass unchanged, one
agent pod per node (the DaemonSet) with the pod's own token. It waits until both Nodes are
Ready, both agent pods Ready and both slices published, and prints the admin KUBECONFIG
path on stdout.
``down`` stops every process it started and kills what they left in the nodes'
namespaces and cgroups, removes the cgroups, the namespaces, the bridge and its veths,
and the directory. Both are idempotent; ``down`` also cleans up after a failed ``up``.
Everything lives under ``CNI_DRA_E2E_DIR`` (default /run/cni-dra-e2e); each component
logs to ``<dir>/logs/<name>.log`` (a node's: ``logs/<node>/<name>.log``); on a failure the
tails are printed to stderr.

Binaries: scripts/e2e/build-kube (Kubernetes), scripts/e2e/fetch-runtime (etcd,
containerd, runc, images) and scripts/e2e/build-helm are run first; each answers from its
cache in well under a second once built. cni-dra's image is ``make image`` run with this
Python's venv (the installed package), cached under ``CNI_DRA_E2E_CACHE``/cni-dra-image
by a hash of the tree's files (tests and docs aside) and the version.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the modules beside this script
import cluster_multus
from cluster_node import (  # noqa: F401
    APISERVER_PORT,
    BRIDGE,
    CNI_BIN,
    CONFLIST,
    DRIVER,
    HOST_IP,
    JUMBO_MTU,
    JUMBO_NIC,
    NETWORK,
    NICS,
    NODE_CNI_EXE,
    SERVICE_RANGE,
    Node,
    delete_bridge,
    make_bridge,
)
from cluster_pki import cert, kubeconfig, pki
from cluster_procs import (
    CGROUP_ROOT,
    DIR,
    ClusterError,
    cgroup_hierarchies,
    kill_in_namespaces,
    log,
    logfile,
    make_cgroup,
    p,
    remove_cgroups,
    run,
    running,
    start,
    stop,
    stop_all,
    unmount_under,
    wait,
)
from cluster_runtime import RUNTIMES, SANDBOX_IMAGE, TEST_IMAGE  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
KUBE_VERSION = os.environ.get("CNI_DRA_E2E_KUBE_VERSION", "v1.37.2")
NODES = (Node("cni-dra-e2e", 1, "10.244.77.0/24"), Node("cni-dra-e2e-2", 2, "10.244.78.0/24"))
NODE = NODES[0].name
RUNTIME = next(k for k, v in RUNTIMES.items() if isinstance(NODES[0].runtime, v))
"""The nodes' runtime, ``CNI_DRA_E2E_RUNTIME``: containerd (default) or cri-o."""
MULTUS = os.environ.get("CNI_DRA_E2E_MULTUS") == "1" or (
    "CNI_DRA_E2E_MULTUS" not in os.environ and (DIR / "multus").is_file()
)
"""Multus (thin plugin) as the last node's CNI (cluster_multus.py); the other keeps cni-dra's conflist."""
"""The node most scenarios use (kept as the one-node bed named it)."""
FEATURE_GATES = "--feature-gates=DRAConsumableCapacity=true"
"""The same gates for every control-plane component (on by default in 1.37; said anyway)."""
ETCD_PORT = 23790
APISERVER_URL = f"https://{HOST_IP}:{APISERVER_PORT}"
CONTROL_PLANE = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]
CACHE = Path(os.environ.get("CNI_DRA_E2E_CACHE", "/var/cache/cni-dra-e2e"))
CHART = REPO / "deploy/helm/cni-dra"
HELM_VALUES = REPO / "scripts/e2e/helm-values.yaml"
RELEASE, RELEASE_NS = "cni-dra", "kube-system"
AGENT_LABELS = "app.kubernetes.io/name=cni-dra"
IMAGE = "ghcr.io/cni-dra/cni-dra"


def node(name: str = NODE) -> Node:
    for n in NODES:
        if n.name == name:
            return n
    raise ClusterError(f"no node {name!r} (nodes: {', '.join(n.name for n in NODES)})")


def state_dir() -> Path:
    """The first node's cni-dra state directory (/var/lib/cni-dra in the node), as the host sees it."""
    return node().host_path("/var/lib/cni-dra")


def inventory_path() -> Path:
    """The first node's inventory (/etc/cni-dra/resourceslice.yaml in the node), as the host sees it."""
    return node().host_path("/etc/cni-dra/resourceslice.yaml")


CNI_EXE = os.environ.get("CNI_DRA_TEST_EXE", f"{CNI_BIN}/cni-dra")
"""The installed plugin and CLI on the host (the nodes run copies of it: NODE_CNI_EXE)."""


def conflist(name: str = NODE) -> dict:
    """The conflist the chart's init container installed on node ``name``."""
    return json.loads(node(name).host_path(CONFLIST).read_text())


def admin_kubeconfig() -> Path:
    return p("pki", "admin.kubeconfig")


def tails(lines: int = 25) -> str:
    out = []
    files = [logfile(n) for n in CONTROL_PLANE]
    files += [n.logfile(c) for n in NODES for c in (n.runtime.name, "kubelet")]
    files += [f for n in NODES for f in agent_logs(n)[-1:]]
    for f in files:
        if f.exists():
            text = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"----- {f} (last {len(text)} lines) -----\n" + "\n".join(text))
    return "\n".join(out)


# -- binaries ------------------------------------------------------------------------------


def binaries() -> dict[str, str]:
    """Paths of every binary; builds or fetches what is not cached yet."""
    res = subprocess.run(
        [str(REPO / "scripts/e2e/build-kube"), KUBE_VERSION], stdout=subprocess.PIPE, text=True
    )
    if res.returncode != 0:
        raise ClusterError(f"scripts/e2e/build-kube {KUBE_VERSION} failed (exit {res.returncode})")
    kube_bin = res.stdout.strip().splitlines()[-1]
    res = subprocess.run([str(REPO / "scripts/e2e/fetch-runtime")], stdout=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise ClusterError(f"scripts/e2e/fetch-runtime failed (exit {res.returncode})")
    rt = dict(line.split("=", 1) for line in res.stdout.strip().splitlines() if "=" in line)
    bins = {
        "kube": kube_bin,
        "etcd": rt["ETCD"],
        "containerd_bin": rt["CONTAINERD_BIN"],
        "runc": rt["RUNC"],
        "images": rt["IMAGES"],
        "helm": binaries_helm(),
    }
    if RUNTIME == "cri-o":
        bins["crio_bin"] = _built("build-crio")
    if MULTUS:
        bins["multus_bin"] = _built("build-multus")
    return bins


def _built(script: str) -> str:
    """The directory a scripts/e2e/build-* script prints last (it builds what is not cached)."""
    res = subprocess.run([str(REPO / "scripts/e2e" / script)], stdout=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise ClusterError(f"scripts/e2e/{script} failed (exit {res.returncode})")
    return res.stdout.strip().splitlines()[-1]


def package_version() -> str:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _tree_key(version: str) -> str:
    """What ``make image`` builds from: every file git knows or would add, tests and docs aside."""
    listed = run(
        "git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"
    ).stdout
    h = hashlib.sha256(version.encode())
    for name in sorted(set(listed.split("\0"))):
        if not name or name.startswith(("tests/", "netns_tests/", "docs/", "bench/")) or name.endswith(".md"):
            continue
        path = REPO / name
        if path.is_file() and not path.is_symlink():
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def image_archive(version: str | None = None) -> Path:
    """cni-dra's image ``IMAGE:version`` as ``make image`` builds it (VERSION=version: the
    tag and the version label), from this Python's venv; built once per content of the tree."""
    version = version or package_version()
    out = CACHE / "cni-dra-image" / f"{_tree_key(version)}"
    archive = out / f"cni-dra-{version}.oci.tar"
    if archive.exists():
        return archive
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.exists():
            return archive
        tmp = out.parent / f".build.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        t0 = time.monotonic()
        log(f"building cni-dra's image {IMAGE}:{version} (make image; cached afterwards)")
        res = subprocess.run(
            [
                "make",
                "-C",
                str(REPO),
                "--no-print-directory",
                "image",
                f"VENV={sys.prefix}",
                f"CNI_BIN={CNI_BIN}",
                f"IMAGE_DIR={tmp}",
                f"VERSION={version}",
                f"IMAGE_TAG={version}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if res.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ClusterError(
                f"make image VERSION={version} failed (exit {res.returncode}): {res.stdout[-2000:]}"
            )
        (built,) = tmp.glob("*.oci.tar")
        out.mkdir(exist_ok=True)
        built.rename(archive)
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"image {archive} built in {time.monotonic() - t0:.0f}s")
    return archive


def versions(bins: dict[str, str]) -> dict[str, str]:
    """One line per component, from the binaries themselves."""

    def first(*args: str) -> str:
        res = run(*args, check=False)
        return (
            (res.stdout or res.stderr).strip().splitlines()[0] if (res.stdout or res.stderr).strip() else "?"
        )

    out = {
        "kubernetes": first(f"{bins['kube']}/kube-apiserver", "--version"),
        "kubelet": first(f"{bins['kube']}/kubelet", "--version"),
        "etcd": first(bins["etcd"], "--version"),
        **{name: first(*args) for name, args in NODES[0].runtime.versions(bins).items()},
        "helm": first(bins["helm"], "version", "--short"),
        "cni-dra": first(
            sys.executable, "-c", "import importlib.metadata as m; print('cni-dra', m.version('cni-dra'))"
        ),
    }
    if MULTUS:
        out["multus"] = first(f"{bins['multus_bin']}/multus", "-version")
    return out


# -- certificates --------------------------------------------------------------------------


def make_pki() -> None:
    cert("ca", "/CN=cni-dra-e2e-ca", ca=True)
    cert(
        "apiserver",
        "/CN=kube-apiserver",
        server=True,
        sans=[
            "IP:127.0.0.1",
            f"IP:{HOST_IP}",
            "IP:10.96.0.1",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
        ],
    )
    cert("admin", "/O=system:masters/CN=cni-dra-e2e-admin")
    cert("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client")
    cert("scheduler", "/CN=system:kube-scheduler")
    cert("controller-manager", "/CN=system:kube-controller-manager")
    run("openssl", "genrsa", "-out", str(pki() / "sa.key"), "2048")
    run("openssl", "rsa", "-in", str(pki() / "sa.key"), "-pubout", "-out", str(pki() / "sa.pub"))
    kubeconfig(admin_kubeconfig(), APISERVER_URL, user="admin", cert_name="admin")
    kubeconfig(pki() / "scheduler.kubeconfig", APISERVER_URL, user="scheduler", cert_name="scheduler")
    kubeconfig(
        pki() / "controller-manager.kubeconfig",
        APISERVER_URL,
        user="controller-manager",
        cert_name="controller-manager",
    )
    for n in NODES:
        cert(f"kubelet-{n.name}", f"/O=system:nodes/CN=system:node:{n.name}")
        cert(f"kubelet-serving-{n.name}", f"/CN={n.name}", server=True, sans=[f"IP:{n.ip}", f"DNS:{n.name}"])
        conf = pki() / f"kubelet-{n.name}.kubeconfig"
        kubeconfig(conf, APISERVER_URL, user=f"system:node:{n.name}", cert_name=f"kubelet-{n.name}")
        n.write_kubelet_files(
            pki() / "ca.crt",
            conf.read_text(),
            (pki() / f"kubelet-serving-{n.name}.crt", pki() / f"kubelet-serving-{n.name}.key"),
        )


# -- control plane (host namespaces) -------------------------------------------------------


def start_etcd(bins: dict[str, str]) -> None:
    p("etcd").mkdir(parents=True, exist_ok=True)
    start(
        "etcd",
        [
            bins["etcd"],
            "--name",
            "e2e",
            "--data-dir",
            str(p("etcd")),
            "--listen-client-urls",
            f"http://127.0.0.1:{ETCD_PORT}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{ETCD_PORT}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{ETCD_PORT + 10}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{ETCD_PORT + 10}",
            "--initial-cluster",
            f"e2e=http://127.0.0.1:{ETCD_PORT + 10}",
            "--unsafe-no-fsync",
            "--log-level",
            "warn",
        ],
    )


def start_apiserver(bins: dict[str, str]) -> None:
    d = pki()
    start(
        "kube-apiserver",
        [
            f"{bins['kube']}/kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
            f"--bind-address={HOST_IP}",
            f"--secure-port={APISERVER_PORT}",
            f"--advertise-address={HOST_IP}",
            f"--tls-cert-file={d}/apiserver.crt",
            f"--tls-private-key-file={d}/apiserver.key",
            f"--client-ca-file={d}/ca.crt",
            f"--kubelet-client-certificate={d}/apiserver-kubelet-client.crt",
            f"--kubelet-client-key={d}/apiserver-kubelet-client.key",
            f"--kubelet-certificate-authority={d}/ca.crt",
            # the node names resolve nowhere (as kubeadm sets it: the address first)
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={d}/sa.pub",
            f"--service-account-signing-key-file={d}/sa.key",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--runtime-config=resource.k8s.io/v1=true",
            FEATURE_GATES,
            "--profiling=false",
            "--v=1",
        ],
    )


def _kubeconfig_flags(path: str) -> list[str]:
    """A controller's own, authentication and authorization kubeconfig: one file for all three."""
    return [
        f"--kubeconfig={path}",
        f"--authentication-kubeconfig={path}",
        f"--authorization-kubeconfig={path}",
    ]


def start_controller_manager(bins: dict[str, str]) -> None:
    d = pki()
    start(
        "kube-controller-manager",
        [
            f"{bins['kube']}/kube-controller-manager",
            *_kubeconfig_flags(f"{d}/controller-manager.kubeconfig"),
            "--bind-address=127.0.0.1",
            "--secure-port=10357",
            f"--service-account-private-key-file={d}/sa.key",
            f"--root-ca-file={d}/ca.crt",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            "--controllers=*,-nodeipam",
            FEATURE_GATES,
            "--v=1",
        ],
    )


def start_scheduler(bins: dict[str, str]) -> None:
    start(
        "kube-scheduler",
        [
            f"{bins['kube']}/kube-scheduler",
            *_kubeconfig_flags(f"{pki()}/scheduler.kubeconfig"),
            "--bind-address=127.0.0.1",
            "--secure-port=10359",
            "--leader-elect=false",
            FEATURE_GATES,
            "--v=2",
        ],
    )


# -- API objects ---------------------------------------------------------------------------


def api_client():
    from kubernetes import config

    return config.new_client_from_config(config_file=str(admin_kubeconfig()))


def apply_manifest(api, path: Path) -> list[dict]:
    """Server-side apply of every document of ``path`` (as ``kubectl apply --server-side``),
    field manager ``cni-dra-e2e``. Returns the objects as the server stored them."""
    import yaml
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(api)
    out = []
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        ns = (doc["metadata"].get("namespace") or "default") if res.namespaced else None
        obj = res.server_side_apply(body=doc, namespace=ns, field_manager="cni-dra-e2e", force_conflicts=True)
        out.append(obj.to_dict())
    return out


def node_ready(api, name: str = NODE) -> bool:
    from kubernetes import client

    n = client.CoreV1Api(api).read_node(name)
    return any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])


def multus_node() -> Node | None:
    """The node whose runtime calls Multus (``CNI_DRA_E2E_MULTUS=1``): the last one."""
    return NODES[-1] if MULTUS else None


def install_multus(api) -> None:
    """conf/k8s/multus/crd.yaml and rbac.yaml, applied unchanged, and Multus's kubeconfig on
    its node: a token of the multus service account bound to that Node."""
    from kubernetes import client

    n = multus_node()
    assert n is not None
    for manifest in cluster_multus.MANIFESTS:
        apply_manifest(api, REPO / "conf/k8s/multus" / manifest)
    uid = client.CoreV1Api(api).read_node(n.name).metadata.uid
    cluster_multus.write_kubeconfig(n, APISERVER_URL, agent_token(api, uid, n.name, account="multus"))


def agent_token(api, node_uid: str, node_name: str = NODE, account: str = "cni-dra") -> str:
    """A token of cni-dra's service account bound to Node ``node_name`` (TokenRequest): the
    API server puts the node's name in the token's user info, as in a DaemonSet pod's."""
    from kubernetes import client

    req = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=["https://kubernetes.default.svc.cluster.local"],
            expiration_seconds=24 * 3600,
            bound_object_ref=client.V1BoundObjectReference(
                kind="Node", api_version="v1", name=node_name, uid=node_uid
            ),
        )
    )
    return (
        client.CoreV1Api(api)
        .create_namespaced_service_account_token(account, "kube-system", req)
        .status.token
    )


def token_client(token: str, path: Path):
    """An API client authenticating with ``token`` (its kubeconfig written to ``path``)."""
    from kubernetes import config

    kubeconfig(path, APISERVER_URL, user="token", token=token)
    return config.new_client_from_config(config_file=str(path))


# -- cni-dra, installed by Helm ----------------------------------------------------------------


def helm(*args: str, check: bool = True, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """The bed's helm (scripts/e2e/build-helm) with the admin kubeconfig; its cache and
    config under the cluster's directory."""
    home = p("helm")
    env = {
        **os.environ,
        "KUBECONFIG": str(admin_kubeconfig()),
        **{f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")},
    }
    res = subprocess.run([binaries_helm(), *args], capture_output=True, text=True, env=env, timeout=timeout_s)
    if check and res.returncode != 0:
        raise ClusterError(f"helm {' '.join(args)}: exit {res.returncode}: {res.stderr.strip()}")
    return res


def binaries_helm() -> str:
    res = subprocess.run([str(REPO / "scripts/e2e/build-helm")], stdout=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise ClusterError(f"scripts/e2e/build-helm failed (exit {res.returncode})")
    return res.stdout.strip().splitlines()[-1]


def load_image(archive: Path) -> None:
    bins = binaries()
    for n in NODES:
        n.runtime.import_image(n, bins, str(archive))


def helm_install(*extra: str, verb: str = "install") -> None:
    """``helm install`` (or ``upgrade``) of the chart with the bed's values, as README's
    Install says; ``extra``: more helm flags (``--set image.tag=...``)."""
    helm(verb, RELEASE, str(CHART), "--namespace", RELEASE_NS, "-f", str(HELM_VALUES), *extra)


def rolled_out(api) -> bool:
    """The DaemonSet's every pod is of its current template, one per node, Ready."""
    from kubernetes import client

    ds = client.AppsV1Api(api).read_namespaced_daemon_set(RELEASE, RELEASE_NS)
    st = ds.status
    pods = [q for q in agent_pods(api) if q.metadata.deletion_timestamp is None]
    return (
        ds.metadata.generation == st.observed_generation
        and st.desired_number_scheduled == st.updated_number_scheduled == st.number_ready == len(NODES)
        and len(pods) == len(NODES)
        and all(pod_ready(q) for q in pods)
    )


def helm_upgrade(api, *extra: str, timeout_s: float = 240) -> None:
    """``helm upgrade`` with the bed's values and ``extra`` (``--set k=v``; none: the bed's
    values as installed), then wait until the DaemonSet rolled out and the agents are ready."""
    helm_install(*extra, verb="upgrade")
    # the DaemonSet's generation is the new one once helm returns: rolled_out waits for it
    wait(lambda: rolled_out(api) and agents_ready(api), "the DaemonSet rolled out", timeout_s)


def agent_pods(api, name: str | None = None) -> list:
    """The chart's agent pods (of node ``name``), oldest first."""
    from kubernetes import client

    pods = client.CoreV1Api(api).list_namespaced_pod(RELEASE_NS, label_selector=AGENT_LABELS).items
    pods = [q for q in pods if name is None or q.spec.node_name == name]
    return sorted(pods, key=lambda q: q.metadata.creation_timestamp)


def pod_ready(pod) -> bool:
    return pod.metadata.deletion_timestamp is None and any(
        c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or [])
    )


def agent_pod(api, name: str = NODE):
    """Node ``name``'s agent pod, Ready (None when there is no Ready one)."""
    ready = [q for q in agent_pods(api, name) if pod_ready(q)]
    return ready[-1] if ready else None


def agents_ready(api) -> bool:
    """Every node has a Ready agent pod, its kubelet registered the plugin, its slice is there."""
    from kubernetes import client

    for n in NODES:
        if agent_pod(api, n.name) is None or not n.agent_registered():
            return False
        client.ResourceV1Api(api).read_resource_slice(f"{n.name}-{DRIVER}")
    return True


def agent_logs(n: Node) -> list[Path]:
    """The agent container's log files on node ``n`` (every pod and restart), oldest first,
    as the kubelet keeps them (/var/log/pods/<ns>_<pod>_<uid>/agent/N.log)."""
    root = n.host_path("/var/log/pods")
    files = root.glob(f"{RELEASE_NS}_{RELEASE}-*_*/agent/*.log") if root.exists() else []
    return sorted(files, key=lambda f: f.stat().st_mtime)


def agent_log(n: Node) -> str:
    return "".join(f.read_text(errors="replace") for f in agent_logs(n))


def pod_token(n: Node, pod_uid: str) -> str:
    """The projected service-account token the kubelet wrote for pod ``pod_uid`` on node
    ``n`` (what the pod reads at /var/run/secrets/kubernetes.io/serviceaccount/token)."""
    # the kubelet mounts the volume (a tmpfs) in the node's mount namespace: read it there
    vols = f"/var/lib/kubelet/pods/{pod_uid}/volumes/kubernetes.io~projected"
    return n.run("sh", "-c", f"cat {vols}/kube-api-access-*/token").stdout


def agent_client(n: Node, path: Path, api=None):
    """An API client with the token of node ``n``'s agent pod."""
    api = api or api_client()
    return token_client(pod_token(n, agent_pod(api, n.name).metadata.uid), path)


# -- up / down / status --------------------------------------------------------------------


def start_nodes(bins: dict[str, str]) -> None:
    """Each node's init (its PID namespace), runtime (the images imported into it), then its kubelet."""
    for n in NODES:
        n.start_init()
        n.start_runtime(bins)
    for n in NODES:
        wait(
            lambda n=n: n.runtime.ready(n),
            f"{n.name}: {n.runtime.name} socket",
            30,
            proc=n.proc(n.runtime.name),
        )
        n.runtime.load_images(n, bins)
    for n in NODES:
        n.start_kubelet(bins)


def install_cni_dra(api, bins: dict[str, str]) -> None:
    """cni-dra's image into every node's runtime, then the chart; waits for its two agents."""
    load_image(image_archive())
    helm_install()
    wait(lambda: agents_ready(api), "cni-dra's agent pods Ready, registered, slices published", 180)


def up() -> Path:
    if status_line().startswith("up"):
        log("already up")
        return admin_kubeconfig()
    down(quiet=True)
    t0 = time.monotonic()
    bins = binaries()
    image_archive()  # built (once per tree) before anything runs: the build takes minutes
    for sub in ("logs", "pids", "nodes"):
        p(sub).mkdir(parents=True, exist_ok=True)
    (DIR / "versions.json").write_text(json.dumps(versions(bins), indent=1))
    (DIR / "runtime").write_text(RUNTIME + "\n")  # what status, exec and down use when nothing is set
    if MULTUS:
        (DIR / "multus").write_text("1\n")
    try:
        make_bridge()
        make_cgroup(CGROUP_ROOT)
        for n in NODES:
            n.make_namespaces()
            n.write_files(bins)
            if n is multus_node():
                cluster_multus.write_files(n, bins)
            make_cgroup(f"{n.cgroup}/system")
        make_pki()
        start_etcd(bins)
        start_apiserver(bins)
        api = api_client()
        from kubernetes import client

        wait(
            lambda: client.VersionApi(api).get_code().git_version,
            "kube-apiserver answering",
            90,
            proc="kube-apiserver",
        )
        # the bootstrap RBAC policy and the authentication ConfigMap the other components read at start
        rbac = client.RbacAuthorizationV1Api(api)
        wait(
            lambda: (
                rbac.read_cluster_role_binding("system:kube-controller-manager")
                and rbac.read_cluster_role_binding("system:kube-scheduler")
                and client.CoreV1Api(api).read_namespaced_config_map(
                    "extension-apiserver-authentication", "kube-system"
                )
            ),
            "kube-apiserver's bootstrap RBAC policy",
            90,
            proc="kube-apiserver",
        )
        start_controller_manager(bins)
        start_scheduler(bins)
        start_nodes(bins)
        for n in NODES:
            wait(
                lambda n=n: client.CoreV1Api(api).read_node(n.name),
                f"Node {n.name} registered",
                90,
                proc=n.proc("kubelet"),
            )
        install_cni_dra(api, bins)
        if MULTUS:
            install_multus(api)
        for n in NODES:
            wait(lambda n=n: node_ready(api, n.name), f"Node {n.name} Ready", 120, proc=n.proc("kubelet"))
        wait(
            lambda: client.CoreV1Api(api).read_namespaced_service_account("default", "default"),
            "default service account",
            60,
        )
    except BaseException:
        log("bring-up failed; component log tails:")
        print(tails(), file=sys.stderr)
        raise
    log(f"up in {time.monotonic() - t0:.1f}s")
    return admin_kubeconfig()


def _leftovers() -> list[str]:
    found = [str(DIR)] if DIR.exists() else []
    found += [n.netns for n in NODES if Path(n.netns).exists()]
    found += [
        f"link {x}" for x in (BRIDGE, *(n.uplink for n in NODES)) if Path(f"/sys/class/net/{x}").exists()
    ]
    found += [f"cgroup {h / CGROUP_ROOT}" for h in cgroup_hierarchies() if (h / CGROUP_ROOT).exists()]
    return found


def down(quiet: bool = False) -> None:
    if not _leftovers():
        if not quiet:
            log("already down")
        return
    if DIR.exists():
        runtimes = sorted({r.name for r in RUNTIMES.values()})  # whichever the bed was brought up with
        stop_all([n.proc(c) for n in NODES for c in ("kubelet", *runtimes)])
        stop_all([n.proc("init") for n in NODES])  # the rest of each node's PID namespace with it
        for name in reversed(CONTROL_PLANE):  # one by one: the API server stops slowly without etcd
            stop(name, timeout_s=10)
    # what the nodes left: shims (sessions of their own), processes of a failed up
    inodes = set().union(*(n.namespace_inodes() for n in NODES))
    for _ in range(3):
        if not kill_in_namespaces(inodes):
            break
        time.sleep(0.3)
    remove_cgroups()
    for n in NODES:
        n.delete_namespaces()
    delete_bridge()
    if DIR.exists():
        unmount_under(DIR)
        run("rm", "-rf", "--one-file-system", str(DIR))
    left = _leftovers()
    if left:
        raise ClusterError(f"left after down: {', '.join(left)}")
    if not quiet:
        log("down")


def status_line() -> str:
    if not DIR.exists():
        return "down"
    names = [*CONTROL_PLANE, *(n.proc(c) for n in NODES for c in ("init", n.runtime.name, "kubelet"))]
    missing = [name for name in names if not running(name)]
    if missing:
        return f"degraded: not running: {', '.join(missing)} (logs in {p('logs')})"
    try:
        api = api_client()
        ready = {n.name: node_ready(api, n.name) for n in NODES}
    except Exception as exc:  # noqa: BLE001
        return f"degraded: API not answering ({type(exc).__name__})"
    nodes = ", ".join(f"{k} {'Ready' if v else 'NotReady'}" for k, v in ready.items())
    return f"up: nodes {nodes}; KUBECONFIG={admin_kubeconfig()}"


def main(argv: list[str]) -> int:
    cmd = argv[1] if len(argv) > 1 else "status"
    try:
        if cmd == "up":
            print(up())
            print(status_line(), file=sys.stderr)
        elif cmd == "down":
            down()
        elif cmd == "status":
            print(status_line())
        elif cmd == "versions":
            for name, line in versions(binaries()).items():
                print(f"  {name:<11} {line}")
        elif cmd == "exec" and len(argv) > 3:
            args = argv[4:] if argv[3] == "--" else argv[3:]
            os.execvp("nsenter", [*node(argv[2]).nsenter(), *args])
        elif cmd == "load-image" and len(argv) == 3:
            bins = binaries()
            for n in NODES:
                n.runtime.import_image(n, bins, str(Path(argv[2]).resolve()))
                log(f"{n.name}: {' '.join(n.runtime.images(n, bins))}")
        elif cmd == "image" and len(argv) <= 3:
            print(image_archive(*argv[2:3]))
        elif cmd == "helm":
            os.environ.update(KUBECONFIG=str(admin_kubeconfig()))
            res = helm(*argv[2:], check=False)
            print(res.stdout, end="")
            print(res.stderr, end="", file=sys.stderr)
            return res.returncode
        else:
            print("\n".join(__doc__.strip().splitlines()[2:8]), file=sys.stderr)
            return 2
    except ClusterError as exc:
        log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
