"""The agent's main loop: one long-running process per node (``cni-dra agent``).

Parts (each a service with ``start()``/``stop()``):

* the metrics HTTP server (:class:`cni_dra.agent.metrics.AgentMetrics`), when an address is set;
* the DRA kubelet plugin (:class:`cni_dra.k8s.kubelet_plugin.KubeletPlugin`) with
  :class:`cni_dra.agent.driver.ClaimDriver` behind it;
* the link watch (:class:`cni_dra.agent.linkwatch.LinkWatch`), which asks for a publish
  and a new reading of the NICs' health (:class:`cni_dra.agent.nichealth.NicHealth`);
* the claim watch (:class:`cni_dra.agent.claimwatch.ClaimWatch`), which gives the pods
  that share a prepared claim (``status.reservedFor``) their copy in the node state;
* the fast path (:class:`cni_dra.agent.fastpath.FastpathService`): plugin invocations served
  on ``fastpath_socket`` from the agent's warm imports;
* the cluster's allocation semantics (:class:`cni_dra.agent.gate_probe.FeatureSync`): the
  ``DRAFractionalCapacityRange`` gate, recorded for the plugin at start and every
  ``features_interval_s`` (failures retried after 30 s);
* any extra services the caller passes.

The loop publishes the ResourceSlice at start, after link events (debounced) and every
``resync_s`` (drift: someone else changed or deleted the slice), retrying failures with
backoff; and runs the claim status writer whenever the state file changes or a retry is
due. It reads the NICs' health after every link event, when a pending change's
``nic_debounce_s`` ends or a missing NIC's ``keep_missing_s`` runs out, and at every
publish; a health transition publishes at once (taints), hands the kubelet's health
stream a new report and re-runs the status writer (``Ready`` conditions). Everything the agent must not forget is in the node state file, so a restart (or a
crash) loses nothing: prepared claims stay prepared and pending status records are
written by the next agent. On exit it stops the services and, with ``cleanup``, deletes
the node's slice.

Without Kubernetes (:func:`kubernetes_mode`: ``--no-kubernetes``, or no kubeconfig outside
a cluster) only the metrics, the link watch with the NICs' health (read at events and every
``resync_s``) and the fast path run; ``--fractional-capacity-range on|off`` is recorded
once. Started by systemd, the fast path serves on the socket systemd owns
(``conf/systemd/``, :mod:`cni_dra.fastpath.activation`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from cni_dra.errors import CniError
from cni_dra.fastpath.wire import DEFAULT_SOCKET

if TYPE_CHECKING:
    from cni_dra.agent.claimwatch import ClaimWatch
    from cni_dra.agent.driver import ClaimDriver
    from cni_dra.agent.nichealth import NicStatus
    from cni_dra.agent.publisher import Publisher
    from cni_dra.agent.status_writer import StatusWriter
    from cni_dra.k8s.api import KubeApi
    from cni_dra.k8s.dra_health import HealthFeed
    from cni_dra.k8s.kubelet_plugin import KubeletPlugin

__all__ = ["AgentConfig", "Agent", "KubeParts", "Service", "kubernetes_mode"]

log = logging.getLogger("cni_dra.agent")


class Service(Protocol):
    """What the agent starts after the metrics server and stops, in reverse, on shutdown."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class AgentConfig:
    """Settings of one agent (the CLI options of ``cni-dra agent``)."""

    node_name: str
    inventory: str
    state_dir: str
    kubeconfig: str | None = None
    kubernetes: bool = (
        True  # False: no API server (the fast path, the link watch, the metrics; kubernetes_mode)
    )
    conflists: tuple[str, ...] = ()  # whose cni-dra entries' 'profiles' limit device profiles at prepare
    plugin_dir: str | None = None  # default /var/lib/kubelet/plugins/<driver>
    registry_dir: str = "/var/lib/kubelet/plugins_registry"
    metrics_address: str = ""  # HOST:PORT; empty: no metrics server
    resync_s: float = 60.0
    link_debounce_s: float = 0.5  # link events are coalesced for this long before a publish
    nic_debounce_s: float = 5.0  # a NIC health change must last this long to count
    keep_missing_s: float = 300.0  # a vanished NIC stays in the slice, tainted, this long
    taint_effect: str = "NoSchedule"  # of the health taint: NoSchedule, NoExecute or None
    health_timeout_s: int = 60  # health_check_timeout_seconds told the kubelet
    poll_s: float = 0.2
    cleanup: bool = False
    fastpath_socket: str = DEFAULT_SOCKET  # where plugin invocations are served
    fastpath_processes: int | None = None  # accepting processes; None: one per CPU, at most 4
    fastpath_mount_ns: str | None = None  # in a container: the node's mount namespace, which they join
    fractional_capacity_range: str = "auto"  # auto | on | off (cni_dra.agent.gate_probe)
    features_interval_s: float = 600.0  # how often the API server is asked (auto)
    extra: list[Service] = field(default_factory=list)  # more services to run


@dataclass
class KubeParts:
    """The parts of an agent that talk to Kubernetes (absent without it)."""

    api: KubeApi
    publisher: Publisher
    driver: ClaimDriver
    plugin: KubeletPlugin
    health_feed: HealthFeed
    status: StatusWriter
    claimwatch: ClaimWatch


def kubernetes_mode(
    no_kubernetes: bool, kubeconfig: str | None, environ: Mapping[str, str]
) -> tuple[bool, str]:
    """Whether ``cni-dra agent`` talks to Kubernetes, and why: not with ``--no-kubernetes``;
    else with a kubeconfig, or in a pod (``KUBERNETES_SERVICE_HOST``, the in-cluster
    service account); else not (a host with containerd and nerdctl, or podman)."""
    if no_kubernetes:
        return False, "--no-kubernetes"
    if kubeconfig:
        return True, f"kubeconfig {kubeconfig}"
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return True, "in-cluster service account"
    return False, "no kubeconfig and not in a cluster (KUBERNETES_SERVICE_HOST unset)"


class Agent:
    """Wire the parts for ``cfg``; ``api`` (a :class:`cni_dra.k8s.api.KubeApi`) for tests.

    Without Kubernetes (``cfg.kubernetes`` false) it runs only the fast path, the link watch
    with the NICs' health, and the metrics: no ResourceSlice, no kubelet plugin, no claim
    status, and nothing of :mod:`cni_dra.k8s` is imported (no API server is ever asked).
    """

    def __init__(self, cfg: AgentConfig, api: KubeApi | None = None) -> None:
        from cni_dra.agent.fastpath import FastpathService
        from cni_dra.agent.gate_probe import FeatureSync
        from cni_dra.agent.linkwatch import LinkWatch
        from cni_dra.agent.metrics import AgentMetrics
        from cni_dra.agent.nichealth import NicHealth
        from cni_dra.dra.inventory import load_inventory
        from cni_dra.netlink.info import host_link

        self.cfg = cfg
        self.driver_name = load_inventory(cfg.inventory).spec.driver  # a bad inventory fails first
        self.metrics = AgentMetrics(cfg.state_dir, cfg.inventory)
        self.pool = ""
        self.nics = NicHealth(
            self._inventory_nics,
            host_link,
            debounce_s=cfg.nic_debounce_s,
            keep_missing_s=cfg.keep_missing_s,
            on_transition=self._nic_transition,
        )
        self.kube = self._kube_parts(api) if cfg.kubernetes else None
        self.features: FeatureSync | None = None
        if self.kube is not None:
            self.features = FeatureSync(self.kube.api, cfg.state_dir, cfg.fractional_capacity_range)
        elif cfg.fractional_capacity_range != "auto":  # the operator's word, recorded once
            self.features = FeatureSync(None, cfg.state_dir, cfg.fractional_capacity_range)
        self.links_changed = threading.Event()
        self.linkwatch = LinkWatch(self.links_changed.set)
        self.fastpath = FastpathService(
            cfg.fastpath_socket, processes=cfg.fastpath_processes, mount_ns=cfg.fastpath_mount_ns
        )
        if self.kube is not None:
            self.services: list[Service] = [
                self.kube.plugin,
                self.linkwatch,
                self.kube.claimwatch,
                self.fastpath,
                *cfg.extra,
            ]
        else:
            self.services = [self.linkwatch, self.fastpath, *cfg.extra]
        self.metrics_port: int | None = None
        self._started: list[Service] = []

    def _kube_parts(self, api: KubeApi | None) -> KubeParts:
        from cni_dra.agent.claimwatch import ClaimWatch
        from cni_dra.agent.driver import ClaimDriver
        from cni_dra.agent.publisher import Publisher
        from cni_dra.agent.status_writer import StatusWriter
        from cni_dra.dra.inventory import load_inventory, slice_to_dict
        from cni_dra.k8s.api import KubeApi
        from cni_dra.k8s.dra_health import HealthFeed
        from cni_dra.k8s.kubelet_plugin import KubeletPlugin
        from cni_dra.netlink.info import host_link
        from cni_dra.protocol.profile import load_limits
        from cni_dra.state import StateStore
        from cni_dra.state.preparing import share_prepared_claim

        cfg = self.cfg
        api = api if api is not None else KubeApi.from_config(cfg.kubeconfig)
        health_feed = HealthFeed(timeout_s=cfg.health_timeout_s)
        claimwatch = ClaimWatch(api, lambda uid, pods: share_prepared_claim(cfg.state_dir, uid, pods))
        driver = ClaimDriver(
            api,
            state_dir=cfg.state_dir,
            driver_name=self.driver_name,
            inventory=lambda: load_inventory(cfg.inventory),
            limits=lambda: load_limits(cfg.conflists),
            observe=self.metrics.observe,
            stored=claimwatch.catch_up,
        )
        return KubeParts(
            api=api,
            publisher=Publisher(
                api,
                node_name=cfg.node_name,
                inventory=lambda: slice_to_dict(load_inventory(cfg.inventory)),
                link=host_link,
                health=self.nics.statuses,
                taint_effect=cfg.taint_effect,
                on_result=self.metrics.published,
            ),
            driver=driver,
            plugin=KubeletPlugin(
                self.driver_name,
                driver,
                plugin_dir=cfg.plugin_dir,
                registry_dir=cfg.registry_dir,
                health=health_feed,
            ),
            health_feed=health_feed,
            status=StatusWriter(
                api,
                StateStore(cfg.state_dir),
                field_manager=self.driver_name,
                count=self.metrics.status_update,
                health=lambda: {
                    (self.driver_name, self.pool, d): st for d, st in self.nics.statuses().items()
                },
            ),
            claimwatch=claimwatch,
        )

    def _k8s(self) -> KubeParts:
        if self.kube is None:
            raise RuntimeError("the agent runs without Kubernetes")
        return self.kube

    @property
    def api(self) -> KubeApi:
        return self._k8s().api

    @property
    def publisher(self) -> Publisher:
        return self._k8s().publisher

    @property
    def driver(self) -> ClaimDriver:
        return self._k8s().driver

    @property
    def plugin(self) -> KubeletPlugin:
        return self._k8s().plugin

    @property
    def health_feed(self) -> HealthFeed:
        return self._k8s().health_feed

    @property
    def status(self) -> StatusWriter:
        return self._k8s().status

    @property
    def claimwatch(self) -> ClaimWatch:
        return self._k8s().claimwatch

    def _inventory_nics(self) -> list[tuple[str, str]]:
        """(device, ifName) of every inventory device; remembers the pool name."""
        from cni_dra.dra.inventory import load_inventory
        from cni_dra.dra.objects import device_attribute

        inv = load_inventory(self.cfg.inventory)
        self.pool = inv.spec.pool.name
        return [
            (d.name, str(device_attribute(d, "ifName", inv.spec.driver) or d.name)) for d in inv.spec.devices
        ]

    def _nic_transition(self, status: NicStatus, first: bool) -> None:
        self.metrics.link_state(status.device, status.ifname, status.problem, transition=not first)

    def observe_nics(self) -> bool:
        """Read the NICs' health; hand the kubelet the report. True when a state took
        effect (then the slice and the claim statuses are due). A failure is logged."""
        from cni_dra.agent.nichealth import health_reports

        try:
            changed = self.nics.observe()
        except CniError as exc:
            log.warning("failed to read NIC health: %s %s", exc.msg, exc.details)
            return False
        if self.kube is not None:
            self.kube.health_feed.publish(health_reports(self.pool, self.nics.statuses()))
        return bool(changed)

    def start(self) -> None:
        """Start the metrics server and every service. Raises CniError subclasses."""
        if self.cfg.metrics_address:
            self.metrics_port = self.metrics.serve(self.cfg.metrics_address)
            log.info("metrics on %s (port %d)", self.cfg.metrics_address, self.metrics_port)
        if self.kube is None:
            log.info(
                "running without Kubernetes: serving the fast path on %s, the link watch and the metrics; "
                "no ResourceSlice, no kubelet plugin, no claim status",
                self.cfg.fastpath_socket,
            )
        self.observe_nics()  # the kubelet's first health report is ready when it connects
        for svc in self.services:
            svc.start()
            self._started.append(svc)

    def shutdown(self) -> None:
        """Stop services in reverse order; with ``cleanup`` delete the node's slice."""
        for svc in reversed(self._started):
            try:
                svc.stop()
            except Exception as exc:  # noqa: BLE001 - stop the others too
                log.error("failed to stop %s: %s", type(svc).__name__, exc)
        self._started.clear()
        self.metrics.stop()
        if self.kube is None:
            return
        if self.cfg.cleanup:
            try:
                if self.kube.publisher.cleanup():
                    log.info("deleted slice %s", self.kube.publisher.name)
            except CniError as exc:
                log.error("failed to delete the node's slice: %s %s", exc.msg, exc.details)
        self.kube.api.close()

    def run(self, stop: threading.Event) -> None:
        """Start, loop until ``stop`` is set, shut down (always)."""
        try:
            self.start()
            self._loop(stop)
        finally:
            self.shutdown()

    def _state_stamp(self) -> object:
        from cni_dra.state import StateStore

        return StateStore(self.cfg.state_dir).change_stamp()  # snapshot and journal

    def _loop(self, stop: threading.Event) -> None:
        next_publish = 0.0
        next_features = 0.0
        publish_failures = 0
        stamp: object = object()  # forces a first status pass (records left while we were down)
        status_due: float | None = None
        while not stop.is_set():
            now = time.monotonic()
            nic_due = self.nics.next_due()
            links_changed = self.links_changed.is_set()
            if links_changed:
                self.links_changed.clear()
                next_publish = min(next_publish, now + self.cfg.link_debounce_s)
            nic_due_now = nic_due is not None and now >= nic_due  # a debounce ends, a missing NIC goes
            if links_changed or nic_due_now or now >= next_publish:
                changed = self.observe_nics()
                if changed:
                    stamp = object()  # claim conditions: the status pass below
                if changed or nic_due_now:
                    next_publish = now  # taints (or a dropped NIC) now
            if self.kube is None and now >= next_publish:
                next_publish = now + self.cfg.resync_s  # the NICs' health, read again then
            elif now >= next_publish and self.kube is not None:
                try:
                    self.kube.publisher.sync()
                    publish_failures = 0
                    next_publish = now + self.cfg.resync_s
                except CniError as exc:
                    publish_failures += 1
                    delay = min(0.5 * 2 ** (publish_failures - 1), 30.0)
                    log.warning("publish failed (retry in %.1fs): %s %s", delay, exc.msg, exc.details)
                    next_publish = now + delay
            if self.features is not None and now >= next_features:
                try:
                    self.features.sync()
                    next_features = now + (
                        self.cfg.features_interval_s if self.kube is not None else float("inf")
                    )
                except CniError as exc:
                    log.warning("cluster features (retry in 30s): %s %s", exc.msg, exc.details)
                    next_features = now + 30.0
            if self.kube is None:
                stop.wait(self.cfg.poll_s)
                continue
            new_stamp = self._state_stamp()
            if new_stamp != stamp or (status_due is not None and now >= status_due):
                stamp = new_stamp
                try:
                    wait = self.kube.status.sync()
                    status_due = None if wait is None else time.monotonic() + wait
                except CniError as exc:
                    log.warning("status writer: %s", exc.msg)
                    status_due = time.monotonic() + 1.0
            stop.wait(self.cfg.poll_s)
