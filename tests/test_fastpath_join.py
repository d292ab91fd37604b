"""The fast path's join of the node's mount namespace, without privileges: how import paths
are rewritten, what a join refuses, and a server whose worker processes are the only ones
serving (``join_mount_ns``), replaced when one dies. The join itself, from a mount
namespace of its own, is netns_tests/test_fastpath_container.py."""

from __future__ import annotations

import errno
import json
import os
import signal
import time

import pytest

from cni_dra.fastpath.client import ask_agent
from cni_dra.fastpath.join import join_mount_namespace, reroot_paths
from cni_dra.fastpath.server import start_fastpath


def test_import_paths_are_rewritten_under_the_longest_pinned_directory():
    pinned = {
        "/tree/lib/python3.11": 5,
        "/tree/lib/python3/dist-packages": 6,
        "/tree/lib/python3/dist-packages/x": 9,
    }
    got = reroot_paths(
        [
            "/tree/lib/python3.11",
            "/tree/lib/python3.11/lib-dynload",
            "",
            "/tree/lib/python3/dist-packages/cni_dra",
            "/tree/lib/python3/dist-packages/x/y",
            "/tree/lib/python3.11-other",
            "relative/dir",
            "/tree/lib/python311.zip",
        ],
        pinned,
    )
    assert got == [
        "/proc/self/fd/5",
        "/proc/self/fd/5/lib-dynload",
        "/proc/self/fd/6/cni_dra",
        "/proc/self/fd/9/y",
    ]


def test_joining_the_mount_namespace_one_is_in_changes_nothing():
    joined = join_mount_namespace("/proc/self/ns/mnt")
    assert joined.moved is False and joined.pinned == {} and joined.cwd == os.getcwd()


def test_a_namespace_of_another_kind_is_refused():
    with pytest.raises(OSError) as err:
        join_mount_namespace("/proc/self/ns/net")
    assert err.value.errno == errno.EINVAL and "is not a mount namespace" in str(err.value)


def _version(socket_path: str) -> tuple[int, bytes] | None:
    return ask_agent({b"CNI_COMMAND": b"VERSION"}, b'{"cniVersion": "1.0.0"}', socket_path, timeout_s=60)


def test_with_join_mount_ns_only_worker_processes_serve_and_a_dead_one_is_replaced(tmp_path):
    """The serving process runs threads, so it could not join a mount namespace: with
    ``join_mount_ns`` it starts no worker thread and its worker processes serve (here they
    join the namespace they are in, which changes nothing). One that dies is replaced:
    otherwise nobody would accept and each caller would wait for its timeout."""
    server = start_fastpath(str(tmp_path / "a" / "fp.sock"), processes=1, join_mount_ns="/proc/self/ns/mnt")
    try:
        assert server._workers == [] and server._thread is None
        (child,) = server._children
        answer = _version(server.socket_path)
        assert answer is not None and "1.1.0" in json.loads(answer[1])["supportedVersions"]
        assert server.served == 0  # this process served nothing
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while server._children[0] is child and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server._children[0] is not child and server._children[0].poll() is None
        answer = _version(server.socket_path)
        assert answer is not None and answer[0] == 0
    finally:
        server.stop()
    assert all(c.poll() is not None for c in server._children)
    assert not os.path.exists(server.socket_path)
