"""Root test: one ADD and one DEL open the pod's network namespace once and enter it at most once.

The installed executable runs in-process (``CNI_DRA_AGENT=off``) under
``strace -f -e trace=openat,setns``: the production host (:mod:`cni_dra.host.kernel`) opens
CNI_NETNS once per invocation and reuses that descriptor for the identity read and every
pod-side netlink call, and the verb's pod-side work shares one ``setns`` into it.
Expected values come from the kernel (``stat`` of the namespace file), never from cni_dra.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from netns_tests.runner import CNI_EXE

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")


def _traced(tmp_path: Path, verb: str) -> tuple[Path, Path]:
    """An executable that runs the installed plugin under strace, writing the trace to a file."""
    trace = tmp_path / f"{verb}.strace"
    wrapper = tmp_path / f"{verb}-under-strace"
    wrapper.write_text(
        f"#!/bin/sh\nexec {shutil.which('strace')} -f -qq -y -e trace=openat,setns -o {trace} {CNI_EXE}\n"
    )
    wrapper.chmod(0o755)
    return wrapper, trace


def _counts(trace: Path, netns_path: str) -> tuple[int, int]:
    """(openat of ``netns_path`` that succeeded, setns into its namespace) in ``trace``.
    ``strace -y`` shows a descriptor as the file it names: the namespace's mount point (the
    real path of ``netns_path``) or ``net:[inode]``."""
    names = {os.path.realpath(netns_path), f"net:[{os.stat(netns_path).st_ino}]"}
    opened = entered = 0
    for line in trace.read_text().splitlines():
        if re.search(rf'openat\([^,]+, "{re.escape(netns_path)}", .*\) = \d+', line):
            opened += 1
        # the call, also when another thread's call interrupts it ("<unfinished ...>")
        found = re.search(r"setns\(\d+<([^>]*)>, CLONE_NEWNET(\) = 0| <unfinished)", line)
        if found and found.group(1) in names:
            entered += 1
    return opened, entered


def test_add_and_del_open_the_pod_netns_once_and_enter_it_at_most_once(node, make_netns, tmp_path) -> None:
    pod = make_netns()
    counts = {}
    for verb in ("ADD", "DEL"):
        exe, trace = _traced(tmp_path, verb)
        code, out, err = node.run(verb, netns=pod, cid="c-handle", path="local", exe=str(exe))
        assert code == 0, (out, err)
        if verb == "ADD":
            assert out is not None and out["interfaces"][0]["sandbox"] == pod
        text = trace.read_text()
        assert "setns(" in text, text[-2000:]  # the trace saw the plugin's namespace switches
        counts[verb] = _counts(trace, pod)
    assert counts == {"ADD": (1, 1), "DEL": (1, 1)}, counts
