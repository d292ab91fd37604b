"""A change made in a transaction is either journaled or impossible, without the verify switch.

Production runs without ``CNI_DRA_STATE_VERIFY``: whatever a transaction changes must reach
the journal by construction, or be refused when it is made. A transaction changes the state
only through its operations (:class:`cni_dra.state.txn.Txn`); every value the state holds is
immutable, so each in-place change below raises, and the process's cached state and the
files still agree afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cni_dra.state import Attachment, StateStore
from cni_dra.state.schema import STEP_LINK

KEY = ("net", "c1", "eth0")
CLAIM = {
    "metadata": {"uid": "u1", "name": "c"},
    "status": {"allocation": {"devices": {"results": [{"driver": "d", "pool": "p", "device": "nic-a"}]}}},
}


def _att() -> Attachment:
    return Attachment(
        network="net",
        containerID="c1",
        ifname="eth0",
        driver="d",
        pool="p",
        device="nic-a",
        parent="eth9",
        consumedCapacity={"bandwidth": "1G"},
        phase="adding",
        result={"cniVersion": "1.1.0", "interfaces": [{"name": "eth0"}]},
    )


def _steps(st: Any) -> None:
    st.find(*KEY).steps.append(STEP_LINK)


def _field(st: Any) -> None:
    st.find(*KEY).phase = "ready"


def _capacity(st: Any) -> None:
    st.find(*KEY).consumedCapacity["bandwidth"] = "9G"


def _result(st: Any) -> None:
    st.find(*KEY).result["interfaces"][0]["name"] = "eth9"


def _claim(st: Any) -> None:
    st.claims["pod-1"][0]["status"]["allocation"]["devices"]["results"][0]["device"] = "nic-b"


def _claims_list(st: Any) -> None:
    st.claims["pod-1"].append(CLAIM)


def _claims_map(st: Any) -> None:
    st.claims["pod-2"] = [CLAIM]


def _status(st: Any) -> None:
    st.statusUpdates.append({"id": "x"})


def _boot(st: Any) -> None:
    st.state.bootID = "b9"


def _attachments(st: Any) -> None:
    st.attachments.append(_att().model_copy(update={"containerID": "c2"}))


@pytest.mark.parametrize(
    "change",
    [_steps, _field, _capacity, _result, _claim, _claims_list, _claims_map, _status, _boot, _attachments],
)
def test_an_in_place_change_is_refused_and_memory_still_equals_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[Any], None]
) -> None:
    monkeypatch.delenv("CNI_DRA_STATE_VERIFY", raising=False)
    store = StateStore(tmp_path)
    for n in range(2):  # a snapshot, then a journal: commits append
        with store.transaction() as txn:
            txn.set_boot_id(f"b{n}")
            if n == 0:
                txn.put(_att())
                txn.set_claims("pod-1", [CLAIM])
                txn.add_status_update({"id": "r1"})
    with pytest.raises((TypeError, AttributeError, ValueError)):
        with store.transaction() as txn:
            change(txn)
    on_disk = store.read_files().model_dump(mode="json")
    assert store.read().model_dump(mode="json") == on_disk
    assert on_disk["attachments"][0]["steps"] == []
    assert on_disk["attachments"][0]["consumedCapacity"] == {"bandwidth": "1G"}
    assert on_disk["attachments"][0]["phase"] == "adding"
    assert on_disk["claims"] == {"pod-1": [CLAIM]}
    assert on_disk["statusUpdates"] == [{"id": "r1"}]
    assert on_disk["bootID"] == "b1"


def test_a_change_through_the_transaction_is_journaled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CNI_DRA_STATE_VERIFY", raising=False)
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att())
    with store.transaction() as txn:
        new = txn.update(KEY, steps=[STEP_LINK], phase="deleting")
        assert txn.find(*KEY) is new  # later reads in the block see it
    for state in (store.read_files(), store.read()):
        att = state.find(*KEY)
        assert att is not None and att.steps == (STEP_LINK,) and att.phase == "deleting"
    assert store.journal_path.exists() and b'"steps":["link"]' in store.journal_path.read_bytes()


def test_an_update_cannot_change_the_key(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att())
    with pytest.raises(ValueError, match="key"), store.transaction() as txn:
        txn.update(KEY, ifname="eth1")
    assert store.read_files().find(*KEY) is not None


def test_a_copy_that_skipped_validation_is_frozen_when_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CNI_DRA_STATE_VERIFY", raising=False)
    store = StateStore(tmp_path)
    unvalidated = _att().model_copy(update={"result": {"interfaces": []}, "steps": [STEP_LINK]})
    with store.transaction() as txn:
        recorded = txn.put(unvalidated)
    assert recorded.steps == (STEP_LINK,)
    with pytest.raises(TypeError):
        store.read().find(*KEY).result["interfaces"].append({"name": "eth9"})
    assert store.read().model_dump(mode="json") == store.read_files().model_dump(mode="json")


def test_an_update_naming_no_field_is_refused(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att())
    with pytest.raises(TypeError, match="no field notes"), store.transaction() as txn:
        txn.update(KEY, notes="typo")
