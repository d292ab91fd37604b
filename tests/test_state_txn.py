"""A state transaction cannot be misused: its handle dies with its block, a nested one fails
at once, it goes by one name, and the state package has no import circle."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cni_dra.state import Attachment, StateStore
from cni_dra.state.lock import NestedLockError
from cni_dra.state.txn import TxnClosedError

REPO = Path(__file__).resolve().parents[1]


def _att(cid: str) -> Attachment:
    return Attachment(
        network="n",
        containerID=cid,
        ifname="eth0",
        driver="d",
        pool="p",
        device="a",
        parent="eth-a",
        consumedCapacity={"bandwidth": "1G"},
    )


USES = {
    "state": lambda txn: txn.state,
    "attachments": lambda txn: txn.attachments,
    "claims": lambda txn: txn.claims,
    "statusUpdates": lambda txn: txn.statusUpdates,
    "bootID": lambda txn: txn.bootID,
    "find": lambda txn: txn.find("n", "c1", "eth0"),
    "put": lambda txn: txn.put(_att("c2")),
    "update": lambda txn: txn.update(("n", "c1", "eth0"), phase="ready"),
    "remove": lambda txn: txn.remove("n", "c1", "eth0"),
    "set_claims": lambda txn: txn.set_claims("pod", None),
    "add_status_update": lambda txn: txn.add_status_update({"id": "x"}),
    "set_boot_id": lambda txn: txn.set_boot_id("b"),
}


@pytest.mark.parametrize("use", sorted(USES))
@pytest.mark.parametrize("ended", ["normally", "by an error"])
def test_any_use_of_the_handle_after_its_block_raises(tmp_path: Path, use: str, ended: str) -> None:
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(_att("c1"))
    try:
        with store.transaction() as txn:
            if ended != "normally":
                raise LookupError("the block failed")
    except LookupError:
        pass
    with pytest.raises(TxnClosedError, match="transaction of .* is over"):
        USES[use](txn)
    assert [a.containerID for a in store.read_files().attachments] == ["c1"]  # nothing else written


def test_a_nested_transaction_in_the_same_thread_raises_at_once(tmp_path: Path) -> None:
    store = StateStore(tmp_path, lock_timeout_s=30)
    start = time.monotonic()
    with pytest.raises(NestedLockError, match="this thread holds it already"):
        with store.transaction() as txn:
            txn.put(_att("c1"))
            with StateStore(tmp_path, lock_timeout_s=30).transaction():  # another store, same state
                pass
    assert time.monotonic() - start < 5  # not after the lock timeout
    assert store.read_files().attachments == []  # the outer block raised: nothing committed
    with store.transaction() as txn:  # and the lock was released
        txn.put(_att("c1"))
    assert len(store.read().attachments) == 1


@pytest.mark.parametrize("inner", ["read", "peek", "replace", "read_backup"])
def test_any_locked_read_inside_a_transaction_raises_at_once(tmp_path: Path, inner: str) -> None:
    store = StateStore(tmp_path, lock_timeout_s=30)
    start = time.monotonic()
    with pytest.raises(NestedLockError):
        with store.transaction():
            if inner == "replace":
                with store.replace():
                    pass
            else:
                getattr(store, inner)()
    assert time.monotonic() - start < 5


def test_another_thread_still_waits_for_the_lock(tmp_path: Path) -> None:
    """Only the holding thread is refused: another one queues and then gets the lock."""
    store = StateStore(tmp_path, lock_timeout_s=30)
    entered, done, errors = threading.Event(), threading.Event(), []

    def other() -> None:
        entered.wait()
        try:
            with store.transaction() as txn:
                txn.put(_att("c2"))
        except Exception as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)
        done.set()

    worker = threading.Thread(target=other)
    worker.start()
    with store.transaction() as txn:
        txn.put(_att("c1"))
        entered.set()
        assert not done.wait(0.3)  # it waits for this transaction
    worker.join(10)
    assert errors == []
    assert {a.containerID for a in store.read().attachments} == {"c1", "c2"}


def _handles(path: Path) -> list[str]:
    """Every name a transaction handle is bound to in ``path``: ``with ....transaction() as X``
    and ``X = Txn(...)``, as ``file:line: X``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                func = call.func if isinstance(call, ast.Call) else None
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name == "transaction" and isinstance(item.optional_vars, ast.Name):
                    found.append((node.lineno, item.optional_vars.id))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if getattr(node.value.func, "id", None) == "Txn":
                found += [(node.lineno, t.id) for t in node.targets if isinstance(t, ast.Name)]
    return [f"{path.relative_to(REPO)}:{line}: {name}" for line, name in found]


def test_the_transaction_handle_goes_by_one_name_everywhere() -> None:
    handles = []
    for top in ("cni_dra", "tests", "netns_tests", "bench", "scripts"):
        for path in sorted((REPO / top).rglob("*.py")):
            handles += _handles(path)
    assert len(handles) > 100  # the scan finds them
    assert [h for h in handles if not h.endswith(": txn")] == []


CIRCLE = {
    "pkg/__init__.py": "",
    "pkg/a.py": "from pkg.b import B\nA = 1\n",
    "pkg/b.py": (
        "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.a import A\nB = 2\n"
    ),
}


def test_the_no_circle_contract_counts_imports_under_type_checking(tmp_path: Path) -> None:
    """The contract ``make lint`` checks over cni_dra, run on a package whose only circle
    goes through an import under TYPE_CHECKING (as the state store's did), breaks."""
    exe = Path(sys.executable).with_name("lint-imports")
    lint = str(exe) if exe.exists() else shutil.which("lint-imports")
    if lint is None:
        pytest.skip("import-linter is not installed")
    for name, text in CIRCLE.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    ours = (REPO / ".importlinter").read_text()
    section = ours[ours.index("[importlinter:contract:no-circles]") :].split("\n\n")[0]
    (tmp_path / "contracts.ini").write_text(
        "[importlinter]\nroot_package = pkg\n\n" + section.replace("    cni_dra", "    pkg") + "\n"
    )
    out = subprocess.run(
        [lint, "--no-cache", "contracts.ini"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0, out.stdout
    assert "No cycles are allowed in pkg" in out.stdout
    (tmp_path / "pkg/b.py").write_text("B = 2\n")  # no circle: kept
    out = subprocess.run(
        [lint, "--no-cache", "contracts.ini"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout
