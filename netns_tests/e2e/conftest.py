"""The real-cluster scenarios (``make e2e``): a two-node cluster of real Kubernetes
components on this machine (scripts/e2e/cluster.py), each node in namespaces of its own,
with cni-dra as its pod network and DRA driver.

Collected only when ``CNI_DRA_E2E=1`` (set by ``make e2e``), so ``make test`` and
``make netns`` leave them out. The cluster is session-scoped: brought up once (or reused
when ``CNI_DRA_E2E_REUSE=1`` and ``make cluster-up`` left one running) and torn down at the
end, failure or not. A failed test gets the tails of every component's log attached.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from netns_tests.e2e.helpers import load_cluster_module

ENABLED = os.environ.get("CNI_DRA_E2E") == "1"
if not ENABLED:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def cluster() -> Iterator[ModuleType]:
    if os.geteuid() != 0:
        pytest.fail("the real-cluster tests need root (namespaces, kubelet, containerd, veth NICs)")
    mod = load_cluster_module()
    reuse = os.environ.get("CNI_DRA_E2E_REUSE") == "1" and mod.status_line().startswith("up")
    if not reuse:
        try:
            mod.up()
        except Exception as exc:  # noqa: BLE001 - whatever stopped the bring-up, reported with the logs
            tails = mod.tails()
            mod.down(quiet=True)
            pytest.fail(f"the cluster did not come up: {exc}\n{tails}")
    try:
        yield mod
    finally:
        if not reuse and os.environ.get("CNI_DRA_E2E_KEEP") != "1":
            mod.down(quiet=True)


@pytest.fixture(scope="session")
def api(cluster):
    client = cluster.api_client()
    yield client
    client.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        mod = sys.modules.get("cni_dra_e2e_cluster")
        if mod is not None:
            report.sections.append(("component logs (tails)", mod.tails(15)))
