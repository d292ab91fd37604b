"""``cni-dra agent``: the node agent (ResourceSlice publisher, DRA kubelet plugin, claim
status writer, metrics, the plugin's fast path). A thin shell over :mod:`cni_dra.agent.service`;
SIGTERM and SIGINT stop it cleanly. Without Kubernetes (``--no-kubernetes``, or no
kubeconfig outside a cluster) it runs the fast path, the link watch and the metrics only."""

from __future__ import annotations

import logging
import os
import signal
import threading

import click

from cni_dra.cli.options import CONFLIST_OPT, INVENTORY_OPT, STATE_DIR_OPT
from cni_dra.fastpath.wire import DEFAULT_SOCKET

__all__ = ["agent"]


@click.command()
@click.option(
    "--node-name",
    default=None,
    envvar="NODE_NAME",
    help="This node's name (spec.nodeName of the slice); required with Kubernetes.",
)
@click.option(
    "--kubeconfig",
    default=None,
    envvar="KUBECONFIG",
    help="Kubeconfig file (default: the in-cluster service account; neither: no Kubernetes).",
)
@click.option(
    "--no-kubernetes",
    is_flag=True,
    envvar="CNI_DRA_NO_KUBERNETES",
    default=False,
    help="Run without an API server (the fast path, the link watch and the metrics; no ResourceSlice, "
    "no kubelet plugin, no claim status), even with a kubeconfig or in a cluster.",
)
@INVENTORY_OPT
@STATE_DIR_OPT
@CONFLIST_OPT
@click.option(
    "--plugin-dir",
    envvar="CNI_DRA_PLUGIN_DIR",
    default=None,
    help="Directory of the DRA socket [default: /var/lib/kubelet/plugins/<driver>].",
)
@click.option(
    "--registry-dir",
    envvar="CNI_DRA_REGISTRY_DIR",
    default="/var/lib/kubelet/plugins_registry",
    show_default=True,
    help="The kubelet's plugin registration directory.",
)
@click.option(
    "--metrics-address",
    envvar="CNI_DRA_METRICS_ADDRESS",
    default=":9412",
    show_default=True,
    help="HOST:PORT of the Prometheus /metrics endpoint; empty to disable.",
)
@click.option(
    "--resync-interval",
    envvar="CNI_DRA_RESYNC_INTERVAL",
    default=60.0,
    show_default=True,
    type=float,
    help="Seconds between drift checks of the published slice.",
)
@click.option(
    "--cleanup/--no-cleanup",
    envvar="CNI_DRA_CLEANUP",
    default=False,
    show_default=True,
    help="Delete the node's ResourceSlice on exit.",
)
@click.option(
    "--nic-debounce",
    envvar="CNI_DRA_NIC_DEBOUNCE",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds a NIC's link change (down, up, gone) must last before it counts.",
)
@click.option(
    "--taint-effect",
    envvar="CNI_DRA_TAINT_EFFECT",
    default="NoSchedule",
    show_default=True,
    type=click.Choice(["NoSchedule", "NoExecute", "None"]),
    help="Effect of the device taint on an unhealthy NIC (NoExecute also evicts its pods).",
)
@click.option(
    "--keep-missing",
    envvar="CNI_DRA_KEEP_MISSING",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds a vanished NIC stays in the slice, tainted, before it is left out.",
)
@click.option(
    "--health-timeout",
    envvar="CNI_DRA_HEALTH_TIMEOUT",
    default=60,
    show_default=True,
    type=click.IntRange(min=1),
    help="health_check_timeout_seconds told the kubelet (reports are repeated thrice as often).",
)
@click.option(
    "--fastpath-socket",
    envvar="CNI_DRA_AGENT_SOCKET",
    default=DEFAULT_SOCKET,
    show_default=True,
    help="Unix socket on which plugin invocations are served (where the plugin looks).",
)
@click.option(
    "--fastpath-processes",
    envvar="CNI_DRA_FASTPATH_PROCESSES",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Processes serving the fast path (0: one per CPU, at most 4).",
)
@click.option(
    "--fastpath-mount-ns",
    envvar="CNI_DRA_FASTPATH_MOUNT_NS",
    default=None,
    help="In a container: the node's mount namespace (e.g. /proc/1/ns/mnt with hostPID), which the "
    "processes serving the fast path join; the agent process itself then serves none.",
)
@click.option(
    "--fractional-capacity-range",
    "fractional",
    envvar="CNI_DRA_FRACTIONAL_CAPACITY_RANGE",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "on", "off"]),
    help="The cluster's DRAFractionalCapacityRange feature gate, recorded for the plugin's standalone "
    "allocation: auto (the API server's kubernetes_feature_enabled metric; off when it is not "
    "readable), or on/off as given.",
)
@click.option(
    "--log-level",
    envvar="CNI_DRA_LOG_LEVEL",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def agent(
    node_name: str | None,
    kubeconfig: str | None,
    no_kubernetes: bool,
    inventory: str,
    state_dir: str,
    conflists: tuple[str, ...],
    plugin_dir: str | None,
    registry_dir: str,
    metrics_address: str,
    resync_interval: float,
    cleanup: bool,
    nic_debounce: float,
    taint_effect: str,
    keep_missing: float,
    health_timeout: int,
    fastpath_socket: str,
    fastpath_processes: int,
    fastpath_mount_ns: str | None,
    fractional: str,
    log_level: str,
) -> None:
    """Run the node agent until SIGTERM/SIGINT."""
    from cni_dra.agent.service import Agent, AgentConfig, kubernetes_mode

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if kubeconfig:
        kubeconfig = kubeconfig.split(":")[0]
    kubernetes, why = kubernetes_mode(no_kubernetes, kubeconfig, os.environ)
    if kubernetes and not node_name:
        raise click.UsageError(f"--node-name (NODE_NAME) is required with Kubernetes ({why})")
    logging.getLogger("cni_dra.agent").info("%s Kubernetes: %s", "with" if kubernetes else "without", why)
    cfg = AgentConfig(
        node_name=node_name or "",
        inventory=inventory,
        state_dir=state_dir,
        conflists=conflists,
        kubeconfig=kubeconfig if kubernetes else None,
        kubernetes=kubernetes,
        plugin_dir=plugin_dir,
        registry_dir=registry_dir,
        metrics_address=metrics_address,
        resync_s=resync_interval,
        cleanup=cleanup,
        fastpath_socket=fastpath_socket,
        fastpath_processes=fastpath_processes or None,
        fastpath_mount_ns=fastpath_mount_ns,
        nic_debounce_s=nic_debounce,
        taint_effect=taint_effect,
        keep_missing_s=keep_missing,
        health_timeout_s=health_timeout,
        fractional_capacity_range=fractional,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    Agent(cfg).run(stop)
