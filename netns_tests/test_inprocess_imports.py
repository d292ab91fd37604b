"""What a real in-process ADD and DEL of the installed plugin tree import.

The tree's Python executable runs as the compiled client runs it when the agent does not
serve (``CNI_DRA_AGENT=off``), with ``-X importtime`` added: the modules it imports are
read from that report. A structural guard of the no-agent start-up, not a timed one (see
docs/performance.md): no operator CLI library (click, kubernetes, grpc), no
``importlib.metadata`` (pydantic's plugin discovery), and pyroute2's submodules without
what its package ``__init__`` imports (IPDB, NDB, conntrack, ...) nor its asyncio ``IPRoute``
(the netlink layer's own blocking socket sends pyroute2's messages), no ``subprocess`` nor the ResourceClaim models, and
on DEL no result modules, resource.k8s.io/v1 models nor allocator. tests/test_inprocess_imports.py
checks the same without root, up to the first netlink call.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from netns_tests.bed import pod_args, tree_python
from netns_tests.runner import CNI_EXE

FORBIDDEN = ("click", "kubernetes", "grpc", "importlib.metadata")
PYROUTE2_UNUSED = ("pyroute2.ndb", "pyroute2.ipdb", "pyroute2.conntrack", "pyroute2.plan9", "pyroute2.ipset")
ASYNC_ENGINE = ("asyncio", "pyroute2.iproute", "pyroute2.netlink.nlsocket", "pyroute2.netlink.rtnl.iprsocket")
# Only the fallbacks of a long-lived process need them: subprocess (the IPAM starter uses
# posix_spawn), and on DEL the result modules (no IPAM result is parsed).
NOT_STARTED = ("subprocess",)
# The ResourceClaim models: the agent's and the CLI's; neither verb reads a claim.
NOT_IN_PROCESS = ("cni_dra.dra.claims",)
# (nor the resource.k8s.io/v1 models and the allocator: a recorded attachment needs neither).
NOT_ON_DEL = (
    "cni_dra.protocol.results",
    "cni_dra.dra.objects",
    "cni_dra.allocator.capacity",
    "cni_dra.allocator.select",
)
IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| ( *)(\S+)$", re.M)


def _importtime_exe(tmp: Path) -> str:
    """An executable that runs the tree's entry exactly as the compiled client does, plus
    ``-X importtime`` (its report goes to stderr)."""
    entry = Path(CNI_EXE).resolve().parent / "cni-dra.d" / "libexec" / "cni-dra"
    exe = tmp / "cni-dra-importtime"
    argv = " ".join([*tree_python(), "-X", "importtime", "-IS", str(entry)])
    exe.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
    exe.chmod(0o755)
    return str(exe)


def _imported(stderr: str) -> set[str]:
    return {m.group(2) for m in IMPORT_LINE.finditer(stderr)}


def test_in_process_add_and_del_import_what_they_use(make_node, make_netns, tmp_path):
    node = make_node(path="local")  # CNI_DRA_AGENT=off: the tree's interpreter does the work
    exe = _importtime_exe(tmp_path)
    ns, cid = make_netns(), uuid.uuid4().hex
    conf = node.conf("1G")
    for command in ("ADD", "DEL"):
        code, out, err = node.run(command, conf, netns=ns, cid=cid, cni_args=pod_args(cid), exe=exe)
        assert code == 0, (command, out, err[-3000:])
        imported = _imported(err)
        # not vacuous: the verb ran in-process and made netlink requests through pyroute2
        verb = "cni_dra.verbs.add" if command == "ADD" else "cni_dra.verbs.delete"
        went = {verb, "cni_dra.protocol.config", "pydantic", "pyroute2.netlink.rtnl.ifinfmsg"}
        assert went <= imported, command
        assert sorted(m for m in imported if m.split(".")[0] in FORBIDDEN or m.startswith(FORBIDDEN)) == []
        assert sorted(m for m in imported if m.startswith(PYROUTE2_UNUSED + ASYNC_ENGINE)) == [], command
        assert sorted(m for m in imported if m in NOT_STARTED) == [], command
        assert sorted(m for m in imported if m in NOT_IN_PROCESS) == [], command
        if command == "DEL":
            assert sorted(m for m in imported if m.startswith(NOT_ON_DEL)) == []
