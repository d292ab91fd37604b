"""The on-disk format stays readable both ways.

``tests/fixtures/state-main/`` is a state directory written by the store before it was
split by job (snapshot, backup and a journal with every op kind; ``state-main.gen.py``
wrote it), in schema 3. The current code reads it to exactly the state the old code read
from it, migrated to the current schema (schema 4: an attachment's parent NIC is
``parent``, it was ``ifName``, in the snapshot and in the journal's ops alike), and the
same changes made by the current code are written as the same journal ops, which the op
decoder reads back.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

from cni_dra.state import StateStore
from cni_dra.state.codec import apply_records, decode_record, decode_state

FIXTURES = Path(__file__).parent / "fixtures"
OLD = FIXTURES / "state-main"


def _migrated(obj: Any) -> Any:
    """What schema 4 makes of a schema-3 value (written out here, not by the code under test)."""
    if isinstance(obj, dict):
        out = {("parent" if k == "ifName" else k): _migrated(v) for k, v in obj.items()}
        if "schemaVersion" in out:
            out["schemaVersion"] = 4
        return out
    if isinstance(obj, list):
        return [_migrated(v) for v in obj]
    return obj


def _expected() -> dict[str, Any]:
    expected = _migrated(json.loads((FIXTURES / "state-main.expected.json").read_text()))
    assert expected["schemaVersion"] == 4 and "parent" in expected["attachments"][0]
    return expected  # type: ignore[no-any-return]


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    shutil.copytree(OLD, d)
    d.chmod(0o700)
    return d


def _ops(d: Path) -> list[list[dict]]:
    """The ops of each journal record, verified by the decoder."""
    out = []
    for line in (d / "state.journal").read_bytes().splitlines(keepends=True):
        rec = decode_record(line)
        assert rec is not None, line
        out.append(rec["ops"])
    return out


def test_a_state_written_by_the_old_store_reads_the_same(tmp_path: Path) -> None:
    expected = _expected()
    store = StateStore(_copy(tmp_path))
    assert json.loads(store.read_files().model_dump_json(exclude_none=True)) == expected
    assert json.loads(store.read().model_dump_json(exclude_none=True)) == expected  # through the cache too


def test_the_current_store_writes_the_ops_the_old_one_wrote(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("state_main_gen", FIXTURES / "state-main.gen.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.write(str(tmp_path / "new"))  # the same changes, made by the current store
    new = tmp_path / "new"
    assert _ops(new) == _migrated(_ops(OLD))
    # the snapshot as well (only the journal id differs)
    assert decode_state((new / "state.json").read_bytes()) == decode_state((OLD / "state.json").read_bytes())
    state = decode_state((new / "state.json").read_bytes())
    apply_records(state, _ops(new))
    assert json.loads(state.model_dump_json(exclude_none=True)) == _expected()


def test_a_schema_3_journal_op_naming_ifname_is_read_as_the_parent(tmp_path: Path) -> None:
    state = decode_state((OLD / "state.json").read_bytes())
    old_ops = _ops(OLD)
    assert any("ifName" in op.get("put", {}) for record in old_ops for op in record)
    apply_records(state, old_ops)
    assert {a.parent for a in state.attachments} == {"eth1"}
