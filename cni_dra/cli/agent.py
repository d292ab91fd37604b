"""``cni-dra agent``: the node agent (ResourceSlice publisher, DRA kubelet plugin, claim
status writer, metrics, the plugin's fast path). A thin shell over :mod:`cni_dra.agent.main`;
SIGTERM and SIGINT stop it cleanly."""

from __future__ import annotations

import logging
import signal
import threading

import click

from cni_dra.cli.options import CONFLIST_OPT, INVENTORY_OPT, STATE_DIR_OPT
from cni_dra.fastpath.wire import DEFAULT_SOCKET

__all__ = ["agent"]


@click.command()
@click.option("--node-name", required=True, envvar="NODE_NAME", help="This node's name (spec.nodeName of the slice).")
@click.option("--kubeconfig", default=None, envvar="KUBECONFIG",
              help="Kubeconfig file (default: the in-cluster service account).")
@INVENTORY_OPT
@STATE_DIR_OPT
@CONFLIST_OPT
@click.option("--plugin-dir", envvar="CNI_DRA_PLUGIN_DIR", default=None,
              help="Directory of the DRA socket [default: /var/lib/kubelet/plugins/<driver>].")
@click.option("--registry-dir", envvar="CNI_DRA_REGISTRY_DIR", default="/var/lib/kubelet/plugins_registry",
              show_default=True, help="The kubelet's plugin registration directory.")
@click.option("--metrics-address", envvar="CNI_DRA_METRICS_ADDRESS", default=":9412", show_default=True,
              help="HOST:PORT of the Prometheus /metrics endpoint; empty to disable.")
@click.option("--resync-interval", envvar="CNI_DRA_RESYNC_INTERVAL", default=60.0, show_default=True, type=float,
              help="Seconds between drift checks of the published slice.")
@click.option("--cleanup/--no-cleanup", envvar="CNI_DRA_CLEANUP", default=False, show_default=True,
              help="Delete the node's ResourceSlice on exit.")
@click.option("--fastpath-socket", envvar="CNI_DRA_AGENT_SOCKET", default=DEFAULT_SOCKET, show_default=True,
              help="Unix socket on which plugin invocations are served (where the plugin looks).")
@click.option("--fractional-capacity-range", "fractional", envvar="CNI_DRA_FRACTIONAL_CAPACITY_RANGE",
              default="auto", show_default=True, type=click.Choice(["auto", "on", "off"]),
              help="The cluster's DRAFractionalCapacityRange feature gate, recorded for the plugin's standalone "
                   "allocation: auto (the API server's kubernetes_feature_enabled metric; off when it is not "
                   "readable), or on/off as given.")
@click.option("--log-level", envvar="CNI_DRA_LOG_LEVEL", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def agent(node_name: str, kubeconfig: str | None, inventory: str, state_dir: str, conflists: tuple[str, ...],
          plugin_dir: str | None, registry_dir: str, metrics_address: str, resync_interval: float, cleanup: bool, fastpath_socket: str,
          fractional: str, log_level: str) -> None:
    """Run the node agent until SIGTERM/SIGINT."""
    from cni_dra.agent.main import Agent, AgentConfig

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if kubeconfig:
        kubeconfig = kubeconfig.split(":")[0]
    cfg = AgentConfig(node_name=node_name, inventory=inventory, state_dir=state_dir, conflists=conflists,
                      kubeconfig=kubeconfig,
                      plugin_dir=plugin_dir, registry_dir=registry_dir, metrics_address=metrics_address,
                      resync_s=resync_interval, cleanup=cleanup, fastpath_socket=fastpath_socket,
                      fractional_capacity_range=fractional)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    Agent(cfg).run(stop)
