"""The container runtime of a node of scripts/e2e/cluster.py. A runtime says which of the
node's paths hold its config and state (each node gets its own, bind-mounted over the
standard path inside the node's mount namespace), writes its config there, how it is
started, when it is ready, how the test images get into it, and the CRI endpoint the
kubelet is given. It runs with its default paths, as on a real node.

Two runtimes: :class:`Containerd` (the default) and :class:`Crio`, picked for the whole bed
by ``CNI_DRA_E2E_RUNTIME`` (``containerd`` or ``cri-o``; :func:`from_env`)."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from cluster_procs import DIR, ClusterError

if TYPE_CHECKING:
    from cluster_node import Node

SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"
TEST_IMAGE = "localhost/cni-dra-e2e/sleeper:1"


class Runtime(Protocol):
    name: str
    """The component's name (its log is logs/<node>/<name>.log)."""
    endpoint: str
    """The kubelet's containerRuntimeEndpoint (the runtime's default socket)."""
    private_paths: tuple[str, ...]
    """Node paths of its config and state (its /run part is in the node's own /run)."""

    def configure(self, node: Node, bins: dict[str, str]) -> None: ...

    def command(self, bins: dict[str, str]) -> tuple[list[str], dict[str, str]]: ...

    def ready(self, node: Node) -> bool: ...

    def import_image(self, node: Node, bins: dict[str, str], archive: str) -> None: ...

    def images(self, node: Node, bins: dict[str, str]) -> list[str]: ...

    def load_images(self, node: Node, bins: dict[str, str]) -> None: ...

    def versions(self, bins: dict[str, str]) -> dict[str, list[str]]: ...


class Containerd:
    """containerd 2.1 with runc: every path its default (/etc/containerd/config.toml,
    /var/lib/containerd, /run/containerd, CNI from /etc/cni/net.d and /opt/cni/bin, pod
    netns under /run/netns), only the CRI settings this host needs in its config."""

    name = "containerd"
    socket = "/run/containerd/containerd.sock"
    endpoint = f"unix://{socket}"
    private_paths = ("/etc/containerd", "/var/lib/containerd")
    teardown_phrase = "TearDown network for sandbox"
    """What its log says when it tears a pod's network down (CNI DEL)."""

    def configure(self, node: Node, bins: dict[str, str]) -> None:
        # restrict_oom_score_adj: this host gives no CAP_SYS_RESOURCE; the pause image is
        # built locally (pinned, never pulled); cgroupfs as the kubelet
        config = f"""version = 3

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{bins["runc"]}"
        SystemdCgroup = false

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{SANDBOX_IMAGE}"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
"""
        node.host_path("/etc/containerd/config.toml").write_text(config)

    def command(self, bins: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        path = f"{bins['containerd_bin']}:{Path(bins['runc']).parent}:/usr/sbin:/usr/bin:/sbin:/bin"
        return [f"{bins['containerd_bin']}/containerd"], {"PATH": path}

    def ready(self, node: Node) -> bool:
        return node.host_path(self.socket).is_socket()

    def _ctr(self, bins: dict[str, str]) -> list[str]:
        return [f"{bins['containerd_bin']}/ctr", "-n", "k8s.io"]  # the CRI plugin's namespace

    def import_image(self, node: Node, bins: dict[str, str], archive: str) -> None:
        """An OCI (or docker) archive into the node's containerd, as ``kind load`` does."""
        node.run(*self._ctr(bins), "images", "import", archive)

    def images(self, node: Node, bins: dict[str, str]) -> list[str]:
        return node.run(*self._ctr(bins), "images", "ls", "-q").stdout.split()

    def load_images(self, node: Node, bins: dict[str, str]) -> None:
        _load_test_images(self, node, bins)

    def versions(self, bins: dict[str, str]) -> dict[str, list[str]]:
        return {
            "containerd": [f"{bins['containerd_bin']}/containerd", "--version"],
            "runc": [bins["runc"], "--version"],
        }


def _load_test_images(rt: Runtime, node: Node, bins: dict[str, str]) -> None:
    for tar in ("pause.tar", "sleeper.tar"):
        rt.import_image(node, bins, f"{bins['images']}/{tar}")
    listed = rt.images(node, bins)
    for image in (SANDBOX_IMAGE, TEST_IMAGE):
        if image not in listed:
            raise ClusterError(f"{node.name}: image {image} not imported into {rt.name} (have: {listed})")


def archive_names(archive: str) -> list[str]:
    """The image references an OCI archive's index names (``io.containerd.image.name``, the
    full reference, as scripts/e2e/oci-image and scripts/image write it)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ClusterError(f"{archive}: no index.json (not an OCI archive)")
        index = json.load(member)
    names = [m.get("annotations", {}).get("io.containerd.image.name") for m in index.get("manifests", [])]
    if not names or None in names:
        raise ClusterError(f"{archive}: a manifest without an io.containerd.image.name annotation")
    return names


# Two things of this host that CRI-O does not adapt to, fixed in the bundle's config.json on
# `create` before runc runs:
# - CRI-O gives a pod's infra container oom_score_adj -998 and the kubelet gives Guaranteed
#   pods' containers -997; lowering it needs CAP_SYS_RESOURCE, which this host does not give
#   ("nsexec: failed to update /proc/self/oom_score_adj: Permission denied"). CRI-O has no
#   option like containerd's restrict_oom_score_adj; the wrapper does what that option does:
#   it raises process.oomScoreAdj to its own value.
# - The hugetlb controller is in /proc/cgroups but bound to the cgroup2 hierarchy of this
#   hybrid host (/sys/fs/cgroup/unified), with no v1 hierarchy; CRI-O (internal/config/node,
#   libcontainer's GetAllSubsystems) takes it as present and passes the kubelet's hugepage
#   limits, and runc (cgroup v1 mode) fails: "cannot set hugetlb limit: container could not
#   join or create cgroup". containerd leaves them out; the wrapper drops
#   linux.resources.hugepageLimits.
RUNC_WRAPPER = """#!/bin/sh
# runc {real}, with a create's oomScoreAdj raised to this process's own and its hugepage
# limits dropped (cluster_runtime.py)
for a; do
    if [ "$a" = create ]; then
        /usr/bin/python3 -I -c '
import json, sys
args = sys.argv[1:]
bundle = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--bundle", "-b")), ".")
path = bundle + "/config.json"
spec = json.load(open(path))
own = int(open("/proc/self/oom_score_adj").read())
proc = spec.get("process") or {{}}
changed = (spec.get("linux") or {{}}).get("resources", {{}}).pop("hugepageLimits", None) is not None
if proc.get("oomScoreAdj", own) < own:
    proc["oomScoreAdj"] = own
    changed = True
if changed:
    json.dump(spec, open(path, "w"))
' "$@" || exit 1
        break
    fi
done
exec {real} "$@"
"""


class Crio:
    """CRI-O (v1.36) with conmon and runc: its default paths (/etc/crio/crio.conf,
    /var/lib/containers/storage, /run/containers/storage, /var/lib/crio, /run/crio, CNI
    from /etc/cni/net.d and /opt/cni/bin, pod namespaces under /run), cgroupfs, and only
    what this host needs in its config (scripts/e2e/smoke_crio.py found each of them)."""

    name = "crio"
    socket = "/run/crio/crio.sock"
    endpoint = f"unix://{socket}"
    private_paths = ("/etc/crio", "/etc/containers", "/var/lib/containers", "/var/lib/crio")
    teardown_phrase = "Deleting pod "
    """What its log says when it tears a pod's network down (ocicni, before CNI DEL)."""
    storage = (
        "--root",
        "/var/lib/containers/storage",
        "--runroot",
        "/run/containers/storage",
        "--storage-driver",
        "overlay",
        "--signature-policy",
        "/etc/crio/policy.json",
    )
    status_grace_s = 10
    """``cni_status_grace_period``: CRI-O polls STATUS (every 5 s) only when it is set, and
    reports the network not ready once STATUS has failed for that long."""

    def configure(self, node: Node, bins: dict[str, str]) -> None:
        q = json.dumps  # TOML basic strings are JSON strings
        crio = bins["crio_bin"]
        etc = node.host_path("/etc/crio")
        (etc / "crio.conf.d").mkdir(parents=True, exist_ok=True)
        (etc / "runc-wrapper").write_text(RUNC_WRAPPER.format(real=f"{crio}/runc"))
        (etc / "runc-wrapper").chmod(0o755)
        (etc / "policy.json").write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        # cgroupfs as the kubelet; conmon in the pod's cgroup; the sandbox image is local
        # (pause_command "": its own entrypoint); hooks, CDI, irqbalance, auth paths of
        # the node's own; NRI, metrics and CRIU off
        config = f"""[crio]
storage_driver = "overlay"

[crio.api]
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
pinns_path = {q(f"{crio}/pinns")}
decryption_keys_path = "/etc/crio/keys"
cdi_spec_dirs = ["/etc/cdi", "/run/cdi"]
hooks_dir = ["/etc/containers/oci/hooks.d"]
irqbalance_config_file = "/etc/crio/irqbalance"
irqbalance_config_restore_file = "disable"
enable_criu_support = false
log_level = "info"

[crio.runtime.runtimes.runc]
runtime_path = "/etc/crio/runc-wrapper"
runtime_type = "oci"
runtime_root = "/run/runc"
monitor_path = {q(f"{crio}/conmon")}
monitor_cgroup = "pod"
monitor_env = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]

[crio.image]
pause_image = {q(SANDBOX_IMAGE)}
pause_command = ""
signature_policy = "/etc/crio/policy.json"
namespaced_auth_dir = "/etc/crio/auth"

[crio.network]
network_dir = "/etc/cni/net.d/"
plugin_dirs = ["/opt/cni/bin/"]
cni_status_grace_period = "{self.status_grace_s}s"

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
"""
        (etc / "crio.conf").write_text(config)

    def command(self, bins: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        return [f"{bins['crio_bin']}/crio"], {"PATH": f"{bins['crio_bin']}:/usr/sbin:/usr/bin:/sbin:/bin"}

    def ready(self, node: Node) -> bool:
        return node.host_path(self.socket).is_socket()

    def import_image(self, node: Node, bins: dict[str, str], archive: str) -> None:
        """An OCI archive into the node's CRI-O storage with CRI-O's own ``copyimg`` (its
        containers/storage; no registry), under each name the archive's index gives."""
        for name in archive_names(archive):
            node.run(
                f"{bins['crio_bin']}/copyimg",
                *self.storage,
                "--import-from",
                f"oci-archive:{archive}",
                "--image-name",
                name,
            )

    def images(self, node: Node, bins: dict[str, str]) -> list[str]:
        out = node.run(
            f"{bins['crio_bin']}/crictl", "--runtime-endpoint", self.endpoint, "images", "-o", "json"
        ).stdout
        return [tag for img in json.loads(out).get("images") or [] for tag in img.get("repoTags") or []]

    def load_images(self, node: Node, bins: dict[str, str]) -> None:
        _load_test_images(self, node, bins)

    def versions(self, bins: dict[str, str]) -> dict[str, list[str]]:
        crio = bins["crio_bin"]
        return {
            "cri-o": [f"{crio}/crio", "--version"],
            "conmon": [f"{crio}/conmon", "--version"],
            "runc": [f"{crio}/runc", "--version"],
            "crictl": [f"{crio}/crictl", "--version"],
        }


RUNTIMES = {"containerd": Containerd, "cri-o": Crio}


def from_env() -> Containerd | Crio:
    """The bed's runtime: ``CNI_DRA_E2E_RUNTIME`` (``containerd``, the default, or ``cri-o``);
    unset, the one a bed that is up was brought up with (``<dir>/runtime``), so that
    ``cluster.py status``, ``exec`` and ``down`` need no setting repeated."""
    recorded = DIR / "runtime"
    name = os.environ.get("CNI_DRA_E2E_RUNTIME") or (
        recorded.read_text().strip() if recorded.is_file() else "containerd"
    )
    if name not in RUNTIMES:
        raise ClusterError(f"CNI_DRA_E2E_RUNTIME={name!r}: one of {', '.join(RUNTIMES)}")
    return RUNTIMES[name]()
