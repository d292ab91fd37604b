"""The cluster's DRAFractionalCapacityRange gate: the agent finds it out (the API server's
kubernetes_feature_enabled metric, or its configuration), records it beside the node state,
and the plugin's standalone allocation rounds by it."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni_dra.agent.gate_probe import FeatureSync, learn_features
from cni_dra.agent.metrics import feature_enabled
from cni_dra.errors import StateError
from cni_dra.k8s.api import KubeApi
from cni_dra.protocol.config import load_conf
from cni_dra.protocol.env import parse_env
from cni_dra.state import NodeState, StateStore
from cni_dra.state.cluster_features import FEATURES_FILE, ClusterFeatures, read_features, write_features
from tests.k8s_apiserver import FakeApiServer, inventory_doc, write_kubeconfig

REPO = Path(__file__).resolve().parents[1]

# As a v1.37.2 kube-apiserver answers GET /metrics?name[]=kubernetes_feature_enabled (trimmed).
METRICS_OFF = """\
# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name="DRAConsumableCapacity",stage="BETA"} 1
kubernetes_feature_enabled{name="DRAFractionalCapacityRange",stage="BETA"} 0
# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",verb="GET"} 12
"""
METRICS_ON = METRICS_OFF.replace(
    '"DRAFractionalCapacityRange",stage="BETA"} 0', '"DRAFractionalCapacityRange",stage="BETA"} 1'
)
METRICS_1_36 = "\n".join(ln for ln in METRICS_OFF.splitlines() if "Fractional" not in ln) + "\n"


def test_feature_enabled_reads_the_gates_sample() -> None:
    assert feature_enabled(METRICS_OFF, "DRAFractionalCapacityRange") is False
    assert feature_enabled(METRICS_ON, "DRAFractionalCapacityRange") is True
    assert feature_enabled(METRICS_ON, "DRAConsumableCapacity") is True
    assert feature_enabled(METRICS_1_36, "DRAFractionalCapacityRange") is None
    with pytest.raises(ValueError):
        feature_enabled('kubernetes_feature_enabled{name="x" 1\n', "x")


# -- the record ---------------------------------------------------------------------------------------


def test_record_round_trip_private_and_absent(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "st")
    assert read_features(store) is None  # no directory yet: nothing recorded
    write_features(store, ClusterFeatures(True, "why"))
    path = tmp_path / "st" / FEATURES_FILE
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert json.loads(path.read_text()) == {"fractionalCapacityRange": True, "source": "why"}
    assert read_features(StateStore(tmp_path / "st")) == ClusterFeatures(True, "why")
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == [FEATURES_FILE]  # no temporary left


@pytest.mark.parametrize("text", ["{", "[]", '{"fractionalCapacityRange": "yes"}', '{"source": "x"}'])
def test_a_bad_record_is_an_error_never_off(tmp_path: Path, text: str) -> None:
    d = tmp_path / "st"
    d.mkdir(mode=0o700)
    (d / FEATURES_FILE).write_text(text)
    with pytest.raises(StateError, match=FEATURES_FILE):
        read_features(StateStore(d))


def test_a_record_in_a_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "st"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    (d / FEATURES_FILE).write_text('{"fractionalCapacityRange": true}')
    with pytest.raises(StateError, match="writable by group or others"):
        read_features(StateStore(d))


# -- the agent learns it ------------------------------------------------------------------------------


@pytest.fixture
def api():
    short = tempfile.mkdtemp(prefix="cdf", dir="/tmp")
    with FakeApiServer() as server:
        client = KubeApi.from_config(write_kubeconfig(f"{short}/kubeconfig", server.url))
        yield server, client
        client.close()
    shutil.rmtree(short)


@pytest.mark.parametrize(
    ("metrics", "expected", "source"),
    [
        (
            METRICS_ON,
            True,
            "kube-apiserver metric kubernetes_feature_enabled{name='DRAFractionalCapacityRange'}",
        ),
        (
            METRICS_OFF,
            False,
            "kube-apiserver metric kubernetes_feature_enabled{name='DRAFractionalCapacityRange'}",
        ),
        (METRICS_1_36, False, "no DRAFractionalCapacityRange (before Kubernetes 1.37: off)"),
        (None, False, "the API server's /metrics is not readable (grant nonResourceURLs /metrics get"),
    ],
)
def test_auto_reads_the_api_servers_metric(
    api: Any, metrics: str | None, expected: bool, source: str
) -> None:
    server, client = api
    server.metrics = metrics
    got = learn_features(client, "auto")
    assert got.fractional_capacity_range is expected
    assert source in got.source
    (req,) = server.requests_for("GET", "/metrics")
    assert req.query == {"name[]": ["kubernetes_feature_enabled"]}  # only the family it needs


@pytest.mark.parametrize("mode", ["on", "off"])
def test_on_and_off_ask_nothing(api: Any, mode: str) -> None:
    server, client = api
    server.metrics = METRICS_ON if mode == "off" else METRICS_OFF
    got = learn_features(client, mode)
    assert got == ClusterFeatures(mode == "on", f"agent configuration: --fractional-capacity-range={mode}")
    assert server.requests_for("GET", "/metrics") == []


def test_sync_writes_only_changes_and_replaces_a_bad_record(api: Any, tmp_path: Path) -> None:
    server, client = api
    sync = FeatureSync(client, str(tmp_path / "st"))
    server.metrics = METRICS_ON
    assert sync.sync().fractional_capacity_range is True
    path = tmp_path / "st" / FEATURES_FILE
    first = os.stat(path).st_ino
    sync.sync()
    assert os.stat(path).st_ino == first  # unchanged: not rewritten
    server.metrics = METRICS_OFF
    sync.sync()
    assert read_features(StateStore(tmp_path / "st")) == ClusterFeatures(
        False, "kube-apiserver metric kubernetes_feature_enabled{name='DRAFractionalCapacityRange'}"
    )
    path.write_text("garbage")
    sync.sync()
    assert read_features(StateStore(tmp_path / "st")).fractional_capacity_range is False  # type: ignore[union-attr]


def test_the_running_agent_records_the_gate() -> None:
    import threading

    from cni_dra.agent.service import Agent, AgentConfig
    from tests.builders import wait_for

    short = tempfile.mkdtemp(prefix="cdf", dir="/tmp")
    inv = f"{short}/inv.yaml"
    with open(inv, "w") as fh:
        yaml.safe_dump(inventory_doc("node-1", {"lo-nic": "lo"}), fh)
    try:
        with FakeApiServer() as server:
            server.add_node("node-1")
            server.metrics = METRICS_ON
            cfg = AgentConfig(
                node_name="node-1",
                inventory=inv,
                state_dir=f"{short}/state",
                kubeconfig=write_kubeconfig(f"{short}/kubeconfig", server.url),
                plugin_dir=f"{short}/plugins",
                registry_dir=f"{short}/reg",
                resync_s=0.3,
                poll_s=0.05,
                fastpath_socket=f"{short}/fastpath/agent.sock",
                fastpath_processes=1,
            )
            agent, stop = Agent(cfg), threading.Event()
            thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
            thread.start()
            try:
                got = wait_for(lambda: read_features(StateStore(f"{short}/state")), timeout_s=30.0)
            finally:
                stop.set()
                thread.join(10)
            assert got.fractional_capacity_range is True
            assert server.requests_for("GET", "/metrics")[0].query == {
                "name[]": ["kubernetes_feature_enabled"]
            }
    finally:
        shutil.rmtree(short)


def test_rbac_grants_the_metrics_read() -> None:
    docs = [d for d in yaml.safe_load_all((REPO / "conf/k8s/rbac.yaml").read_text()) if d]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    rules = [r for r in role["rules"] if "nonResourceURLs" in r]
    assert rules == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


# -- the plugin's standalone allocation rounds by it ---------------------------------------------------


def _invocation(tmp_path: Path, bw: str) -> Any:
    from cni_dra.attach.invocation import Invocation

    inventory = tmp_path / "slice.json"
    dev = {
        "name": "a",
        "allowMultipleAllocations": True,
        "attributes": {"ifName": {"string": "if-a"}},
        "capacity": {
            "bandwidth": {
                "value": "8",
                "requestPolicy": {"default": "500m", "validRange": {"min": "500m", "step": "250m"}},
            }
        },
    }
    inventory.write_text(
        json.dumps(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": "s"},
                "spec": {
                    "driver": "net.cni-dra.dev",
                    "nodeName": "n",
                    "pool": {"name": "n"},
                    "devices": [dev],
                },
            }
        )
    )
    raw = json.dumps(
        {
            "cniVersion": "1.1.0",
            "name": "net1",
            "type": "cni-dra",
            "inventory": str(inventory),
            "stateDir": str(tmp_path / "st"),
            "capacity": {"requests": {"bandwidth": bw}},
        }
    ).encode()
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/var/run/netns/c1",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
    }
    return Invocation(env=parse_env(env), conf=load_conf(raw), raw=raw)


class _Parent:
    mtu, mac = 1500, "02:00:00:00:00:aa"


@pytest.mark.parametrize(("record", "expected"), [(None, "1"), (False, "1"), (True, "750m")])
def test_standalone_add_rounds_as_the_recorded_gate_says(
    tmp_path: Path, record: bool | None, expected: str
) -> None:
    from cni_dra.attach.plan import plan_attachment
    from cni_dra.quantity import Quantity

    if record is not None:
        write_features(StateStore(tmp_path / "st"), ClusterFeatures(record, "test"))
    att = plan_attachment(_invocation(tmp_path, "600m"), NodeState(), {"if-a": _Parent()})
    assert att.consumedCapacity == {"bandwidth": Quantity.parse(expected)}


def test_standalone_add_refuses_a_request_the_range_cannot_compute(tmp_path: Path) -> None:
    from cni_dra.attach.plan import plan_attachment
    from cni_dra.errors import InvalidConfigError

    write_features(StateStore(tmp_path / "st"), ClusterFeatures(True, "test"))
    with pytest.raises(InvalidConfigError, match="no exact milli value") as info:
        plan_attachment(_invocation(tmp_path, "1000500u"), NodeState(), {"if-a": _Parent()})
    assert info.value.code == 7
