#!/opt/cni-dra/venv/bin/python
"""A one-node Kubernetes cluster on this machine, as plain processes, with cni-dra as its
pod network and DRA driver.

usage: cluster.py up | down | status | versions | agent-start | agent-stop

``up`` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd
and the kubelet under the cluster directory (``CNI_DRA_E2E_DIR``, default
/run/cni-dra-e2e), creates two veth pairs as the node's 10G NICs (one of MTU 1500, one
jumbo: ``JUMBO_NIC``, MTU ``JUMBO_MTU``), applies conf/k8s/rbac.yaml, admission.yaml and
deviceclass.yaml unchanged, starts ``cni-dra agent`` on the host with its own
service account's token (bound to the Node, as a DaemonSet pod's token is bound to its
node) and the plugin's conflist as its ``--conflist`` (the limits on device profiles, as
the DaemonSet points the agent at the plugin's conflist), waits until the Node is Ready and prints the admin
KUBECONFIG path on stdout. ``down`` stops every process it started, unmounts what they
mounted under the cluster directory, removes the cgroups under the cluster's cgroup root,
the NICs and the directory. Both are idempotent. Each component logs to
``<dir>/logs/<name>.log``; on a failure the tails are printed to stderr.

Binaries: scripts/e2e/build-kube (Kubernetes) and scripts/e2e/fetch-runtime (etcd,
containerd, runc, images) are run first; both answer from their cache in well under a
second once built. The cni-dra plugin and CLI are the installed ones (``make install``:
/opt/cni/bin/cni-dra).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DIR = Path(os.environ.get("CNI_DRA_E2E_DIR", "/run/cni-dra-e2e"))
KUBE_VERSION = os.environ.get("CNI_DRA_E2E_KUBE_VERSION", "v1.37.2")
NODE = "cni-dra-e2e"
DRIVER = "net.cni-dra.dev"
NETWORK = "cni-dra-e2e"  # the conflist's name (libcni's cache files are named after it)
CGROUP_ROOT = "cni-dra-e2e"  # under every cgroup hierarchy; the kubelet's --cgroup-root
NICS = {"cde2e-nic0": "cde2e-nic0p", "cde2e-nic1": "cde2e-nic1p"}  # NIC -> its veth peer
JUMBO_NIC = "cde2e-nic1"
JUMBO_MTU = 9216
"""The MTU of the jumbo NIC (both veth ends; the other NIC keeps the kernel's 1500). Above
9000, so that a link a profile makes 9000 bytes differs from what a macvlan or ipvlan takes
by default (its parent's MTU)."""
NIC_BANDWIDTH = "10G"
POD_SUBNET = "10.244.77.0/24"
SERVICE_RANGE = "10.96.0.0/24"
FEATURE_GATES = "--feature-gates=DRAConsumableCapacity=true"
"""The same gates for every control-plane component (on by default in 1.37; said anyway)."""
APISERVER_PORT = 16443
ETCD_PORT = 23790
CNI_EXE = os.environ.get("CNI_DRA_TEST_EXE", "/opt/cni/bin/cni-dra")
CNI_BIN = os.environ.get("CNI_BIN_DIR", "/opt/cni/bin")
SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"
TEST_IMAGE = "localhost/cni-dra-e2e/sleeper:1"
ORDER = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "containerd", "kubelet", "agent"]


class ClusterError(Exception):
    pass


def log(msg: str) -> None:
    print(f"cluster: {msg}", file=sys.stderr, flush=True)


def run(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(list(args), capture_output=True, text=True, **kw)
    if check and res.returncode != 0:
        raise ClusterError(f"failed to run {' '.join(args)}: exit {res.returncode}: {res.stderr.strip() or res.stdout.strip()}")
    return res


# -- paths ---------------------------------------------------------------------------------

def p(*parts: str) -> Path:
    return DIR.joinpath(*parts)


def admin_kubeconfig() -> Path:
    return p("pki", "admin.kubeconfig")


def agent_kubeconfig() -> Path:
    return p("agent", "kubeconfig")


def state_dir() -> Path:
    return p("agent", "state")


def inventory_path() -> Path:
    return p("agent", "inventory.yaml")


def fastpath_socket() -> Path:
    return p("agent", "fastpath", "agent.sock")


def kubelet_root() -> Path:
    return p("kubelet")


def host_ip() -> str:
    out = run("ip", "-4", "-o", "route", "get", "1.1.1.1", check=False).stdout.split()
    return out[out.index("src") + 1] if "src" in out else "127.0.0.1"


# -- binaries ------------------------------------------------------------------------------

def binaries() -> dict[str, str]:
    """Paths of every binary; builds or fetches what is not cached yet."""
    res = subprocess.run([str(REPO / "scripts/e2e/build-kube"), KUBE_VERSION], stdout=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise ClusterError(f"scripts/e2e/build-kube {KUBE_VERSION} failed (exit {res.returncode})")
    kube_bin = res.stdout.strip().splitlines()[-1]
    res = subprocess.run([str(REPO / "scripts/e2e/fetch-runtime")], stdout=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise ClusterError(f"scripts/e2e/fetch-runtime failed (exit {res.returncode})")
    rt = dict(line.split("=", 1) for line in res.stdout.strip().splitlines() if "=" in line)
    return {"kube": kube_bin, "etcd": rt["ETCD"], "containerd_bin": rt["CONTAINERD_BIN"], "runc": rt["RUNC"],
            "images": rt["IMAGES"]}


def versions(bins: dict[str, str]) -> dict[str, str]:
    """One line per component, from the binaries themselves."""
    def first(*args: str) -> str:
        res = run(*args, check=False)
        return (res.stdout or res.stderr).strip().splitlines()[0] if (res.stdout or res.stderr).strip() else "?"

    cd = bins["containerd_bin"]
    return {
        "kubernetes": first(f"{bins['kube']}/kube-apiserver", "--version"),
        "kubelet": first(f"{bins['kube']}/kubelet", "--version"),
        "etcd": first(bins["etcd"], "--version"),
        "containerd": first(f"{cd}/containerd", "--version"),
        "runc": first(bins["runc"], "--version"),
        "cni-dra": first(sys.executable, "-c", "import importlib.metadata as m; print('cni-dra', m.version('cni-dra'))"),
    }


# -- certificates (openssl) ----------------------------------------------------------------

def _cert(name: str, subj: str, *, ca: bool = False, sans: list[str] | None = None, server: bool = False) -> None:
    pki = p("pki")
    key, crt = pki / f"{name}.key", pki / f"{name}.crt"
    run("openssl", "genrsa", "-out", str(key), "2048")
    if ca:
        run("openssl", "req", "-x509", "-new", "-key", str(key), "-subj", subj, "-days", "3", "-out", str(crt),
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return
    csr = pki / f"{name}.csr"
    run("openssl", "req", "-new", "-key", str(key), "-subj", subj, "-out", str(csr))
    ext = pki / f"{name}.ext"
    lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
             f"extendedKeyUsage={'serverAuth,clientAuth' if server else 'clientAuth'}"]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
        "-CAcreateserial", "-days", "3", "-extfile", str(ext), "-out", str(crt))


def _kubeconfig(path: Path, *, user: str, cert: str | None = None, token: str | None = None) -> None:
    pki = p("pki")
    if token:
        creds = {"token": token}
    else:
        creds = {"client-certificate": str(pki / f"{cert}.crt"), "client-key": str(pki / f"{cert}.key")}
    cfg = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": f"https://127.0.0.1:{APISERVER_PORT}",
                                                 "certificate-authority": str(pki / "ca.crt")}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    }
    path.write_text(json.dumps(cfg, indent=1))
    path.chmod(0o600)


def make_pki() -> None:
    pki = p("pki")
    pki.mkdir(parents=True, exist_ok=True)
    _cert("ca", "/CN=cni-dra-e2e-ca", ca=True)
    ip = host_ip()
    _cert("apiserver", "/CN=kube-apiserver", server=True,
          sans=["IP:127.0.0.1", f"IP:{ip}", "IP:10.96.0.1", "DNS:localhost", "DNS:kubernetes",
                "DNS:kubernetes.default", "DNS:kubernetes.default.svc"])
    _cert("admin", "/O=system:masters/CN=cni-dra-e2e-admin")
    _cert("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client")
    _cert("scheduler", "/CN=system:kube-scheduler")
    _cert("controller-manager", "/CN=system:kube-controller-manager")
    _cert("kubelet", f"/O=system:nodes/CN=system:node:{NODE}")
    _cert("kubelet-serving", f"/CN={NODE}", server=True, sans=["IP:127.0.0.1", f"IP:{ip}", f"DNS:{NODE}"])
    run("openssl", "genrsa", "-out", str(pki / "sa.key"), "2048")
    run("openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    _kubeconfig(admin_kubeconfig(), user="admin", cert="admin")
    _kubeconfig(pki / "scheduler.kubeconfig", user="scheduler", cert="scheduler")
    _kubeconfig(pki / "controller-manager.kubeconfig", user="controller-manager", cert="controller-manager")
    _kubeconfig(pki / "kubelet.kubeconfig", user="kubelet", cert="kubelet")


# -- processes -----------------------------------------------------------------------------

# Popen objects of the processes this process started (kept so that they are reaped, not
# garbage-collected while running); other processes are found through the pid files.
_PROCS: dict[str, subprocess.Popen] = {}


def pidfile(name: str) -> Path:
    return p("pids", f"{name}.pid")


def logfile(name: str) -> Path:
    return p("logs", f"{name}.log")


def start(name: str, args: list[str], env: dict[str, str] | None = None) -> int:
    p("pids").mkdir(parents=True, exist_ok=True)
    p("logs").mkdir(parents=True, exist_ok=True)
    full_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
    full_env.update(env or {})
    with open(logfile(name), "ab") as out:
        out.write(f"=== {time.strftime('%H:%M:%S')} start: {' '.join(args)}\n".encode())
        out.flush()
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=full_env, start_new_session=True, cwd=str(DIR))
    pidfile(name).write_text(str(proc.pid))
    p("pids", f"{name}.cmd").write_text(json.dumps({"args": args, "env": env or {}}))
    _PROCS[name] = proc
    return proc.pid


def pid_of(name: str) -> int | None:
    try:
        pid = int(pidfile(name).read_text())
    except (OSError, ValueError):
        return None
    proc = _PROCS.get(name)
    if proc is not None and proc.pid == pid:
        # our own child: its Popen object is the authority. Its command line is not: right
        # after the exec the kernel wakes this process before the new program's argument
        # area is set up, and /proc/<pid>/cmdline reads empty for a moment
        return pid if proc.poll() is None else None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    # a zombie (our child, exited, not yet reaped) counts as gone; so does a pid that now
    # belongs to another program (pid reuse): never signal a process we did not start
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            _reap(pid)
            return None
        # every command line started here names the cluster directory (an exec, as the
        # agent's thin client does, changes argv[0] but keeps the arguments)
        if str(DIR).encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return None
    except OSError:
        return None
    return pid


def restart(name: str) -> int:
    """Stop ``name`` (SIGTERM) and start it again with the same command line."""
    saved = json.loads(p("pids", f"{name}.cmd").read_text())
    stop(name)
    return start(name, saved["args"], saved["env"])


def running(name: str) -> bool:
    return pid_of(name) is not None


def stop(name: str, *, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
    pid = pid_of(name)
    if pid is None:
        pidfile(name).unlink(missing_ok=True)
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and pid_of(name) is not None:
        _reap(pid)
        time.sleep(0.1)
    if pid_of(name) is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(0.3)
        _reap(pid)
    proc = _PROCS.pop(name, None)
    if proc is not None and proc.pid == pid:
        proc.wait(5)
    pidfile(name).unlink(missing_ok=True)


def _reap(pid: int) -> None:
    for proc in _PROCS.values():
        if proc.pid == pid:
            proc.poll()
            return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def tails(lines: int = 25) -> str:
    out = []
    for name in ORDER:
        f = logfile(name)
        if f.exists():
            text = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"----- {f} (last {len(text)} lines) -----\n" + "\n".join(text))
    return "\n".join(out)


def wait(cond, what: str, timeout_s: float, *, proc: str | None = None) -> None:
    end = time.monotonic() + timeout_s
    last_exc = None
    while time.monotonic() < end:
        try:
            if cond():
                return
        except Exception as exc:  # noqa: BLE001 - the condition probes a starting component
            last_exc = exc
        if proc and not running(proc):
            raise ClusterError(f"{proc} exited while waiting for {what}; see {logfile(proc)}")
        time.sleep(0.3)
    raise ClusterError(f"{what} not reached in {timeout_s:.0f}s (last error: {last_exc})")


# -- NICs ----------------------------------------------------------------------------------

def make_nics() -> None:
    for nic, peer in NICS.items():
        if not Path(f"/sys/class/net/{nic}").exists():
            run("ip", "link", "add", nic, "type", "veth", "peer", "name", peer)
        mtu = str(JUMBO_MTU if nic == JUMBO_NIC else 1500)
        run("ip", "link", "set", nic, "mtu", mtu, "up")
        run("ip", "link", "set", peer, "mtu", mtu, "up")


def delete_nics() -> None:
    for nic in NICS:
        if Path(f"/sys/class/net/{nic}").exists():
            run("ip", "link", "del", nic, check=False)


def write_inventory() -> None:
    doc = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-inventory"},
        "spec": {
            "driver": DRIVER, "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": nic, "allowMultipleAllocations": True, "attributes": {"ifName": {"string": nic}},
                 "capacity": {"bandwidth": {"value": NIC_BANDWIDTH, "requestPolicy": {
                     "default": "1G", "validRange": {"min": "100M", "step": "100M"}}}}}
                for nic in NICS
            ],
        },
    }
    inventory_path().parent.mkdir(parents=True, exist_ok=True)
    inventory_path().write_text(json.dumps(doc, indent=1))


def conflist() -> dict:
    return {
        "cniVersion": "1.1.0", "name": NETWORK,
        "plugins": [{
            "type": "cni-dra", "driver": DRIVER,
            "stateDir": str(state_dir()), "inventory": str(inventory_path()),
            "linkType": "macvlan", "mode": "bridge",
            # as the shipped conflists: containerd then passes a pod's bandwidth annotations
            "capabilities": {"bandwidth": True},
            "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                     "dataDir": str(p("ipam"))},
        }],
    }


# -- cgroups, mounts -----------------------------------------------------------------------

def cgroup_hierarchies() -> list[Path]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] in ("cgroup", "cgroup2"):
            mp = Path(fields[4])
            if mp not in out:
                out.append(mp)
    return out


def make_cgroup_root() -> None:
    for h in cgroup_hierarchies():
        d = h / CGROUP_ROOT
        d.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (h / knob).exists() and not (d / knob).read_text().strip():
                (d / knob).write_text((h / knob).read_text().strip())


def remove_cgroups() -> None:
    """Kill whatever still runs in the cluster's cgroups (containers of a stopped
    containerd), then remove them, deepest first. Only the tree under CGROUP_ROOT."""
    for _ in range(3):
        for h in cgroup_hierarchies():
            root = h / CGROUP_ROOT
            if not root.is_dir():
                continue
            for procs in root.rglob("cgroup.procs"):
                try:
                    for pid in procs.read_text().split():
                        try:
                            os.kill(int(pid), signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                except OSError:
                    pass
        time.sleep(0.3)
        left = []
        for h in cgroup_hierarchies():
            root = h / CGROUP_ROOT
            if not root.is_dir():
                continue
            dirs = sorted((d for d in root.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True)
            for d in [*dirs, root]:
                try:
                    d.rmdir()
                except OSError:
                    left.append(d)
        if not left:
            return
    raise ClusterError(f"cgroups left: {', '.join(map(str, left[:5]))}")


def our_mounts() -> list[str]:
    prefix = str(DIR)
    mps = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if mp == prefix or mp.startswith(prefix + "/"):
            mps.append(mp)
    return mps


def unmount_all() -> None:
    for _ in range(10):
        mps = our_mounts()
        if not mps:
            return
        for mp in sorted(set(mps), key=lambda m: m.count("/"), reverse=True):
            if run("umount", mp, check=False).returncode != 0:
                run("umount", "-l", mp, check=False)
    if our_mounts():
        raise ClusterError(f"mounts left: {our_mounts()[:5]}")


def kill_strays() -> None:
    """containerd's shims: they run in sessions of their own and outlive a killed
    containerd. Only those serving this cluster's containerd socket."""
    me = os.getpid()
    needle = b"-address\0" + str(containerd_socket()).encode() + b"\0"
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmd + b"\0":
            try:
                os.kill(int(d.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


# -- components ----------------------------------------------------------------------------

def start_etcd(bins: dict[str, str]) -> None:
    p("etcd").mkdir(parents=True, exist_ok=True)
    start("etcd", [bins["etcd"], "--name", "e2e", "--data-dir", str(p("etcd")),
                   "--listen-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
                   "--advertise-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
                   "--listen-peer-urls", f"http://127.0.0.1:{ETCD_PORT + 10}",
                   "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD_PORT + 10}",
                   "--initial-cluster", f"e2e=http://127.0.0.1:{ETCD_PORT + 10}",
                   "--unsafe-no-fsync", "--log-level", "warn"])


def start_apiserver(bins: dict[str, str]) -> None:
    pki = p("pki")
    start("kube-apiserver", [
        f"{bins['kube']}/kube-apiserver",
        f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
        "--bind-address=127.0.0.1", f"--secure-port={APISERVER_PORT}", f"--advertise-address={host_ip()}",
        f"--tls-cert-file={pki}/apiserver.crt", f"--tls-private-key-file={pki}/apiserver.key",
        f"--client-ca-file={pki}/ca.crt",
        f"--kubelet-client-certificate={pki}/apiserver-kubelet-client.crt",
        f"--kubelet-client-key={pki}/apiserver-kubelet-client.key",
        f"--kubelet-certificate-authority={pki}/ca.crt",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki}/sa.pub", f"--service-account-signing-key-file={pki}/sa.key",
        f"--service-cluster-ip-range={SERVICE_RANGE}",
        "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        "--runtime-config=resource.k8s.io/v1=true",
        FEATURE_GATES,
        "--profiling=false", "--v=1",
    ])


def _kubeconfig_flags(kubeconfig: str) -> list[str]:
    """A controller's own, authentication and authorization kubeconfig: one file for all three."""
    return [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}"]


def start_controller_manager(bins: dict[str, str]) -> None:
    pki = p("pki")
    start("kube-controller-manager", [
        f"{bins['kube']}/kube-controller-manager",
        *_kubeconfig_flags(f"{pki}/controller-manager.kubeconfig"),
        "--bind-address=127.0.0.1", "--secure-port=10357",
        f"--service-account-private-key-file={pki}/sa.key", f"--root-ca-file={pki}/ca.crt",
        "--use-service-account-credentials=true", "--leader-elect=false",
        f"--service-cluster-ip-range={SERVICE_RANGE}",
        "--controllers=*,-nodeipam",
        FEATURE_GATES, "--v=1",
    ])


def start_scheduler(bins: dict[str, str]) -> None:
    pki = p("pki")
    start("kube-scheduler", [
        f"{bins['kube']}/kube-scheduler",
        *_kubeconfig_flags(f"{pki}/scheduler.kubeconfig"),
        "--bind-address=127.0.0.1", "--secure-port=10359", "--leader-elect=false",
        FEATURE_GATES, "--v=2",
    ])


def conflist_path() -> Path:
    return p("net.d", "10-cni-dra-e2e.conflist")


def containerd_socket() -> Path:
    return p("containerd", "containerd.sock")


def start_containerd(bins: dict[str, str]) -> None:
    cdir = p("containerd")
    (cdir / "root").mkdir(parents=True, exist_ok=True)
    (cdir / "state").mkdir(parents=True, exist_ok=True)
    netd = p("net.d")
    netd.mkdir(parents=True, exist_ok=True)
    conflist_path().write_text(json.dumps(conflist(), indent=1))
    config = f"""version = 3
root = "{cdir}/root"
state = "{cdir}/state"

[grpc]
  address = "{containerd_socket()}"

[ttrpc]
  address = "{cdir}/containerd.sock.ttrpc"

[debug]
  level = "info"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_BIN}"]
    conf_dir = "{netd}"
    max_conf_num = 1
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{bins['runc']}"
        SystemdCgroup = false

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{SANDBOX_IMAGE}"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
"""
    (cdir / "config.toml").write_text(config)
    env = {"PATH": f"{bins['containerd_bin']}:{Path(bins['runc']).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
           "CNI_DRA_AGENT_SOCKET": str(fastpath_socket())}
    start("containerd", [f"{bins['containerd_bin']}/containerd", "--config", str(cdir / "config.toml")], env)
    wait(lambda: containerd_socket().is_socket(), "containerd socket", 30, proc="containerd")
    ctr = [f"{bins['containerd_bin']}/ctr", "--address", str(containerd_socket()), "-n", "k8s.io"]
    for tar in ("pause.tar", "sleeper.tar"):
        run(*ctr, "images", "import", f"{bins['images']}/{tar}", check=False)
    listed = run(*ctr, "images", "ls", "-q").stdout.split()
    for image in (SANDBOX_IMAGE, TEST_IMAGE):
        if image not in listed:
            raise ClusterError(f"image {image} not imported into containerd (have: {listed})")


def start_kubelet(bins: dict[str, str]) -> None:
    pki = p("pki")
    root = kubelet_root()
    root.mkdir(parents=True, exist_ok=True)
    cfg = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{CGROUP_ROOT}",
        "containerRuntimeEndpoint": f"unix://{containerd_socket()}",
        "failSwapOn": False,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": f"{pki}/ca.crt"}},
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": f"{pki}/kubelet-serving.crt", "tlsPrivateKeyFile": f"{pki}/kubelet-serving.key",
        "address": "127.0.0.1", "port": 10350, "readOnlyPort": 0, "healthzPort": 10348,
        "healthzBindAddress": "127.0.0.1",
        "resolvConf": "/etc/resolv.conf",
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "registerNode": True,
                "kubeReserved": {}, "systemReserved": {},
    }
    (root / "config.yaml").write_text(json.dumps(cfg, indent=1))
    start("kubelet", [
        f"{bins['kube']}/kubelet", f"--config={root}/config.yaml", f"--kubeconfig={pki}/kubelet.kubeconfig",
        f"--root-dir={root}", f"--hostname-override={NODE}", f"--node-ip={host_ip()}", "--v=2",
    ])


# -- API objects ---------------------------------------------------------------------------

def api_client():
    from kubernetes import client, config

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


def node_ready(api) -> bool:
    from kubernetes import client

    node = client.CoreV1Api(api).read_node(NODE)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def agent_token(api, node_uid: str, node: str = NODE) -> str:
    """A token of cni-dra's service account bound to Node ``node`` (TokenRequest): the API
    server puts the node's name in the token's user info, as in a DaemonSet pod's."""
    from kubernetes import client

    req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
        audiences=["https://kubernetes.default.svc.cluster.local"], expiration_seconds=24 * 3600,
        bound_object_ref=client.V1BoundObjectReference(kind="Node", api_version="v1", name=node, uid=node_uid)))
    return client.CoreV1Api(api).create_namespaced_service_account_token("cni-dra", "kube-system", req).status.token


def token_client(token: str, path: Path):
    """An API client authenticating with ``token`` (its kubeconfig written to ``path``)."""
    from kubernetes import config

    _kubeconfig(path, user="token", token=token)
    return config.new_client_from_config(config_file=str(path))


def agent_start(extra: list[str] | None = None) -> int:
    """Start ``cni-dra agent`` as the DaemonSet's container would run it, with the
    kubelet's plugin directories of this cluster and containerd's conflist (the profile
    limits of its cni-dra entry). Returns its pid."""
    root = kubelet_root()
    args = [CNI_EXE, "agent", "--node-name", NODE, "--kubeconfig", str(agent_kubeconfig()),
            "--inventory", str(inventory_path()), "--state-dir", str(state_dir()),
            "--plugin-dir", f"{root}/plugins/{DRIVER}", "--registry-dir", f"{root}/plugins_registry",
            "--conflist", str(conflist_path()),
            "--metrics-address", "127.0.0.1:19412", "--resync-interval", "60", *(extra or [])]
    return start("agent", args, {"CNI_DRA_AGENT_SOCKET": str(fastpath_socket())})


def agent_registered() -> bool:
    """The kubelet's log says it connected to the driver's DRA socket (its last word on it)."""
    lines = [ln for ln in logfile("kubelet").read_text(errors="replace").splitlines()
             if f'driverName="{DRIVER}"' in ln and "connected=" in ln]
    return bool(lines) and "connected=true" in lines[-1]


def agent_stop(sig: int = signal.SIGTERM) -> None:
    stop("agent", sig=sig)


# -- up / down / status --------------------------------------------------------------------

def up() -> Path:
    if status_line().startswith("up"):
        log("already up")
        return admin_kubeconfig()
    down(quiet=True)
    t0 = time.monotonic()
    bins = binaries()
    DIR.mkdir(parents=True, exist_ok=True)
    for sub in ("logs", "pids", "agent"):
        p(sub).mkdir(parents=True, exist_ok=True)
    fastpath_socket().parent.mkdir(mode=0o700, exist_ok=True)
    (DIR / "versions.json").write_text(json.dumps(versions(bins), indent=1))
    try:
        make_pki()
        make_nics()
        write_inventory()
        make_cgroup_root()
        start_etcd(bins)
        start_apiserver(bins)
        api = api_client()
        from kubernetes import client

        wait(lambda: client.VersionApi(api).get_code().git_version, "kube-apiserver answering", 90,
             proc="kube-apiserver")
        # the bootstrap RBAC policy and the authentication ConfigMap the other components read at start
        wait(lambda: client.RbacAuthorizationV1Api(api).read_cluster_role_binding("system:kube-controller-manager")
             and client.RbacAuthorizationV1Api(api).read_cluster_role_binding("system:kube-scheduler")
             and client.CoreV1Api(api).read_namespaced_config_map("extension-apiserver-authentication", "kube-system"),
             "kube-apiserver's bootstrap RBAC policy", 90, proc="kube-apiserver")
        start_controller_manager(bins)
        start_scheduler(bins)
        start_containerd(bins)
        start_kubelet(bins)
        apply_manifest(api, REPO / "conf/k8s/rbac.yaml")
        apply_manifest(api, REPO / "conf/k8s/admission.yaml")
        apply_manifest(api, REPO / "conf/k8s/deviceclass.yaml")
        wait(lambda: client.CoreV1Api(api).read_node(NODE) is not None, "Node registered", 90, proc="kubelet")
        node_uid = client.CoreV1Api(api).read_node(NODE).metadata.uid
        wait(lambda: client.CoreV1Api(api).read_namespaced_service_account("cni-dra", "kube-system"),
             "service account", 30)
        _kubeconfig(agent_kubeconfig(), user="cni-dra", token=agent_token(api, node_uid))
        agent_start()
        wait(lambda: node_ready(api), "Node Ready", 120, proc="kubelet")
        wait(agent_registered, "the kubelet registering cni-dra's DRA plugin", 60, proc="agent")
        wait(lambda: client.ResourceV1Api(api).read_resource_slice(f"{NODE}-{DRIVER}"), "cni-dra's ResourceSlice",
             60, proc="agent")
        wait(lambda: client.CoreV1Api(api).read_namespaced_service_account("default", "default"),
             "default service account", 60)
    except BaseException:
        log("bring-up failed; component log tails:")
        print(tails(), file=sys.stderr)
        raise
    log(f"up in {time.monotonic() - t0:.1f}s")
    return admin_kubeconfig()


def down(quiet: bool = False) -> None:
    if not DIR.exists() and not any(Path(f"/sys/class/net/{n}").exists() for n in NICS):
        if not quiet:
            log("already down")
        return
    if DIR.exists():
        for name in reversed(ORDER):
            stop(name, timeout_s=15 if name in ("kubelet", "containerd") else 10)
        kill_strays()
        remove_cgroups()
        unmount_all()
        for f in Path("/var/lib/cni/results").glob(f"{NETWORK}-*") if Path("/var/lib/cni/results").exists() else []:
            f.unlink(missing_ok=True)
    else:
        remove_cgroups()
    delete_nics()
    if DIR.exists():
        run("rm", "-rf", "--one-file-system", str(DIR))
    if not quiet:
        log("down")


def status_line() -> str:
    if not DIR.exists():
        return "down"
    procs = {n: running(n) for n in ORDER}
    missing = [n for n, ok in procs.items() if not ok]
    if missing == []:
        try:
            ready = node_ready(api_client())
        except Exception as exc:  # noqa: BLE001
            return f"degraded: API not answering ({type(exc).__name__})"
        return f"up: node {NODE} {'Ready' if ready else 'NotReady'}, KUBECONFIG={admin_kubeconfig()}"
    return f"degraded: not running: {', '.join(missing)} (logs in {p('logs')})"


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
        elif cmd == "agent-start":
            print(agent_start())
        elif cmd == "agent-stop":
            agent_stop()
        else:
            print(__doc__.strip().splitlines()[2], file=sys.stderr)
            return 2
    except ClusterError as exc:
        log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
