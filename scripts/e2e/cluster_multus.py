"""Multus (the thin plugin, v4.3.0) as a node's CNI in scripts/e2e/cluster.py
(``CNI_DRA_E2E_MULTUS=1``: the last node; the first keeps cni-dra's conflist as its only
network).

The node's runtime loads the lexicographically first conflist, ``00-multus.conflist``:
Multus, whose ``clusterNetwork`` is ``20-primary.conflist`` (network ``primary``: the reference
ptp with host-local on the node's pod subnet) for every pod's eth0, and which adds the
networks a pod's ``k8s.v1.cni.cncf.io/networks`` annotation names, each a
NetworkAttachmentDefinition (conf/k8s/multus/networks.yaml: cni-dra). cni-dra's own
conflist stays beside them (the agent reads it). Multus reads the pod and the
NetworkAttachmentDefinitions with a kubeconfig (``/etc/cni/net.d/multus.d/``) holding a
token of its own service account (conf/k8s/multus/rbac.yaml) bound to the node's Node.

Thin rather than thick: the thin plugin is one static binary the runtime executes like any
plugin, with nothing running between calls, so it needs no image, no DaemonSet and no
socket; the thick plugin's daemon (a pod with the node's hostPath and a shim) only adds
moving parts to a bed whose images are built locally, and calls the delegates the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from cluster_pki import kubeconfig

if TYPE_CHECKING:
    from cluster_node import Node

CONFLIST = "/etc/cni/net.d/00-multus.conflist"
PRIMARY = "/etc/cni/net.d/20-primary.conflist"
PRIMARY_NETWORK = "primary"
KUBECONFIG = "/etc/cni/net.d/multus.d/multus.kubeconfig"
CACHE_DIR = "/var/lib/cni/multus"
LOG = "/var/log/multus.log"
MANIFESTS = ("crd.yaml", "rbac.yaml")
"""conf/k8s/multus/ files the bed applies (the tests apply networks.yaml and the examples)."""


def write_files(node: Node, bins: dict[str, str]) -> None:
    """The node's Multus conflist, its primary network and the binary in /opt/cni/bin."""
    primary = {
        "cniVersion": "1.0.0",
        "name": PRIMARY_NETWORK,
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": False,
                "mtu": 1500,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.pod_subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }
    multus = {
        "cniVersion": "1.1.0",
        "name": "multus-cni-network",
        "plugins": [
            {
                # a path, not the network's name: given a name, Multus v4.3.0 first looks for a
                # NetworkAttachmentDefinition of it, and on STATUS (no pod) its "not found" event
                # for a nil pod panics (k8sclient.getKubernetesDelegate -> Eventf(nil, ...))
                "type": "multus",
                "kubeconfig": KUBECONFIG,
                "clusterNetwork": PRIMARY,
                "confDir": "/etc/cni/net.d",
                "binDir": "/opt/cni/bin",
                "cniDir": CACHE_DIR,
                "logFile": LOG,
                "logLevel": "verbose",
            }
        ],
    }
    node.host_path(PRIMARY).write_text(json.dumps(primary, indent=1))
    node.host_path(CONFLIST).write_text(json.dumps(multus, indent=1))
    link = node.host_path("/opt/cni/bin/multus")
    if not link.is_symlink():
        link.symlink_to(Path(bins["multus_bin"]) / "multus")


def write_kubeconfig(node: Node, server: str, token: str) -> None:
    """Multus's kubeconfig on the node: ``token`` (the multus service account's, bound to the Node)."""
    path = node.host_path(KUBECONFIG)
    kubeconfig(path, server, user="multus", token=token)
