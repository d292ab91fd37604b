"""A node of scripts/e2e/cluster.py: its own network, mount, UTS and PID namespaces on this
machine, as a kind node container has, and the processes that run in them (an init, the
runtime, the kubelet; cni-dra's agent is the chart's DaemonSet pod, run by the runtime).

Network: a namespace named after the node (``/run/netns/<node>``) with ``eth0``, a veth
to the host's bridge ``cde2e-br0`` (host 10.250.0.1/24, the node .10+i, default route via
the host), the node's two stand-in NICs (veth pairs inside it), and a DNAT rule from the
``kubernetes`` Service's ClusterIP to the API server (kube-proxy's, for that one Service).

Mount: a persistent namespace (``<dir>/ns/<node>.mnt``, made by ``unshare --mount``,
``--propagation private``) set up by :func:`init_inside`: the copies of other namespaces'
files dropped, a sysfs of the node's network namespace (``/sys/class/net`` lists the
node's links; the cgroup hierarchies moved back under it), overlays on /etc, /var/lib and
/var/log (so mount points can be made without touching the host), node-private
directories (``<dir>/nodes/<node>/fs/<path>``) bind-mounted over the standard paths
(:data:`PRIVATE_PATHS` and the runtime's), the node's own /run, and ``/`` made rshared
(as kind's entrypoint does). UTS: the node's hostname. PID: a namespace whose init
(:func:`pid1`, it reaps orphans) mounts the node's /proc, so that a ``hostPID`` pod sees the
node's processes and ``/proc/1`` is the node's init, in the node's mount namespace (what the
chart's fast-path workers join). Everything of the node is then started with ``nsenter``
into the four and uses its default paths, as on a real node, so a DaemonSet's hostPath means
this node's.

Run as ``cluster_node.py init ROOT HOSTNAME PATH...`` inside the new namespaces (by
:meth:`Node.make_namespaces`), and as ``cluster_node.py pid1 PIDFILE`` as the init of the
node's PID namespace (by :meth:`Node.start_init`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from cluster_procs import CGROUP_ROOT, log, logfile, p, restart, run, running, start, stop
from cluster_runtime import Runtime, from_env

BRIDGE = "cde2e-br0"
HOST_IP = "10.250.0.1"
"""The host's address on the bridge: the API server binds and advertises it."""
APISERVER_PORT = 16443
SERVICE_RANGE = "10.96.0.0/24"
KUBERNETES_SERVICE = ("10.96.0.1", 443)
"""The ``kubernetes`` Service (the first address of SERVICE_RANGE): what the kubelet tells a
pod in KUBERNETES_SERVICE_HOST and _PORT. No kube-proxy runs here; each node's netns has
the one rule kube-proxy would make for it (DNAT to the API server)."""
NETWORK = "cni-dra-e2e"  # the conflist's name (libcni's cache files are named after it)
DRIVER = "net.cni-dra.dev"
NICS = {
    "cde2e-nic0": "cde2e-nic0p",
    "cde2e-nic1": "cde2e-nic1p",
}  # NIC -> its veth peer; the same on every node
JUMBO_NIC = "cde2e-nic1"
JUMBO_MTU = 9216
"""The MTU of the jumbo NIC (both veth ends; the other NIC keeps the kernel's 1500). Above
9000, so that a link a profile makes 9000 bytes differs from what a macvlan or ipvlan takes
by default (its parent's MTU)."""
NIC_BANDWIDTH = "10G"
CNI_BIN = os.environ.get("CNI_BIN_DIR", "/opt/cni/bin")
"""The installed cni-dra (client and tree) copied into each node's /opt/cni/bin."""
NODE_CNI_EXE = "/opt/cni/bin/cni-dra"
CONFLIST = f"/etc/cni/net.d/10-{NETWORK}.conflist"
INIT_PIDFILE = "/run/cni-dra-e2e-init.pid"
"""Where the node's init writes its pid in the host's PID namespace (a node path)."""
PRIVATE_PATHS = (
    "/etc/kubernetes",
    "/etc/cni/net.d",
    "/etc/cni-dra",
    "/opt/cni/bin",
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/var/lib/cni-dra",
    "/var/log/pods",
    "/var/log/containers",
)
"""Node paths bind-mounted from the node's own directory (besides /run and the runtime's)."""
OVERLAID = ("/etc", "/var/lib", "/var/log")
"""Parents of private paths that may not exist on the host: an overlay on each (upper dir
the node's) lets the node make its mount points without making them on the host."""
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Node:
    name: str
    index: int  # 1, 2, ...: the node's address and uplink name
    pod_subnet: str
    runtime: Runtime = field(default_factory=from_env)  # CNI_DRA_E2E_RUNTIME

    @property
    def ip(self) -> str:
        return f"10.250.0.{10 + self.index}"

    @property
    def uplink(self) -> str:
        """The host end of the node's eth0."""
        return f"cde2e-up{self.index}"

    @property
    def netns(self) -> str:
        return f"/run/netns/{self.name}"

    @property
    def mnt(self) -> Path:
        return p("ns", f"{self.name}.mnt")

    @property
    def uts(self) -> Path:
        return p("ns", f"{self.name}.uts")

    @property
    def root(self) -> Path:
        return p("nodes", self.name)

    @property
    def cgroup(self) -> str:
        """The kubelet's cgroupRoot (one level down in every hierarchy)."""
        return f"{CGROUP_ROOT}/{self.name}"

    def private_paths(self) -> tuple[str, ...]:
        return (*PRIVATE_PATHS, *self.runtime.private_paths)

    def host_path(self, path: str) -> Path:
        """Where the host sees the node's ``path`` (only under a private path or /run)."""
        if not any(path == q or path.startswith(q + "/") for q in (*self.private_paths(), "/run")):
            raise ValueError(f"{path} is not a private path of node {self.name}")
        return self.root / "fs" / path.lstrip("/")

    # -- running things in the node ----------------------------------------------------------

    def init_pid(self) -> int | None:
        """The host pid of the node's init (None before :meth:`start_init`)."""
        try:
            return int(self.host_path(INIT_PIDFILE).read_text())
        except (OSError, ValueError):
            return None

    def nsenter(self) -> list[str]:
        """Into the node's namespaces; its PID namespace too once its init runs (nsenter then
        forks: what it runs is the child; ``cluster_procs.stop`` signals the process group)."""
        pid = [f"--pid=/proc/{self.init_pid()}/ns/pid"] if self.running("init") and self.init_pid() else []
        return ["nsenter", f"--mount={self.mnt}", f"--uts={self.uts}", f"--net={self.netns}", *pid, "--"]

    def run(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return run(*self.nsenter(), *args, check=check, **kw)

    def proc(self, component: str) -> str:
        return f"{self.name}/{component}"

    def start(self, component: str, args: list[str], env: dict[str, str] | None = None) -> int:
        """Start ``args`` in the node's namespaces, in its cgroup ``<cgroupRoot>/system``."""
        return start(self.proc(component), [*self.nsenter(), *args], env, cgroup=f"{self.cgroup}/system")

    def stop(self, component: str, **kw) -> None:
        stop(self.proc(component), **kw)

    def restart(self, component: str) -> int:
        return restart(self.proc(component))

    def running(self, component: str) -> bool:
        return running(self.proc(component))

    def logfile(self, component: str) -> Path:
        return logfile(self.proc(component))

    # -- namespaces ----------------------------------------------------------------------------

    def make_netns(self) -> None:
        if not Path(self.netns).exists():
            run("ip", "netns", "add", self.name)
        ipn = ["ip", "-n", self.name]
        run(*ipn, "link", "set", "lo", "up")
        if not Path(f"/sys/class/net/{self.uplink}").exists():
            run("ip", "link", "add", self.uplink, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        run("ip", "link", "set", self.uplink, "master", BRIDGE, "up")
        run(*ipn, "addr", "replace", f"{self.ip}/24", "dev", "eth0")
        run(*ipn, "link", "set", "eth0", "up")
        run(*ipn, "route", "replace", "default", "via", HOST_IP)
        # a stand-in for kube-proxy, for the one Service the node's host-network processes
        # use: in-cluster config (KUBERNETES_SERVICE_HOST) then works as in a pod
        ip, port = KUBERNETES_SERVICE
        rule = [
            "-t",
            "nat",
            "OUTPUT",
            "-d",
            f"{ip}/32",
            "-p",
            "tcp",
            "--dport",
            str(port),
            "-j",
            "DNAT",
            "--to-destination",
            f"{HOST_IP}:{APISERVER_PORT}",
        ]
        iptables = ["nsenter", f"--net={self.netns}", "iptables"]
        if run(*iptables, *rule[:2], "-C", *rule[2:], check=False).returncode != 0:
            run(*iptables, *rule[:2], "-A", *rule[2:])
        self.make_nics()

    def make_nics(self) -> None:
        ipn = ["ip", "-n", self.name]
        have = {link["ifname"] for link in json.loads(run(*ipn, "-j", "link", "show").stdout or "[]")}
        for nic, peer in NICS.items():
            if nic not in have:
                run(*ipn, "link", "add", nic, "type", "veth", "peer", "name", peer)
            mtu = str(JUMBO_MTU if nic == JUMBO_NIC else 1500)
            run(*ipn, "link", "set", nic, "mtu", mtu, "up")
            run(*ipn, "link", "set", peer, "mtu", mtu, "up")

    def make_namespaces(self) -> None:
        """The node's network namespace, then its mount and UTS namespaces (persisted as
        bind mounts of their files under <dir>/ns, a private mount: a mount namespace's file
        may not be bound where propagation would copy it into itself)."""
        self.make_netns()
        ns = p("ns")
        ns.mkdir(parents=True, exist_ok=True)
        if str(ns) not in _mount_points():
            run("mount", "--bind", str(ns), str(ns))
            run("mount", "--make-private", str(ns))
        for f in (self.mnt, self.uts):
            f.touch()
        for path in (*self.private_paths(), "/run"):
            self.host_path(path).mkdir(parents=True, exist_ok=True)
        run(
            "nsenter",
            f"--net={self.netns}",
            "unshare",
            f"--mount={self.mnt}",
            f"--uts={self.uts}",
            "--propagation",
            "private",
            sys.executable,
            str(HERE / "cluster_node.py"),
            "init",
            str(self.root),
            self.name,
            *self.private_paths(),
        )

    def start_init(self) -> None:
        """The node's PID namespace and its init (:func:`pid1`), which mounts the node's /proc;
        everything started in the node afterwards runs in it. Stopping it ends the namespace
        (its every process gets SIGKILL)."""
        self.host_path(INIT_PIDFILE).unlink(missing_ok=True)
        self.start(
            "init",
            [
                "unshare",
                "--pid",
                "--fork",
                "--kill-child",
                sys.executable,
                str(HERE / "cluster_node.py"),
                "pid1",
                INIT_PIDFILE,
            ],
        )
        end = time.monotonic() + 10
        while self.init_pid() is None:
            if time.monotonic() > end or not self.running("init"):
                raise RuntimeError(f"{self.name}: its init did not start; see {self.logfile('init')}")
            time.sleep(0.05)

    def namespace_inodes(self) -> set[tuple[int, int]]:
        out = set()
        pid = self.init_pid()
        if pid is not None and self.running("init"):
            try:
                st = os.stat(f"/proc/{pid}/ns/pid")
                out.add((st.st_dev, st.st_ino))
            except OSError:
                pass
        for f in (self.mnt, self.uts, Path(self.netns)):
            try:
                st = os.stat(f)
            except OSError:
                continue
            if _is_nsfs(f):
                out.add((st.st_dev, st.st_ino))
        return out

    def delete_namespaces(self) -> None:
        """Unmount the namespace files (the namespaces go with their last process) and
        delete the uplink (and with it the node's eth0) if the netns outlives its file."""
        for f in (self.mnt, self.uts):
            if str(f) in _mount_points():
                run("umount", str(f), check=False)
        if Path(self.netns).exists():
            run("ip", "netns", "del", self.name, check=False)
        # the kernel destroys a namespace nobody references any more (and with it the veth
        # pair to the host) asynchronously, soon after
        for _ in range(30):
            if not Path(f"/sys/class/net/{self.uplink}").exists():
                return
            time.sleep(0.1)
        log(
            f"{self.name}: its network namespace is still referenced (a process or a mount elsewhere); "
            f"deleting {self.uplink} and the node's eth0"
        )
        run("ip", "link", "del", self.uplink, check=False)

    # -- the node's files ------------------------------------------------------------------------

    def write_files(self, bins: dict[str, str]) -> None:
        """What a node has on disk before its services start: the reference plugins in
        /opt/cni/bin (as a node's OS package puts them), the kubelet's PKI and kubeconfig
        (:meth:`write_kubelet_files`), the runtime's config. cni-dra's plugin, conflist and
        inventory are the chart's init container's to write."""
        self.populate_cni_bin()
        self.runtime.configure(self, bins)

    def populate_cni_bin(self) -> None:
        """The reference plugins (symlinks to /usr/lib/cni, as ``make install`` makes them):
        host-local, the IPAM of the chart's conflist on this bed."""
        dst = self.host_path("/opt/cni/bin")
        for src in sorted(Path("/usr/lib/cni").iterdir()):
            link = dst / src.name
            if not link.exists() and not link.is_symlink():
                link.symlink_to(src)

    def write_kubelet_files(self, ca: Path, kubeconfig_text: str, serving: tuple[Path, Path]) -> None:
        d = self.host_path("/etc/kubernetes")
        (d / "pki").mkdir(parents=True, exist_ok=True)
        shutil.copy2(ca, d / "pki" / "ca.crt")
        shutil.copy2(serving[0], d / "pki" / "kubelet-serving.crt")
        shutil.copy2(serving[1], d / "pki" / "kubelet-serving.key")
        (d / "kubelet.conf").write_text(kubeconfig_text)
        (d / "kubelet.conf").chmod(0o600)

    # -- services -----------------------------------------------------------------------------

    def start_runtime(self, bins: dict[str, str]) -> None:
        args, env = self.runtime.command(bins)
        self.start(self.runtime.name, args, env)

    def start_kubelet(self, bins: dict[str, str]) -> None:
        """The kubelet with its defaults (root /var/lib/kubelet, ports 10250 and 10248 in the
        node's netns, the node's hostname as its name), cgroupfs under the node's cgroup."""
        cfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup}",
            "containerRuntimeEndpoint": self.runtime.endpoint,
            "failSwapOn": False,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": "/etc/kubernetes/pki/kubelet-serving.crt",
            "tlsPrivateKeyFile": "/etc/kubernetes/pki/kubelet-serving.key",
            "readOnlyPort": 0,
            "resolvConf": "/etc/resolv.conf",
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "registerNode": True,
            "kubeReserved": {},
            "systemReserved": {},
        }
        self.host_path("/var/lib/kubelet/config.yaml").write_text(json.dumps(cfg, indent=1))
        self.start(
            "kubelet",
            [
                f"{bins['kube']}/kubelet",
                "--config=/var/lib/kubelet/config.yaml",
                "--kubeconfig=/etc/kubernetes/kubelet.conf",
                f"--node-ip={self.ip}",
                "--v=2",
            ],
        )

    def agent_registered(self) -> bool:
        """The kubelet's log says it connected to the driver's DRA socket (its last word on it)."""
        f = self.logfile("kubelet")
        lines = (
            [
                ln
                for ln in f.read_text(errors="replace").splitlines()
                if f'driverName="{DRIVER}"' in ln and "connected=" in ln
            ]
            if f.exists()
            else []
        )
        return bool(lines) and "connected=true" in lines[-1]

    def books(self) -> dict:
        """``cni-dra status --json`` run inside the node (its state dir and inventory)."""
        out = self.run(
            NODE_CNI_EXE,
            "status",
            "--state-dir",
            "/var/lib/cni-dra",
            "--inventory",
            "/etc/cni-dra/resourceslice.yaml",
            "--json",
        )
        return json.loads(out.stdout)


# -- host-side helpers -------------------------------------------------------------------------


def _mount_points() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def _is_nsfs(path: Path) -> bool:
    return os.stat(path).st_dev != os.stat(path.parent).st_dev


def make_bridge() -> None:
    if not Path(f"/sys/class/net/{BRIDGE}").exists():
        run("ip", "link", "add", BRIDGE, "type", "bridge")
    run("ip", "addr", "replace", f"{HOST_IP}/24", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")


def delete_bridge() -> None:
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        run("ip", "link", "del", BRIDGE, check=False)


# -- inside the new namespaces --------------------------------------------------------------------


def _sh(*args: str) -> None:
    res = subprocess.run(list(args), capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"node init: {' '.join(args)}: exit {res.returncode}: {res.stderr.strip()}")


def _mountinfo() -> list[tuple[str, str]]:
    """(mount point, fs type) of every mount of this mount namespace, in mount order."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        out.append((fields[4].replace("\\040", " "), fields[fields.index("-") + 1]))
    return out


def init_inside(root: Path, hostname: str, private: list[str]) -> None:
    """Set up a node's new mount (and UTS) namespace; runs inside them, in the node's netns."""
    # 1. the copies of other namespaces' files (the host's named netns, other nodes'
    # namespace files): a node holds no reference to what is not its own
    for mp, fstype in reversed(_mountinfo()):
        if fstype == "nsfs":
            _sh("umount", "-l", mp)
    ns_dir = str(root.parent.parent / "ns")
    if ns_dir in {mp for mp, _ in _mountinfo()}:
        _sh("umount", "-l", ns_dir)
    # 2. a sysfs of this netns (/sys/class/net: the node's links), the cgroup mounts kept
    aside = root / "cgroup-aside"
    aside.mkdir(exist_ok=True)
    _sh("mount", "--rbind", "/sys/fs/cgroup", str(aside))
    _sh("umount", "-l", "/sys")
    _sh("mount", "-t", "sysfs", "sysfs", "/sys")
    _sh("mount", "--move", str(aside), "/sys/fs/cgroup")
    # 3. overlays where the node needs mount points the host may lack
    for d in OVERLAID:
        layer = root / "overlay" / d.strip("/").replace("/", "-")
        upper, work = layer / "upper", layer / "work"
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        _sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={d},upperdir={upper},workdir={work}", d)
    # 4. the node's own directories over the standard paths; /run last (it hides <dir>)
    for path in private:
        Path(path).mkdir(parents=True, exist_ok=True)
        _sh("mount", "--bind", str(root / "fs" / path.lstrip("/")), path)
    _sh("mount", "--bind", str(root / "fs" / "run"), "/run")
    # 5. the node's name and machine id (the kubelet reports it), then / shared within the node
    _sh("hostname", hostname)
    Path("/etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    _sh("mount", "--make-rshared", "/")


def pid1(pidfile: str) -> None:
    """The init of a node's PID namespace (run by ``unshare --pid --fork`` in the node's
    mount, UTS and network namespaces): mounts the node's /proc (this namespace's), writes
    its pid in the host's namespace to ``pidfile`` (a node path), then reaps orphans (the
    runtime's shims re-parent to it) until it is killed."""
    status = Path("/proc/self/status").read_text()
    host_pid = next(line.split()[1] for line in status.splitlines() if line.startswith("NSpid:"))
    _sh("mount", "-t", "proc", "-o", "nosuid,nodev,noexec", "proc", "/proc")
    Path(pidfile).write_text(host_pid)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0]:
                continue
        except ChildProcessError:
            pass
        time.sleep(0.5)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "pid1":
        pid1(sys.argv[2])
    elif len(sys.argv) < 4 or sys.argv[1] != "init":
        raise SystemExit("usage: cluster_node.py init ROOT HOSTNAME PATH... | pid1 PIDFILE")
    else:
        init_inside(Path(sys.argv[2]), sys.argv[3], sys.argv[4:])
