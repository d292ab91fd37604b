"""Prometheus metrics of the node (prometheus-client is imported only here).

Node gauges, read from the inventory and the node state at each scrape (so they are
right after an agent restart and for nodes without the agent):

* ``cni_dra_device_capacity{device,ifname,resource}``: a NIC's capacity (``bandwidth``
  in bits per second);
* ``cni_dra_device_consumed{...}``: charged by attachments and prepared claims;
* ``cni_dra_device_remaining{...}``: capacity - consumed;
* ``cni_dra_attachments{device,phase}``: attachments per device and phase (adding, ready);
* ``cni_dra_attachment_shaped_rate{device,network,pod,container,ifname,direction}``: the
  rate (bits per second) the kernel shapes an attachment's ``egress`` (what the pod sends)
  or ``ingress`` (what it receives) to; an unshaped direction has no sample;
* ``cni_dra_prepared_claims``: prepared ResourceClaim copies (one per pod);
* ``cni_dra_pending_status_updates``: claim status records not yet written;
* ``cni_dra_state_up``: 1 when inventory and state could be read, else 0 (then no other
  node gauge is exported).

Agent counters: ``cni_dra_prepare_total{result}``, ``cni_dra_unprepare_total{result}``
(result ``ok`` / ``error``), ``cni_dra_prepare_seconds`` and ``cni_dra_unprepare_seconds``
(histograms), ``cni_dra_publish_total{outcome}`` (created, updated, unchanged, error),
``cni_dra_publish_errors_total``, ``cni_dra_status_updates_total{outcome}`` (applied,
gone, error).

Agent NIC health (debounced, :mod:`cni_dra.agent.nichealth`):
``cni_dra_device_link_up{device,ifname}`` 1 while the NIC is healthy, 0 while it is down or
missing; ``cni_dra_device_link_transitions_total{device,ifname,state}``: transitions that
took effect, by the state entered (``up``, ``carrier-lost``, ``admin-down``, ``missing``;
a device's first reading is not one).

``cni-dra status --prometheus FILE`` writes the node gauges in the node_exporter textfile
collector format (:func:`write_textfile`: temp file then rename).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cni_dra.quantity import Quantity

__all__ = ["NodeCollector", "AgentMetrics", "feature_enabled", "write_textfile", "parse_address"]

log = logging.getLogger("cni_dra.agent.metrics")
_PHASES = ("adding", "ready")


def feature_enabled(text: str, gate: str) -> bool | None:
    """Whether a Kubernetes component's ``/metrics`` text says feature gate ``gate`` is
    on: its ``kubernetes_feature_enabled{name="<gate>",stage="..."}`` sample (a BETA
    metric of k8s.io/component-base ``metrics/prometheus/feature``) is 1 (on) or 0 (off).
    None when there is no sample for ``gate`` (a version without that gate). Raises
    ValueError when the text is not the Prometheus text format."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        if family.name != "kubernetes_feature_enabled":
            continue
        for sample in family.samples:
            if sample.labels.get("name") == gate:
                return bool(sample.value == 1)
    return None


def _num(q: str) -> float:
    return float(Quantity.parse(q).as_fraction())


class NodeCollector(Collector):
    """Node gauges from ``status_report(state_dir, inventory)`` at each collection."""

    def __init__(self, state_dir: str, inventory: str) -> None:
        self.state_dir = state_dir
        self.inventory = inventory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from cni_dra.errors import CniError
        from cni_dra.report import status_report
        from cni_dra.state import StateStore

        up = GaugeMetricFamily("cni_dra_state_up", "1 when the inventory and the node state could be read")
        try:
            report = status_report(self.state_dir, self.inventory)
            pending = len(StateStore(self.state_dir).read().statusUpdates)
        except CniError as exc:
            log.warning("metrics: cannot read node state: %s", exc.msg)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        labels = ["device", "ifname", "resource"]
        fams = {
            key: GaugeMetricFamily(f"cni_dra_device_{key}", help_, labels=labels)
            for key, help_ in (
                ("capacity", "NIC capacity (bandwidth in bits per second)"),
                ("consumed", "capacity charged by attachments and prepared claims"),
                ("remaining", "capacity minus consumed"),
            )
        }
        att = GaugeMetricFamily(
            "cni_dra_attachments", "CNI attachments per device and phase", labels=["device", "phase"]
        )
        counts = {(d["name"], p): 0 for d in report["devices"] for p in _PHASES}
        for a in report["attachments"]:
            counts[(a["device"], a["phase"])] = counts.get((a["device"], a["phase"]), 0) + 1
        for d in report["devices"]:
            for key, fam in fams.items():
                for res, q in d[key].items():
                    fam.add_metric([d["name"], str(d["ifName"]), res], _num(q))
        for (dev, phase), n in sorted(counts.items()):
            att.add_metric([dev, phase], n)
        yield from fams.values()
        yield att
        shaped = GaugeMetricFamily(
            "cni_dra_attachment_shaped_rate",
            "rate an attachment's traffic is shaped to (bits per second)",
            labels=["device", "network", "pod", "container", "ifname", "direction"],
        )
        for a in report["attachments"]:
            pod = f"{a['podNamespace']}/{a['podName']}" if a["podName"] else (a["podUID"] or "")
            for direction, bucket in (a["shaping"] or {}).items():
                if direction in ("egress", "ingress"):
                    shaped.add_metric(
                        [a["device"], a["network"], pod, a["containerID"], a["ifname"], direction],
                        bucket["rateBps"],
                    )
        yield shaped
        claims = GaugeMetricFamily("cni_dra_prepared_claims", "prepared ResourceClaim copies (one per pod)")
        claims.add_metric([], len(report["preparedClaims"]))
        yield claims
        pend = GaugeMetricFamily("cni_dra_pending_status_updates", "claim status records not yet written")
        pend.add_metric([], pending)
        yield pend


class AgentMetrics:
    """The agent's registry: node gauges plus counters fed by the agent's parts."""

    def __init__(self, state_dir: str, inventory: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(NodeCollector(state_dir, inventory))
        r = self.registry
        self.calls = {
            verb: Counter(
                f"cni_dra_{verb}",
                f"NodePrepareResources/NodeUnprepareResources claims ({verb})",
                ["result"],
                registry=r,
            )
            for verb in ("prepare", "unprepare")
        }
        self.seconds = {
            verb: Histogram(f"cni_dra_{verb}_seconds", f"time to {verb} one claim", registry=r)
            for verb in ("prepare", "unprepare")
        }
        self.publish = Counter(
            "cni_dra_publish", "ResourceSlice publish attempts by outcome", ["outcome"], registry=r
        )
        self.publish_errors = Counter(
            "cni_dra_publish_errors", "failed ResourceSlice publish attempts", registry=r
        )
        self.status = Counter(
            "cni_dra_status_updates", "claim status writes by outcome", ["outcome"], registry=r
        )
        self.link_up = Gauge(
            "cni_dra_device_link_up",
            "1 while the device's host NIC is healthy (debounced)",
            ["device", "ifname"],
            registry=r,
        )
        self.link_transitions = Counter(
            "cni_dra_device_link_transitions",
            "NIC health transitions by the state entered (debounced)",
            ["device", "ifname", "state"],
            registry=r,
        )
        self._server: Any = None

    def observe(self, verb: str, ok: bool, seconds: float) -> None:
        """One prepare/unprepare of a claim took ``seconds``."""
        self.calls[verb].labels(result="ok" if ok else "error").inc()
        self.seconds[verb].observe(seconds)

    def published(self, outcome: str) -> None:
        """One publish attempt ended with ``outcome``."""
        self.publish.labels(outcome=outcome).inc()
        if outcome == "error":
            self.publish_errors.inc()

    def status_update(self, outcome: str) -> None:
        """One claim status write ended with ``outcome``."""
        self.status.labels(outcome=outcome).inc()

    def link_state(self, device: str, ifname: str, problem: str | None, *, transition: bool) -> None:
        """A device's NIC health took effect: ``problem`` None (up) or its reason;
        ``transition`` False for the device's first reading (not counted)."""
        self.link_up.labels(device=device, ifname=ifname).set(0 if problem else 1)
        if transition:
            self.link_transitions.labels(device=device, ifname=ifname, state=problem or "up").inc()

    def serve(self, address: str) -> int:
        """Serve ``/metrics`` on ``HOST:PORT`` (port 0: any); returns the bound port."""
        from prometheus_client import start_http_server

        host, port = parse_address(address)
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return int(server.server_port)

    def stop(self) -> None:
        """Stop the HTTP server, if any."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``:PORT`` → (host, port); host defaults to 0.0.0.0.

    Raises InvalidConfigError (7) for anything else.
    """
    from cni_dra.errors import InvalidConfigError

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise InvalidConfigError(f"invalid metrics address {address!r}: want HOST:PORT or :PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def write_textfile(path: str, state_dir: str, inventory: str) -> None:
    """Write the node gauges to ``path`` (node_exporter textfile collector format),
    atomically. Raises IOFailureError (5) when the file cannot be written."""
    from prometheus_client import write_to_textfile

    from cni_dra.errors import IOFailureError

    registry = CollectorRegistry()
    registry.register(NodeCollector(state_dir, inventory))
    try:
        write_to_textfile(path, registry)
    except OSError as exc:
        raise IOFailureError(f"failed to write metrics file {path}: {exc.strerror or exc}") from exc
