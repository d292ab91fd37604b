"""load_inventory keeps the validated slice per process and re-reads a changed file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cni_dra.dra import inventory
from cni_dra.dra.inventory import load_inventory
from cni_dra.errors import InventoryError
from tests.builders import device, resource_slice


def _slice(name: str, ifname: str) -> dict[str, Any]:
    return resource_slice([device(name, ifname, None, shared=False)], driver="nic.cni-dra.io", pool="n1")


def _devices(path: Path) -> list[tuple[str, Any]]:
    s = load_inventory(str(path))
    return [(d.name, d.attributes["ifName"].string_value) for d in s.spec.devices]


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Sources parse_inventory was called for (the expensive step the cache skips)."""
    calls: list[str] = []
    real = inventory.parse_inventory

    def spy(text: str, source: str = "<inventory>", **kw: Any) -> Any:
        calls.append(source)
        return real(text, source, **kw)

    monkeypatch.setattr(inventory, "parse_inventory", spy)
    return calls


def test_unchanged_file_is_parsed_once(tmp_path: Path, parses: list[str]) -> None:
    path = tmp_path / "slice.json"
    path.write_text(json.dumps(_slice("eth-a", "eth0")))
    first = load_inventory(str(path))
    second = load_inventory(str(path))
    assert second is first
    assert parses == [str(path)]


def test_rewrite_in_place_with_same_size_and_mtime_is_read_again(tmp_path: Path, parses: list[str]) -> None:
    path = tmp_path / "slice.json"
    path.write_text(json.dumps(_slice("eth-a", "eth0")))
    st = os.stat(path)
    assert _devices(path) == [("eth-a", "eth0")]
    with open(path, "r+b") as fh:  # same inode, same size; mtime put back to the old value
        fh.write(json.dumps(_slice("eth-b", "eth1")).encode())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    assert _devices(path) == [("eth-b", "eth1")]
    assert len(parses) == 2


def test_replaced_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "slice.json"
    path.write_text(json.dumps(_slice("eth-a", "eth0")))
    assert _devices(path) == [("eth-a", "eth0")]
    new = tmp_path / "slice.json.new"
    new.write_text(json.dumps(_slice("eth-c", "eth9")))
    os.replace(new, path)
    assert _devices(path) == [("eth-c", "eth9")]


def test_a_file_that_became_invalid_fails_and_is_not_served_from_cache(tmp_path: Path) -> None:
    path = tmp_path / "slice.json"
    path.write_text(json.dumps(_slice("eth-a", "eth0")))
    load_inventory(str(path))
    path.write_text("{not json")
    with pytest.raises(InventoryError):
        load_inventory(str(path))
    with pytest.raises(InventoryError):  # failures are not cached either: still refused
        load_inventory(str(path))


def test_plugin_rules_are_part_of_the_key(tmp_path: Path) -> None:
    data = _slice("eth-a", "eth0")
    del data["spec"]["devices"][0]["attributes"]
    path = tmp_path / "slice.json"
    path.write_text(json.dumps(data))
    assert load_inventory(str(path), plugin_rules=False).spec.devices[0].name == "eth-a"
    with pytest.raises(InventoryError, match="ifName"):
        load_inventory(str(path))


# -- what a YAML inventory parsed to, kept for the next process ----------------------------


def _write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(doc))
    return path


def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a new process has: no slice kept in memory, and here no PyYAML importable."""
    monkeypatch.setattr(inventory, "_CACHE", {})
    monkeypatch.setitem(__import__("sys").modules, "yaml", None)


def test_a_yaml_parse_is_kept_and_the_next_process_reads_it_without_pyyaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write_yaml(tmp_path / "slice.yaml", _slice("nic-a", "eth1"))
    cache = tmp_path / "state" / inventory.INVENTORY_CACHE_FILE
    cache.parent.mkdir(mode=0o700)
    first = load_inventory(str(path), parsed_cache=str(cache))
    assert cache.exists() and cache.stat().st_mode & 0o777 == 0o600
    assert not [p for p in cache.parent.iterdir() if p.name.endswith(".tmp")]
    _fresh_process(monkeypatch)
    again = load_inventory(str(path), parsed_cache=str(cache))
    assert again == first and again is not first


def test_a_changed_yaml_text_is_parsed_again_and_kept_in_place_of_the_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write_yaml(tmp_path / "slice.yaml", _slice("nic-a", "eth1"))
    cache = tmp_path / inventory.INVENTORY_CACHE_FILE
    load_inventory(str(path), parsed_cache=str(cache))
    _write_yaml(path, _slice("nic-b", "eth2"))
    monkeypatch.setattr(inventory, "_CACHE", {})
    assert _devices_with(path, cache) == [("nic-b", "eth2")]
    _fresh_process(monkeypatch)
    assert _devices_with(path, cache) == [("nic-b", "eth2")]


def _devices_with(path: Path, cache: Path) -> list[tuple[str, Any]]:
    s = load_inventory(str(path), parsed_cache=str(cache))
    return [(d.name, d.attributes["ifName"].string_value) for d in s.spec.devices]


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"sha256": "0", "data": {}}', b"[1, 2]"])
def test_a_bad_or_foreign_cache_file_is_ignored_and_replaced(tmp_path: Path, content: bytes) -> None:
    path = _write_yaml(tmp_path / "slice.yaml", _slice("nic-a", "eth1"))
    cache = tmp_path / inventory.INVENTORY_CACHE_FILE
    cache.write_bytes(content)
    assert _devices_with(path, cache) == [("nic-a", "eth1")]
    assert json.loads(cache.read_bytes())["data"] == _slice("nic-a", "eth1")


def test_what_json_cannot_hold_exactly_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A YAML timestamp (here in a field the model ignores) would come back a string."""
    path = tmp_path / "slice.yaml"
    _write_yaml(path, _slice("nic-a", "eth1"))
    path.write_text(
        path.read_text().replace("metadata:\n", "metadata:\n  creationTimestamp: 2026-12-06T10:00:00Z\n", 1)
    )
    cache = tmp_path / inventory.INVENTORY_CACHE_FILE
    assert _devices_with(path, cache) == [("nic-a", "eth1")]
    assert not cache.exists() and list(tmp_path.iterdir()) == [path]


def test_an_unwritable_cache_is_no_error(tmp_path: Path) -> None:
    path = _write_yaml(tmp_path / "slice.yaml", _slice("nic-a", "eth1"))
    assert _devices_with(path, tmp_path / "missing-dir" / "cache.json") == [("nic-a", "eth1")]


def test_a_json_inventory_keeps_nothing(tmp_path: Path) -> None:
    path = tmp_path / "slice.json"
    path.write_text(json.dumps(_slice("nic-a", "eth1")))
    cache = tmp_path / inventory.INVENTORY_CACHE_FILE
    assert _devices_with(path, cache) == [("nic-a", "eth1")]
    assert not cache.exists()


def test_an_invocation_keeps_the_parse_in_its_state_directory_only_when_that_is_safe(tmp_path: Path) -> None:
    from cni_dra.attach.invocation import Invocation
    from cni_dra.protocol.config import load_conf
    from cni_dra.protocol.env import parse_env
    from tests.builders import cni_env, netconf_bytes

    path = _write_yaml(tmp_path / "slice.yaml", _slice("nic-a", "eth1"))

    def invocation(state: Path) -> Invocation:
        inventory._CACHE.clear()  # as in a new process
        raw = netconf_bytes(inventory=str(path), stateDir=str(state))
        return Invocation(env=parse_env(cni_env("ADD")), conf=load_conf(raw), raw=raw)

    missing = tmp_path / "missing"
    assert invocation(missing).inventory.spec.devices[0].name == "nic-a"
    assert not missing.exists()  # reading the inventory makes no state directory
    unsafe = tmp_path / "unsafe"
    unsafe.mkdir(mode=0o777)
    unsafe.chmod(0o777)
    assert invocation(unsafe).inventory.spec.devices[0].name == "nic-a"
    assert list(unsafe.iterdir()) == []
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert invocation(private).inventory.spec.devices[0].name == "nic-a"
    assert [p.name for p in private.iterdir()] == [inventory.INVENTORY_CACHE_FILE]


def test_the_next_process_gets_the_slice_in_the_documents_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept parse is the parse, key order included: a device's attributes come back in
    the order the document gives them, not sorted."""
    import yaml

    doc = _slice("nic-a", "eth1")
    attrs = doc["spec"]["devices"][0]["attributes"]
    doc["spec"]["devices"][0]["attributes"] = {"zeta": {"string": "z"}, **attrs, "alpha": {"string": "a"}}
    path = tmp_path / "slice.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    cache = tmp_path / inventory.INVENTORY_CACHE_FILE
    first = load_inventory(str(path), parsed_cache=str(cache))
    assert list(first.spec.devices[0].attributes) == ["zeta", "ifName", "alpha"]
    _fresh_process(monkeypatch)
    again = load_inventory(str(path), parsed_cache=str(cache))
    assert list(again.spec.devices[0].attributes) == ["zeta", "ifName", "alpha"]
    assert json.dumps(inventory.slice_to_dict(again)) == json.dumps(inventory.slice_to_dict(first))


def _record_for(path: Path, data: dict[str, Any]) -> bytes:
    import hashlib

    digest = hashlib.sha256(path.read_text().encode()).hexdigest()
    return json.dumps({"sha256": digest, "data": data}).encode()


def test_a_symlink_at_the_cache_path_is_not_followed(tmp_path: Path) -> None:
    """Even a record made for this very text is not read through a symlink (as the state's
    own files: never followed)."""
    path = _write_yaml(tmp_path / "slice.yaml", _slice("nic-a", "eth1"))
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(_record_for(path, _slice("nic-z", "eth9")))
    cache = tmp_path / inventory.INVENTORY_CACHE_FILE
    cache.symlink_to(elsewhere)
    assert _devices_with(path, cache) == [("nic-a", "eth1")]
    assert json.loads(elsewhere.read_bytes())["data"] == _slice("nic-z", "eth9")  # not written through


def test_a_fifo_at_the_cache_path_does_not_block(tmp_path: Path) -> None:
    import threading

    path = _write_yaml(tmp_path / "slice.yaml", _slice("nic-a", "eth1"))
    cache = tmp_path / inventory.INVENTORY_CACHE_FILE
    os.mkfifo(cache, 0o600)
    result: list[Any] = []
    reader = threading.Thread(target=lambda: result.append(_devices_with(path, cache)), daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # release the blocked open, then fail
        os.close(os.open(cache, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
        pytest.fail("reading the cache blocked on a FIFO")
    assert result == [[("nic-a", "eth1")]]


@pytest.mark.parametrize("failing", ["open", "write", "rename"])
@pytest.mark.parametrize("code", [28, 30])  # ENOSPC, EROFS
def test_a_full_or_read_only_state_directory_is_no_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str, code: int
) -> None:
    path = _write_yaml(tmp_path / "slice.yaml", _slice("nic-a", "eth1"))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    real = getattr(os, failing)

    def refused(*args: Any, **kw: Any) -> Any:
        if str(args[0]).startswith(str(state)) or failing == "write":
            raise OSError(code, os.strerror(code))
        return real(*args, **kw)

    monkeypatch.setattr(inventory.os, failing, refused)
    assert _devices_with(path, state / inventory.INVENTORY_CACHE_FILE) == [("nic-a", "eth1")]
    monkeypatch.setattr(inventory.os, failing, real)
    assert list(state.iterdir()) == []


def test_many_threads_keeping_the_parse_at_once_leave_one_whole_file(tmp_path: Path) -> None:
    """In-process ADDs in the agent's worker threads all parse and keep the same text: each
    writes its own temporary file and renames it, so what is there is always a whole record."""
    import threading

    path = _write_yaml(tmp_path / "slice.yaml", _slice("nic-a", "eth1"))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    cache = state / inventory.INVENTORY_CACHE_FILE
    start = threading.Barrier(16)
    results: list[Any] = []

    def add() -> None:
        start.wait()
        for _ in range(5):
            results.append(
                inventory.parse_inventory(path.read_text(), str(path), parsed_cache=str(cache))
                .spec.devices[0]
                .name
            )

    threads = [threading.Thread(target=add) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["nic-a"] * 80
    assert [p.name for p in state.iterdir()] == [inventory.INVENTORY_CACHE_FILE]
    assert json.loads(cache.read_bytes())["data"] == _slice("nic-a", "eth1")


def _killed_writer(cache: Path, digest: str) -> None:
    """A process killed by SIGKILL between creating its temporary file and renaming it."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child dies at the rename
        try:
            os.rename = lambda *a, **k: os.kill(os.getpid(), 9)  # type: ignore[assignment]
            inventory.write_parsed_cache(str(cache), digest, {"a": 1})
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9


def test_a_write_killed_before_its_rename_leaves_a_file_the_next_write_removes_once_old(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    cache = state / inventory.INVENTORY_CACHE_FILE
    _killed_writer(cache, "0" * 64)
    (old,) = state.iterdir()
    assert old.name.startswith(inventory.INVENTORY_CACHE_FILE + ".") and old.name.endswith(".tmp")
    two_minutes_ago = os.stat(old).st_mtime - 120
    os.utime(old, (two_minutes_ago, two_minutes_ago))
    _killed_writer(cache, "1" * 64)  # as recent as a write under way in another process
    (young,) = set(state.iterdir()) - {old}
    unrelated = state / "inventory-parsed.json.bak"
    unrelated.write_bytes(b"x")
    os.utime(unrelated, (two_minutes_ago, two_minutes_ago))

    path = _write_yaml(tmp_path / "slice.yaml", _slice("nic-a", "eth1"))
    inventory.parse_inventory(path.read_text(), str(path), parsed_cache=str(cache))

    assert sorted(p.name for p in state.iterdir()) == sorted([cache.name, young.name, unrelated.name])
    assert json.loads(cache.read_bytes())["data"] == _slice("nic-a", "eth1")
