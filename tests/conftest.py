"""Unit-test session settings.

``CNI_DRA_STATE_VERIFY=1``: after every commit the state store re-reads its files from
scratch and fails when they differ from the state in memory (a change the journal missed).
"""

import os

import pytest

os.environ["CNI_DRA_STATE_VERIFY"] = "1"


@pytest.fixture(autouse=True)
def _no_pod_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """``state repair`` scans ``/var/run/netns`` (untracked links, leaked ifb devices): unit
    tests see none, whatever namespaces the machine has (netns_tests/ run the real scan)."""
    from cni_dra.verbs import repair

    monkeypatch.setattr(repair, "_pod_netns_paths", lambda: [])
