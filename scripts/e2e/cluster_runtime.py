"""The container runtime of a node of scripts/e2e/cluster.py. A runtime says which of the
node's paths hold its config and state (each node gets its own, bind-mounted over the
standard path inside the node's mount namespace), writes its config there, how it is
started, when it is ready, how the test images get into it, and the CRI endpoint the
kubelet is given. It runs with its default paths, as on a real node.

containerd is the one runtime now; another (CRI-O) is another class with the same
attributes and methods, picked per node (``Node.runtime``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from cluster_procs import ClusterError

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
        BinaryName = "{bins['runc']}"
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
        for tar in ("pause.tar", "sleeper.tar"):
            self.import_image(node, bins, f"{bins['images']}/{tar}")
        listed = self.images(node, bins)
        for image in (SANDBOX_IMAGE, TEST_IMAGE):
            if image not in listed:
                raise ClusterError(f"{node.name}: image {image} not imported into containerd (have: {listed})")
