"""The on-disk format stays readable both ways.

``tests/fixtures/state-main/`` is a state directory written by the store before it was
split by job (snapshot, backup and a journal with every op kind; ``state-main.gen.py``
wrote it). The current code reads it to exactly the state the old code read from it, and
the same changes made by the current code are written as the same journal ops, which the
op decoder reads back.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from cni_dra.state import StateStore
from cni_dra.state.codec import apply_records, decode_record, decode_state

FIXTURES = Path(__file__).parent / "fixtures"
OLD = FIXTURES / "state-main"


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
    expected = json.loads((FIXTURES / "state-main.expected.json").read_text())
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
    assert _ops(new) == _ops(OLD)
    # the snapshot as well (only the journal id differs)
    assert decode_state((new / "state.json").read_bytes()) == decode_state((OLD / "state.json").read_bytes())
    state = decode_state((new / "state.json").read_bytes())
    apply_records(state, _ops(new))
    expected = json.loads((FIXTURES / "state-main.expected.json").read_text())
    assert json.loads(state.model_dump_json(exclude_none=True)) == expected
