"""Finding out the cluster's allocation semantics and handing them to the plugin.

The plugin's standalone allocation and ``cni-dra allocate --state-dir`` must round a
stepped ``validRange`` as the cluster's scheduler does, which depends on the control
plane's ``DRAFractionalCapacityRange`` feature gate (:mod:`cni_dra.allocator.capacity`).
The agent finds it out and records it beside the node state
(:mod:`cni_dra.state.cluster_features`), at start and every ``interval``; the record is
rewritten only when it changes.

Modes (``cni-dra agent --fractional-capacity-range``, env ``CNI_DRA_FRACTIONAL_CAPACITY_RANGE``):

* ``auto`` (the default): the API server's ``/metrics``, only the
  ``kubernetes_feature_enabled`` family asked for (``name[]``), its sample for the gate.
  That needs ``nonResourceURLs: ["/metrics"], verbs: ["get"]`` in the agent's ClusterRole
  (``conf/k8s/rbac.yaml`` grants it). When the server answers 403 (the rule was left
  out), the agent records Kubernetes 1.37's default, off, saying why; when the metric has
  no sample for the gate (an API server older than 1.37, which has no such gate and
  rounds in whole units), off too. A failure to reach the server keeps what is recorded.
* ``on`` / ``off``: the operator's word, for clusters where the agent may not read the
  API server's metrics; nothing is asked.

What the API server reports is its own gate. A control plane runs one configuration for
all its components (the gate, or ``--min-compatibility-version``, is set on each), so it
is the scheduler's too; a cluster whose scheduler runs with another setting than its API
server needs ``on`` or ``off``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cni_dra.errors import CniError
from cni_dra.state import StateStore
from cni_dra.state.cluster_features import ClusterFeatures, read_features, write_features

if TYPE_CHECKING:
    from cni_dra.k8s.api import KubeApi

__all__ = ["GATE", "MODES", "FeatureSync", "learn_features"]

log = logging.getLogger("cni_dra.agent.gate_probe")

GATE = "DRAFractionalCapacityRange"
MODES = ("auto", "on", "off")
_METRIC = "kubernetes_feature_enabled"


def learn_features(api: KubeApi | None, mode: str) -> ClusterFeatures:
    """The cluster's allocation semantics by ``mode`` (see the module docstring); ``api``
    None (an agent without Kubernetes) only with ``on`` or ``off``.

    Raises IOFailureError (5) when the API server cannot be asked (``auto``), ValueError
    for an unknown mode or ``auto`` without ``api``.
    """
    from cni_dra.agent.metrics import feature_enabled

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
    if mode != "auto":
        return ClusterFeatures(mode == "on", f"agent configuration: --fractional-capacity-range={mode}")
    if api is None:
        raise ValueError("mode 'auto' needs the API server")
    text = api.get_metrics_text((_METRIC,))
    if text is None:
        return ClusterFeatures(
            False,
            "default of Kubernetes 1.37 (off): the API server's /metrics is not readable "
            "(grant nonResourceURLs /metrics get, or set --fractional-capacity-range)",
        )
    try:
        enabled = feature_enabled(text, GATE)
    except ValueError as exc:
        return ClusterFeatures(
            False, f"default of Kubernetes 1.37 (off): the API server's /metrics is unreadable: {exc}"
        )
    if enabled is None:
        return ClusterFeatures(
            False, f"kube-apiserver metric {_METRIC}: no {GATE} (before Kubernetes 1.37: off)"
        )
    return ClusterFeatures(enabled, f"kube-apiserver metric {_METRIC}{{name={GATE!r}}}")


class FeatureSync:
    """Learns the semantics (:func:`learn_features`) and keeps the record in ``state_dir``
    (``api`` None: ``on`` or ``off`` only; ValueError otherwise)."""

    def __init__(self, api: KubeApi | None, state_dir: str, mode: str = "auto") -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
        if api is None and mode == "auto":
            raise ValueError("mode 'auto' needs the API server")
        self.api = api
        self.store = StateStore(state_dir)
        self.mode = mode

    def sync(self) -> ClusterFeatures:
        """Learn the semantics and record them when they differ from the record. Raises
        IOFailureError (5) (the API server) and StateError (5) (the record)."""
        learned = learn_features(self.api, self.mode)
        try:
            current = read_features(self.store)
        except CniError as exc:  # an unreadable record is replaced
            log.warning("replacing the unreadable record: %s", exc.msg)
            current = None
        if current != learned:
            write_features(self.store, learned)
            log.info("%s %s (%s)", GATE, "on" if learned.fractional_capacity_range else "off", learned.source)
        return learned
