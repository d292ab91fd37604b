"""A CNI_NETNS that is no usable namespace path: what :func:`cni_dra.netlink.netns.netns_lookup`
makes of it, and what every verb answers (never code 999, never a traceback).

A path that names nothing (missing, a component that is not a directory as in
``/etc/passwd/x``, the empty file an unmounted namespace leaves) is a gone namespace: ADD
and CHECK answer code 3, DEL succeeds and releases what the attachment holds. A path that
names something else, or cannot be looked at (a directory, a symlink loop, a name too long,
another kind of namespace), is code 4 for every verb, and DEL answers it before any effect.
Real paths, no privileges: the netns tests run the installed plugin on the same paths.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from cni_dra.cni import run
from cni_dra.errors import InvalidEnvironmentError
from cni_dra.netlink import netns
from cni_dra.state import StateStore
from tests.builders import attachment, cni_env, device, netconf, write_slice


def _paths(tmp_path: Path) -> dict[str, str]:
    loop = tmp_path / "loop"
    if not loop.is_symlink():
        loop.symlink_to(loop)
    (tmp_path / "dir").mkdir(exist_ok=True)
    (tmp_path / "unmounted").write_text("")
    (tmp_path / "full").write_text("x")
    return {
        "not-a-directory": "/etc/passwd/x",
        "missing": str(tmp_path / "missing"),
        "unmounted": str(tmp_path / "unmounted"),
        "loop": str(loop),
        "too-long": "/" + "x" * 300,
        "directory": str(tmp_path / "dir"),
        "regular-file": str(tmp_path / "full"),
        "mount-namespace": "/proc/self/ns/mnt",
    }


GONE = ("not-a-directory", "missing", "unmounted")
MISSING = ("not-a-directory", "missing")
"""Gone for DEL; ADD and CHECK answer code 3 for these, code 4 for the unmounted file (the
path exists and is no namespace)."""
INVALID = ("loop", "too-long", "directory", "regular-file", "mount-namespace")


@pytest.mark.parametrize("kind", GONE)
def test_a_path_that_names_nothing_is_a_gone_namespace(tmp_path, kind):
    assert netns.netns_lookup(_paths(tmp_path)[kind]) is None
    assert not netns.netns_exists(_paths(tmp_path)[kind])


@pytest.mark.parametrize("kind", INVALID)
def test_a_path_that_names_something_else_is_code_4(tmp_path, kind):
    with pytest.raises(InvalidEnvironmentError) as ei:
        netns.netns_lookup(_paths(tmp_path)[kind])
    assert ei.value.code == 4 and ei.value.msg.startswith(f"failed to open netns {_paths(tmp_path)[kind]}: ")


def test_a_namespace_path_is_its_identity():
    st = os.stat("/proc/self/ns/net")
    assert netns.netns_lookup("/proc/thread-self/ns/net") == (st.st_dev, st.st_ino)


def _node(tmp_path: Path) -> dict[str, Any]:
    write_slice(tmp_path / "slice.yaml", [device("nic-a", "eth9")], name="s")
    with StateStore(tmp_path / "state").transaction() as txn:
        txn.put(
            attachment(
                "c1",
                network="net",
                parent="eth9",
                netns="/run/netns/gone-pod",
                consumedCapacity={"bandwidth": "1G"},
            )
        )
    return netconf(name="net", stateDir=str(tmp_path / "state"), inventory=str(tmp_path / "slice.yaml"))


def _run(command: str, conf: dict[str, Any], netns_path: str) -> tuple[int, Any]:
    out = io.StringIO()
    code = run(
        {**cni_env(command, netns=netns_path), "PATH": "/usr/bin:/bin"}, json.dumps(conf).encode(), out
    )
    return code, json.loads(out.getvalue()) if out.getvalue().strip() else None


def _phases(tmp_path: Path) -> dict[str, str]:
    return {a.containerID: a.phase for a in StateStore(tmp_path / "state").read().attachments}


@pytest.mark.parametrize("kind", GONE)
def test_del_in_a_namespace_that_names_nothing_succeeds_and_releases(tmp_path, kind):
    conf = _node(tmp_path)
    assert _run("DEL", conf, _paths(tmp_path)[kind]) == (0, None)
    assert _phases(tmp_path) == {}


@pytest.mark.parametrize("kind", INVALID)
def test_del_with_an_unusable_netns_path_is_code_4_before_any_effect(tmp_path, kind):
    """No "deleting" intent is left for the next invocation to finish: nothing was done."""
    conf = _node(tmp_path)
    code, out = _run("DEL", conf, _paths(tmp_path)[kind])
    assert code == 1 and out["code"] == 4, out
    assert "Traceback" not in out["msg"]
    assert _phases(tmp_path) == {"c1": "ready"}


@pytest.mark.parametrize("command", ["ADD", "CHECK"])
@pytest.mark.parametrize("kind", GONE + INVALID)
def test_add_and_check_answer_3_or_4(tmp_path, command, kind):
    conf = _node(tmp_path)
    if command == "CHECK":
        conf["prevResult"] = {"cniVersion": "1.1.0", "interfaces": [], "ips": []}
        with StateStore(tmp_path / "state").transaction() as txn:  # the container CHECK asks about
            txn.put(attachment("c1", network="net", parent="eth9", netns=_paths(tmp_path)[kind]))
    code, out = _run(command, conf, _paths(tmp_path)[kind])
    assert code == 1 and out["code"] == (3 if kind in MISSING else 4), out
    assert _phases(tmp_path) == {"c1": "ready"}


@pytest.mark.parametrize("command", ["GC", "STATUS"])
def test_gc_and_status_with_such_records_answer_without_an_internal_error(tmp_path, command):
    """GC and STATUS take no CNI_NETNS; GC releases attachments recorded in such paths."""
    conf = _node(tmp_path)
    paths = _paths(tmp_path)
    with StateStore(tmp_path / "state").transaction() as txn:
        for kind, path in paths.items():
            txn.put(attachment(f"c-{kind}", network="net", parent="eth9", netns=path))
    if command == "GC":
        conf["cni.dev/valid-attachments"] = []
    code, out = _run(command, conf, "")
    assert out is None or out["code"] != 999, out
    if command == "GC":
        assert (code, out) == (0, None)
        assert _phases(tmp_path) == {}
