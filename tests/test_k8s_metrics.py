"""Prometheus metrics: node gauges from inventory and state (agent endpoint and
`cni-dra status --prometheus FILE` textfile), agent counters."""

from __future__ import annotations

import urllib.request

import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from cni_dra.agent.metrics import AgentMetrics, parse_address, write_textfile
from cni_dra.cli import cli
from cni_dra.state import Attachment, StateStore
from tests.k8s_apiserver import DRIVER, allocated_claim, inventory_doc


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def node(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(inventory_doc("node-1", {"eth-a": "ens1", "eth-b": "ens2"})))
    store = StateStore(tmp_path / "state")
    with store.transaction() as txn:
        txn.put(
            Attachment(
                network="n",
                containerID="c1",
                ifname="net1",
                driver=DRIVER,
                pool="node-1",
                device="eth-a",
                parent="ens1",
                consumedCapacity={"bandwidth": "4G"},
                phase="ready",
            )
        )
        txn.put(
            Attachment(
                network="n",
                containerID="c2",
                ifname="net1",
                driver=DRIVER,
                pool="node-1",
                device="eth-a",
                parent="ens1",
                consumedCapacity={"bandwidth": "1G"},
                phase="adding",
            )
        )
        claim = allocated_claim(
            "c",
            pool="node-1",
            device="eth-b",
            bandwidth="3G",
            share_id="9d7e6f5a-4b3c-4d2e-8f1a-0b9c8d7e6f5a",
            pod_uids=["p"],
        )
        claim["metadata"]["uid"] = "u-c"
        txn.set_claims("p", [claim])
        txn.add_status_update({"id": "x", "claim": {}})
    return str(inv), str(tmp_path / "state")


def check_node_gauges(s):
    dev = lambda d, i: (("device", d), ("ifname", i), ("resource", "bandwidth"))  # noqa: E731
    assert s[("cni_dra_state_up", ())] == 1
    assert s[("cni_dra_device_capacity", dev("eth-a", "ens1"))] == 10e9
    assert s[("cni_dra_device_consumed", dev("eth-a", "ens1"))] == 5e9
    assert s[("cni_dra_device_remaining", dev("eth-a", "ens1"))] == 5e9
    assert s[("cni_dra_device_consumed", dev("eth-b", "ens2"))] == 3e9  # a prepared claim not attached yet
    assert s[("cni_dra_device_remaining", dev("eth-b", "ens2"))] == 7e9
    assert s[("cni_dra_attachments", (("device", "eth-a"), ("phase", "ready")))] == 1
    assert s[("cni_dra_attachments", (("device", "eth-a"), ("phase", "adding")))] == 1
    assert s[("cni_dra_attachments", (("device", "eth-b"), ("phase", "ready")))] == 0
    assert s[("cni_dra_prepared_claims", ())] == 1
    assert s[("cni_dra_pending_status_updates", ())] == 1


def test_status_prometheus_textfile(tmp_path):
    inv, state = node(tmp_path)
    out = tmp_path / "cni_dra.prom"
    res = CliRunner().invoke(
        cli, ["status", "--state-dir", state, "--inventory", inv, "--prometheus", str(out)]
    )
    assert res.exit_code == 0, res.output
    check_node_gauges(samples(out.read_text()))
    assert not list(tmp_path.glob("*.prom.*"))  # written by rename, no temp file left


def test_textfile_when_state_is_unreadable(tmp_path):
    inv, state = node(tmp_path)
    (tmp_path / "state" / "state.json").write_text("{corrupt")
    write_textfile(str(tmp_path / "m.prom"), state, inv)
    s = samples((tmp_path / "m.prom").read_text())
    assert s == {("cni_dra_state_up", ()): 0}


def test_agent_endpoint_serves_gauges_and_counters(tmp_path):
    inv, state = node(tmp_path)
    m = AgentMetrics(state, inv)
    port = m.serve("127.0.0.1:0")
    try:
        m.observe("prepare", True, 0.02)
        m.observe("prepare", False, 0.5)
        m.observe("unprepare", True, 0.01)
        m.published("created")
        m.published("error")
        m.status_update("applied")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            s = samples(resp.read().decode())
    finally:
        m.stop()
    check_node_gauges(s)
    assert s[("cni_dra_prepare_total", (("result", "ok"),))] == 1
    assert s[("cni_dra_prepare_total", (("result", "error"),))] == 1
    assert s[("cni_dra_unprepare_total", (("result", "ok"),))] == 1
    assert s[("cni_dra_prepare_seconds_count", ())] == 2
    assert s[("cni_dra_prepare_seconds_sum", ())] == 0.52
    assert s[("cni_dra_publish_total", (("outcome", "created"),))] == 1
    assert s[("cni_dra_publish_errors_total", ())] == 1
    assert s[("cni_dra_status_updates_total", (("outcome", "applied"),))] == 1


def test_link_gauge_and_transition_counter(tmp_path):
    """Per device: 1/0 while its NIC is healthy or not; transitions counted by the state
    entered (a first reading sets the gauge, it is no transition)."""
    from prometheus_client import generate_latest

    inv, state = node(tmp_path)
    m = AgentMetrics(state, inv)
    m.link_state("eth-a", "ens1", None, transition=False)
    m.link_state("eth-b", "ens2", "carrier-lost", transition=False)
    s = samples(generate_latest(m.registry).decode())
    assert s[("cni_dra_device_link_up", (("device", "eth-a"), ("ifname", "ens1")))] == 1
    assert s[("cni_dra_device_link_up", (("device", "eth-b"), ("ifname", "ens2")))] == 0
    assert not [k for k in s if k[0] == "cni_dra_device_link_transitions_total"]
    m.link_state("eth-b", "ens2", None, transition=True)
    m.link_state("eth-b", "ens2", "missing", transition=True)
    m.link_state("eth-b", "ens2", None, transition=True)
    s = samples(generate_latest(m.registry).decode())
    assert s[("cni_dra_device_link_up", (("device", "eth-b"), ("ifname", "ens2")))] == 1
    tr = {dict(k[1])["state"]: v for k, v in s.items() if k[0] == "cni_dra_device_link_transitions_total"}
    assert tr == {"up": 2, "missing": 1}


def test_parse_address():
    import pytest

    from cni_dra.errors import InvalidConfigError

    assert parse_address(":9412") == ("0.0.0.0", 9412)
    assert parse_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_address("[::1]:80") == ("::1", 80)
    for bad in ("9412", "host:", "h:99999", "h:x"):
        with pytest.raises(InvalidConfigError):
            parse_address(bad)
