"""The one netns test bed: a node with stand-in NICs, its inventory, configs, and views.

:class:`NodeBed` holds stand-in NICs (host veth ends made by ``make_parent_nic``) named
as devices of one shared-NIC ResourceSlice (driver :data:`DRIVER`, pool and node ``n`` unless told),
a state dir, a host-local data dir and the inventory file under ``tmp_path``. It builds
network configs (:meth:`NodeBed.conf` for a node's usual config, :meth:`NodeBed.spec_conf`
for any spec version and IPAM kind), runs the installed plugin through
:mod:`netns_tests.runner` on a chosen ``path`` (``"local"``: in-process, ``"agent"``: served by
a fast-path agent, ``None``: as a runtime leaves it), and reads what happened through views
that are independent of the plugin's own report: the state files, the ``status`` CLI, the
host-local files, the kernel (pyroute2).

The conftest fixtures ``make_node``/``node`` build it; ``faults_on`` and ``fastpath_agent``
live there too. Nothing here asserts, except where a helper cannot go on (an agent that
does not start).
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import signal
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from netns_tests.runner import (
    CNI_EXE,
    CNI_PATH,
    cni_dra_cli,
    cni_dra_status,
    run_plugin,
    write_shared_nic_inventory,
)

__all__ = [
    "DRIVER",
    "VERSIONS",
    "RICH_VERSIONS",
    "CHECK_VERSIONS",
    "IPAM_KINDS",
    "SPEC_NODE",
    "NodeBed",
    "pod_args",
    "parent_of",
    "recover",
    "tree_python",
    "start_fastpath_agent",
    "stop_process",
    "addr_flags",
    "links_named",
    "sysctl_in_netns",
    "HOST_PYTHONS",
    "masked_paths",
    "without_host_python",
]

DRIVER = "net.cni-dra.dev"
VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
RICH_VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
"""Versions whose results have ``interfaces``/``ips`` (0.3.0 on)."""
CHECK_VERSIONS = ["0.4.0", "1.0.0", "1.1.0"]
IPAM_KINDS = ["l2", "host-local-v4", "host-local-v6", "host-local-dual", "static"]

V4_SUBNET = "198.51.100.0/24"  # TEST-NET-2
V6_SUBNET = "2001:db8:4::/64"  # documentation prefix
DEMO_POLICY = {"default": "1G", "validRange": {"min": "100M", "step": "100M"}}
"""The demo's requestPolicy; :data:`PLAIN_POLICY` has only the default."""
PLAIN_POLICY = {"default": "1G"}
SPEC_NODE: dict[str, Any] = {
    "numbered": True,
    "request_policy": PLAIN_POLICY,
    "network": "confnet",
    "version": "1.1.0",
}
""":class:`NodeBed` options of the spec-conformance tests (``make_node(nics=N, **SPEC_NODE)``)."""


def pod_args(pod: str) -> str:
    """CNI_ARGS of pod ``pod`` (name ``pod``, UID ``uid-<pod>``, infra container ``c``)."""
    return f"IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID=c;K8S_POD_UID=uid-{pod}"


def _path_env(path: str | None, socket: str | None) -> dict[str, str]:
    """``agent``: CNI_DRA_AGENT=require (never falls back, so a success proves the agent ran
    it); ``local``: CNI_DRA_AGENT=off (in-process); ``None``: nothing (the runtime's default)."""
    if path is None:
        return {}
    if path not in ("local", "agent"):
        raise ValueError(f"path must be 'local' or 'agent', not {path!r}")
    env = {"CNI_DRA_AGENT": "require" if path == "agent" else "off"}
    if socket is not None:
        env["CNI_DRA_AGENT_SOCKET"] = socket
    return env


class NodeBed:
    """Stand-in NICs in an inventory; state, IPAM data and inventory under ``tmp_path``.

    ``nics``: host link names. ``devices``: their device names, in the same order (default
    ``nic-a``, ``nic-b``, ... over the NICs sorted by name; ``numbered``: ``nic-0``, ``nic-1``,
    ... in the given order). ``parents`` maps device →
    NIC; ``nics`` keeps the NICs in device order. ``network`` names the configs' network,
    ``path``/``agent_socket`` pick how :meth:`run` reaches the plugin.
    """

    def __init__(
        self,
        tmp_path: Path,
        nics: list[str],
        *,
        devices: list[str] | None = None,
        bandwidth: str = "10G",
        request_policy: Mapping[str, Any] | None = None,
        network: str = "testnet",
        version: str = "1.0.0",
        path: str | None = None,
        agent_socket: str | None = None,
        make_netns: Any = None,
        numbered: bool = False,
        pool: str = "n",
    ) -> None:
        from cni_dra.quantity import Quantity

        if devices is None and numbered:
            devices = [f"nic-{i}" for i in range(len(nics))]
        if devices is None:
            nics = sorted(nics)
            devices = [f"nic-{c}" for c in "abcdefgh"[: len(nics)]]
        self.tmp = tmp_path
        self.nics = list(nics)
        self.devices = list(devices)
        self.parents = dict(zip(self.devices, self.nics, strict=True))
        self.state_dir = tmp_path / "state"
        self.ipam_dir = tmp_path / "ipam"
        self.inventory = tmp_path / "slice.json"
        self.capacity = Quantity.parse(bandwidth)
        self.network = network
        self.version = version
        self.path = path
        self.socket = agent_socket
        self.make_netns = make_netns
        self.pool = pool
        write_shared_nic_inventory(
            self.inventory,
            self.parents,
            bandwidth,
            DRIVER,
            request_policy=dict(request_policy or DEMO_POLICY),
            pool=pool,
        )

    # -- configs -------------------------------------------------------------------------
    def ipam(self, kind: str) -> dict[str, Any]:
        """The ``ipam`` object for ``kind``: one of :data:`IPAM_KINDS`, ``static-rc`` (addresses
        from runtimeConfig) or ``host-local`` (one v4 range, no routes)."""
        data = str(self.ipam_dir)
        if kind == "l2":
            return {}
        if kind == "host-local":
            return {"type": "host-local", "dataDir": data, "ranges": [[{"subnet": V4_SUBNET}]]}
        if kind == "host-local-v4":
            return {
                "type": "host-local",
                "dataDir": data,
                "ranges": [[{"subnet": V4_SUBNET}]],
                "routes": [{"dst": "203.0.113.0/24"}],
            }
        if kind == "host-local-v6":
            return {
                "type": "host-local",
                "dataDir": data,
                "ranges": [[{"subnet": V6_SUBNET, "gateway": "2001:db8:4::1"}]],
            }
        if kind == "host-local-dual":
            return {
                "type": "host-local",
                "dataDir": data,
                "ranges": [[{"subnet": V4_SUBNET}], [{"subnet": V6_SUBNET}]],
            }
        if kind == "static":
            return {
                "type": "static",
                "addresses": [{"address": "198.51.100.77/24", "gateway": "198.51.100.1"}],
                "routes": [{"dst": "203.0.113.0/24", "gw": "198.51.100.1"}],
            }
        if kind == "static-rc":
            return {"type": "static"}
        raise ValueError(kind)

    def _conf(
        self,
        version: str,
        ipam: str | dict[str, Any],
        name: str,
        bandwidth: str | None,
        kw: Mapping[str, Any],
    ) -> dict[str, Any]:
        c: dict[str, Any] = {
            "cniVersion": version,
            "name": name,
            "type": "cni-dra",
            "stateDir": str(self.state_dir),
            "inventory": str(self.inventory),
        }
        ipam_obj = ipam if isinstance(ipam, dict) else self.ipam(ipam)
        if ipam_obj:
            c["ipam"] = ipam_obj
        if bandwidth:
            c["capacity"] = {"requests": {"bandwidth": bandwidth}}
        c.update(kw)
        return c

    def conf(self, bandwidth: str | None = "1G", *, version: str | None = None, **kw: Any) -> dict[str, Any]:
        """The node's network (one host-local v4 range) asking ``bandwidth`` (None: no request)."""
        return self._conf(version or self.version, "host-local", self.network, bandwidth, kw)

    def spec_conf(
        self,
        version: str = "1.1.0",
        ipam: str | dict[str, Any] = "host-local-v4",
        name: str | None = None,
        **kw: Any,
    ) -> dict[str, Any]:
        """A config of spec ``version`` with IPAM ``ipam`` (a kind of :meth:`ipam`, or the object), asking 1G."""
        return self._conf(version, ipam, name or self.network, "1G", kw)

    # -- running the plugin --------------------------------------------------------------
    def env(self, path: str | None = None) -> dict[str, str]:
        """The variables that send an invocation down ``path`` (default: the bed's)."""
        return _path_env(path or self.path, self.socket)

    def run(
        self,
        command: str,
        conf: dict[str, Any] | None = None,
        netns: str = "",
        cid: str = "",
        ifname: str = "eth0",
        cni_args: str | None = None,
        *,
        path: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        **kw: Any,
    ) -> tuple[int, dict[str, Any] | None, str]:
        """One verb as a runtime runs it (``conf`` default :meth:`conf`, ``cid`` default random,
        CNI_ARGS default a pod whose UID is the container ID); returns ``(code, json, stderr)``."""
        cid = cid or uuid.uuid4().hex[:12]
        args = (
            cni_args
            if cni_args is not None
            else f"IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID={cid}"
        )
        env = {**self.env(path), **(extra_env or {})}
        return run_plugin(
            command,
            conf if conf is not None else self.conf(),
            container_id=cid,
            netns=netns,
            ifname=ifname,
            cni_args=args,
            extra_env=env or None,
            **kw,
        )

    def add(
        self,
        netns: str,
        cid: str,
        conf: dict[str, Any] | None = None,
        ifname: str = "eth0",
        fault: str | None = None,
    ) -> tuple[int, dict[str, Any] | None, str]:
        """ADD for pod ``cid`` (:func:`pod_args`); ``fault`` kills the in-process plugin at that step."""
        return self._verb("ADD", netns, cid, conf, ifname, fault)

    def delete(
        self,
        netns: str,
        cid: str,
        conf: dict[str, Any] | None = None,
        ifname: str = "eth0",
        fault: str | None = None,
    ) -> tuple[int, dict[str, Any] | None, str]:
        """DEL for pod ``cid`` (:func:`pod_args`); ``fault`` as for :meth:`add`."""
        return self._verb("DEL", netns, cid, conf, ifname, fault)

    def _verb(
        self, command: str, netns: str, cid: str, conf: dict[str, Any] | None, ifname: str, fault: str | None
    ) -> tuple[int, dict[str, Any] | None, str]:
        # In-process (not in a resident agent): the fault must kill the plugin process itself.
        env = {"CNI_DRA_FAULT": fault, "CNI_DRA_AGENT": "off"} if fault else None
        return run_plugin(
            command,
            conf or self.conf(),
            container_id=cid,
            netns=netns,
            ifname=ifname,
            cni_args=pod_args(cid),
            extra_env=env,
        )

    # -- independent views ---------------------------------------------------------------
    def state(self) -> Any:
        """The NodeState a new process reads (snapshot + journal)."""
        from cni_dra.state.store import StateStore

        return StateStore(self.state_dir).read_files()

    def state_doc(self) -> dict[str, Any]:
        """:meth:`state` as JSON-shaped data."""
        return self.state().model_dump(mode="json")

    def phases(self) -> dict[str, str]:
        """containerID → phase, from the state files."""
        return {a.containerID: a.phase for a in self.state().attachments}

    def consumed(self) -> dict[str, Any]:
        """device → {capacity name: Quantity}, from the state files."""
        from cni_dra.state.ledger import node_usage

        return node_usage(self.state(), DRIVER, self.pool).consumed

    def consumed_with_inventory(self) -> dict[str, Any]:
        """As ADD counts: a record without amounts holds its inventory device whole."""
        from cni_dra.dra.inventory import load_inventory
        from cni_dra.state.ledger import node_usage

        devices = {d.name: d for d in load_inventory(str(self.inventory)).spec.devices}
        return node_usage(self.state(), DRIVER, self.pool, devices).consumed

    def status(self) -> dict[str, Any]:
        """``cni-dra status --json`` (the operator's view)."""
        return cni_dra_status(self.state_dir, self.inventory)

    def reported_consumed(self) -> dict[str, str]:
        """device → consumed bandwidth as ``status`` prints it."""
        return {d["name"]: d["consumed"]["bandwidth"] for d in self.status()["devices"]}

    def attachments(self) -> list[tuple[str, str]]:
        """(containerID, ifname) of each attachment ``status`` lists, sorted."""
        return sorted((a["containerID"], a["ifname"]) for a in self.status()["attachments"])

    def ip_holders(self, network: str | None = None) -> dict[str, str]:
        """host-local reservations of ``network``: IP → container ID (the file's first line)."""
        d = self.ipam_dir / (network or self.network)
        if not d.exists():
            return {}
        return {p.name: p.read_text().splitlines()[0] for p in d.iterdir() if p.name[0].isdigit()}

    def ipam_reservations(self, network: str | None = None) -> list[str]:
        """Addresses host-local holds for ``network`` (its file names), sorted."""
        d = self.ipam_dir / (network or self.network)
        if not d.exists():
            return []
        return sorted(p.name for p in d.iterdir() if p.name[0].isdigit() or ":" in p.name)

    # -- changing the node behind the plugin's back ---------------------------------------
    def write_state(self, state: Any) -> None:
        """Replace the snapshot with ``state`` (as an older or a damaged plugin left it)."""
        from cni_dra.state.store import encode_state

        (self.state_dir / "state.json").write_bytes(encode_state(state))

    def age_attachments(self, seconds: float = 3600.0) -> None:
        """Move every attachment's ``readyAt`` ``seconds`` back, as if the runtime's GC came
        that long after the ADD (GC spares attachments that became ready moments ago). A
        transaction of the state store, as a cni-dra process would make it."""
        import time

        from cni_dra.state import StateStore
        from cni_dra.state.schema import ready_at

        with StateStore(self.state_dir).transaction() as txn:
            for att in list(txn.attachments):
                age_s = att.ready_age_s(time.time())
                txn.update(att, readyAt=ready_at(time.time() - (age_s or 0.0) - seconds))


def recover(node: NodeBed) -> tuple[int, dict[str, Any]]:
    """``cni-dra state recover --json`` on the node's state: (exit code, report)."""
    proc = cni_dra_cli(
        "state", "recover", "--state-dir", str(node.state_dir), "--cni-path", CNI_PATH, "--json"
    )
    return proc.returncode, json.loads(proc.stdout or "{}")


def repair(node: NodeBed, *extra: str) -> tuple[int, str, str]:
    """``cni-dra state repair`` on the node's state and inventory (``extra``: more options,
    e.g. ``--json``): (exit code, stdout, stderr)."""
    proc = cni_dra_cli(
        "state",
        "repair",
        "--state-dir",
        str(node.state_dir),
        "--inventory",
        str(node.inventory),
        "--cni-path",
        CNI_PATH,
        *extra,
    )
    return proc.returncode, proc.stdout, proc.stderr


def parent_of(netns: str, ifname: str = "eth0") -> str | None:
    """Host name of the parent of ``ifname`` in ``netns`` (None: no such link or parent)."""
    from cni_dra.netlink.info import host_link_by_index, link_in_netns

    link = link_in_netns(netns, ifname)
    if link is None:
        return None
    parent = host_link_by_index(link.parent_index)
    return parent.name if parent else None


# -- the fast-path agent ---------------------------------------------------------------------
def tree_python() -> list[str]:
    """The command that starts the installed plugin tree's Python (README "Install layout"):
    its loader with its libraries, then its interpreter; the tree is ``cni-dra.d`` beside the
    real file of CNI_EXE, where the compiled client finds it."""
    tree = Path(CNI_EXE).resolve().parent / "cni-dra.d"
    return [
        str(tree / "lib" / "ld-linux-x86-64.so.2"),
        "--library-path",
        str(tree / "lib"),
        str(tree / "bin" / "python3"),
    ]


def start_fastpath_agent(
    sock: str, *extra: str, env: Mapping[str, str] | None = None, launcher: str | None = None
) -> subprocess.Popen[bytes]:
    """``python -I -m cni_dra.fastpath.server --socket SOCK`` with the installed tree's Python
    (:func:`tree_python`), once it printed ``ready``; ``extra`` are more server options, ``env``
    more variables, ``launcher`` runs instead of the tree's loader with the same arguments
    (e.g. :func:`without_host_python` of it)."""
    argv = tree_python()
    if launcher is not None:
        argv[0] = launcher
    proc = subprocess.Popen(
        [*argv, "-I", "-m", "cni_dra.fastpath.server", "--socket", sock, "--cwd", os.getcwd(), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
        env={**os.environ, **env} if env is not None else None,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("ready"):
        proc.kill()
        proc.wait()
        err = proc.stderr.read().decode() if proc.stderr else ""
        stop_process(proc)
        raise RuntimeError(f"agent did not start (is this work tree installed? make install): {line!r} {err}")
    return proc


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s; closes its pipes."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()


# -- kernel views ----------------------------------------------------------------------------
def links_named(netns: str | None = None) -> list[tuple[str, str | None]]:
    """(name, kind) of every link in ``netns`` (None: the host)."""
    from pyroute2 import IPRoute

    kw = {"netns": netns} if netns else {}
    with IPRoute(**kw) as ipr:
        out = []
        for msg in ipr.link("dump"):
            info = msg.get_attr("IFLA_LINKINFO")
            out.append(
                (msg.get_attr("IFLA_IFNAME"), info.get_attr("IFLA_INFO_KIND") if info is not None else None)
            )
    return out


def addr_flags(netns: str, ifname: str) -> dict[str, int]:
    """CIDR -> IFA flags (IFA_FLAGS, else ifa_flags) of each IPv6 address of ``ifname``."""
    import ipaddress

    from pyroute2 import IPRoute

    with IPRoute(netns=netns) as ipr:
        (idx,) = ipr.link_lookup(ifname=ifname)
        out = {}
        for msg in ipr.addr("dump", index=idx, family=10):
            cidr = str(ipaddress.ip_interface(f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}"))
            out[cidr] = msg.get_attr("IFA_FLAGS") or msg["flags"]
    return out


def sysctl_in_netns(netns: str, key: str) -> str:
    """Read ``/proc/sys/<key>`` inside ``netns`` (via a child process that enters it)."""
    proc = subprocess.run(
        ["nsenter", f"--net={netns}", "cat", f"/proc/sys/{key}"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"reading {key} in {netns} failed: {proc.stderr}")
    return proc.stdout.strip()


# -- a node without Python ----------------------------------------------------------------
HOST_PYTHONS = ("/usr/bin/python3*", "/usr/lib/python3*", "/usr/local", "/root/.pyenv", "/opt/cni-dra*/venv*")
"""Every Python of this machine (Debian's, pyenv's, anything under /usr/local, the project's
venvs), as globs: :func:`without_host_python` masks each."""
HOST_LIB_DIR = "/usr/lib/x86_64-linux-gnu"
GLIBC = ("ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")
"""glibc's files, which the host's own tools (sh, mount, the IPAM plugins) need: never masked."""


def masked_paths() -> list[str]:
    """What :func:`without_host_python` masks, sorted: the paths of :data:`HOST_PYTHONS` on
    this machine, and the host's copy of every library the installed tree brings besides
    glibc (libz, libexpat, libssl, ...: a host without Python need not have them)."""
    found = {path for pattern in HOST_PYTHONS for path in glob.glob(pattern)}
    tree_lib = Path(tree_python()[2])
    for lib in tree_lib.iterdir():
        if lib.is_file() and lib.name not in GLIBC and os.path.exists(f"{HOST_LIB_DIR}/{lib.name}"):
            found.add(f"{HOST_LIB_DIR}/{lib.name}")
    return sorted(found)


def without_host_python(tmp_path: Path, exe: str) -> Path:
    """An executable (``tmp_path/masked-<name>``) that runs ``exe`` with the same argv,
    environment and stdin in a private mount namespace (``unshare --mount --propagation
    private``) where every path of :func:`masked_paths` is masked: an empty tmpfs over each
    directory, an empty file over each file. The mounts die with the process; the host's
    mount table never sees them."""
    empty = tmp_path / "masked-empty"
    empty.write_bytes(b"")
    steps = []
    for path in masked_paths():
        if os.path.isdir(path):
            steps.append(f"mount -t tmpfs -o size=64k,mode=0755 masked {shlex.quote(path)}")
        else:
            steps.append(f"mount --bind {shlex.quote(str(empty))} {shlex.quote(path)}")
    script = "; ".join([*steps, 'exec "$0" "$@"'])
    wrapper = tmp_path / f"masked-{os.path.basename(exe)}"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'exec unshare --mount --propagation private /bin/sh -ec {shlex.quote(script)} {shlex.quote(exe)} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper
