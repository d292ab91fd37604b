"""GC's rules for what it leaves alone, through the CNI entry point, without privileges.

Attachments here have no netns (no link to delete); their IPAM is a fake plugin (a shell
script on CNI_PATH) that logs each call, so the test sees which releases GC asked for and
which list the IPAM plugin's own GC got.
"""

from __future__ import annotations

import io
import json
import logging
import stat
import time
from pathlib import Path

import pytest

from cni_dra.cni import run
from cni_dra.state import Attachment, StateStore
from cni_dra.state.schema import STEP_IPAM, Owner, ready_at
from cni_dra.state.store import boot_id, current_owner
from cni_dra.verbs.gc import GRACE_S

NET = "gcnet"
IPAM_CONF = json.dumps({"cniVersion": "1.1.0", "name": NET, "type": "cni-dra", "ipam": {"type": "fake-ipam"}})


class Node:
    def __init__(self, tmp_path: Path) -> None:
        self.state_dir = tmp_path / "state"
        self.bin = tmp_path / "bin"
        self.calls = tmp_path / "ipam-calls"
        self.bin.mkdir()
        exe = self.bin / "fake-ipam"
        exe.write_text(
            "#!/bin/sh\n"
            'if [ "$CNI_COMMAND" = VERSION ]; then echo \'{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}\'; '
            "exit 0; fi\n"
            f'if [ "$CNI_COMMAND" = GC ]; then cat > {tmp_path}/ipam-gc.json; else cat >/dev/null; fi\n'
            f'echo "$CNI_COMMAND $CNI_CONTAINERID" >> {self.calls}\n'
        )
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
        self.gc_stdin = tmp_path / "ipam-gc.json"

    def put(self, *atts: Attachment) -> None:
        with StateStore(self.state_dir).transaction() as txn:
            txn.set_boot_id(boot_id())
            txn.put_all(atts)

    def left(self) -> list[str]:
        return sorted(
            f"{a.network}/{a.containerID}" for a in StateStore(self.state_dir).read_files().attachments
        )

    def ipam_calls(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def gc(self, **keys: object) -> tuple[int, str]:
        conf = {
            "cniVersion": "1.1.0",
            "name": NET,
            "type": "cni-dra",
            "stateDir": str(self.state_dir),
            "ipam": {"type": "fake-ipam"},
            **keys,
        }
        out = io.StringIO()
        code = run({"CNI_COMMAND": "GC", "CNI_PATH": str(self.bin)}, json.dumps(conf).encode(), out)
        return code, out.getvalue()


def att(
    cid: str,
    *,
    age_s: float | None = 3600.0,
    phase: str = "ready",
    network: str = NET,
    owner: Owner | None = None,
    steps: tuple[str, ...] = (),
) -> Attachment:
    """An attachment of ``network`` that became ready ``age_s`` ago (None: no readyAt, as
    attachments written before the field existed)."""
    return Attachment(
        network=network,
        containerID=cid,
        ifname="eth0",
        netns="",
        driver="d",
        pool="p",
        device="nic-a",
        parent="eth-a",
        consumedCapacity={"bandwidth": "1G"},
        phase=phase,
        owner=owner,
        steps=list(steps),
        ipamType="fake-ipam",
        ipamConf=IPAM_CONF,
        readyAt=None if age_s is None else ready_at(time.time() - age_s),
    )


DEAD = Owner(pid=2**22 + 7, start=1, boot=boot_id())  # no such process: a stale intent


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


@pytest.fixture
def records():
    got: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = got.append  # type: ignore[method-assign]
    logger = logging.getLogger("cni_dra")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield got
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


EVERYONE = [
    "gcnet/busy",
    "gcnet/crashed",
    "gcnet/kept",
    "gcnet/legacy",
    "gcnet/old",
    "gcnet/young",
    "other/old",
]


def _populate(node: Node) -> None:
    node.put(
        att("old"),
        att("legacy", age_s=None),
        att("young", age_s=5),
        att("kept"),
        att("busy", phase="adding", age_s=None, owner=current_owner()),
        att("crashed", phase="adding", age_s=None, owner=DEAD, steps=(STEP_IPAM,)),
        att("old", network="other"),
    )


def test_gc_without_a_list_collects_nothing(node: Node, records) -> None:
    """Neither cni.dev/valid-attachments nor cni.dev/attachments: an absent list says nothing
    about what is stale. Exit 0, nothing released (not even the IPAM plugin's own GC, nor
    recovery of a crashed ADD), and a log line says why."""
    _populate(node)
    code, out = node.gc()
    assert (code, out) == (0, "")
    assert node.left() == EVERYONE
    assert node.ipam_calls() == [] and not node.gc_stdin.exists()
    assert any(
        "nothing collected" in r.getMessage() and "cni.dev/valid-attachments" in r.getMessage()
        for r in records
        if r.levelno >= logging.WARNING
    )


@pytest.mark.parametrize("key", ["cni.dev/valid-attachments", "cni.dev/attachments"])
def test_gc_with_a_list_spares_what_is_in_progress_or_young(node: Node, key: str) -> None:
    """Collected: this network's ready attachments not listed and older than the grace
    period (or of unknown age), and a crashed ADD (recovery). Spared: the listed one, an ADD
    in progress, one that became ready moments ago, other networks. The IPAM plugin's GC
    gets the runtime's list plus the spared ones."""
    _populate(node)
    code, out = node.gc(**{key: [{"containerID": "kept", "ifname": "eth0"}]})
    assert (code, out) == (0, "")
    assert node.left() == ["gcnet/busy", "gcnet/kept", "gcnet/young", "other/old"]
    assert sorted(node.ipam_calls()) == ["DEL crashed", "DEL legacy", "DEL old", "GC "]
    valid = json.loads(node.gc_stdin.read_text())[key]
    assert sorted(a["containerID"] for a in valid) == ["busy", "kept", "young"]


def test_gc_collects_an_attachment_once_the_grace_period_is_over(node: Node) -> None:
    node.put(att("almost", age_s=GRACE_S - 30), att("past", age_s=GRACE_S + 30))
    assert node.gc(**{"cni.dev/valid-attachments": []}) == (0, "")
    assert node.left() == ["gcnet/almost"]


def test_gc_with_an_empty_list_still_collects_everything_old(node: Node) -> None:
    """``[]`` is a list: nothing of this network is valid (CNI spec), unlike an absent list."""
    node.put(att("a"), att("b"))
    assert node.gc(**{"cni.dev/valid-attachments": []}) == (0, "")
    assert node.left() == []


def test_gc_spares_an_attachment_whose_clock_went_back(node: Node) -> None:
    """readyAt in the future (the wall clock was stepped back): its age is unknown, so it is
    treated as young rather than destroyed."""
    node.put(att("future", age_s=-3600))
    assert node.gc(**{"cni.dev/valid-attachments": []}) == (0, "")
    assert node.left() == ["gcnet/future"]


def test_disable_gc_makes_gc_a_no_op(node: Node, records) -> None:
    _populate(node)
    code, out = node.gc(disableGC=True, **{"cni.dev/valid-attachments": []})
    assert (code, out) == (0, "")
    assert node.left() == EVERYONE
    assert node.ipam_calls() == []
    assert any("disableGC" in r.getMessage() for r in records)


def test_older_state_without_ready_times_still_reads(node: Node) -> None:
    """An attachment written before ``readyAt`` existed reads back (the field is optional)."""
    node.put(att("legacy", age_s=None))
    raw = (node.state_dir / "state.json").read_bytes() + b"".join(
        p.read_bytes() for p in [node.state_dir / "state.journal"] if p.exists()
    )
    assert b"readyAt" not in raw
    (only,) = StateStore(node.state_dir).read_files().attachments
    assert only.readyAt is None and only.ready_age_s(time.time()) is None


def test_ready_at_round_trips_through_the_journal(node: Node) -> None:
    """Set the way ADD sets it (an assignment in a transaction), it reaches a fresh reader
    through a journal record."""
    node.put(att("a", age_s=None))
    now = time.time()
    with StateStore(node.state_dir).transaction() as txn:
        txn.update((NET, "a", "eth0"), readyAt=ready_at(now - 10))
    assert b'"readyAt"' in (node.state_dir / "state.journal").read_bytes()
    (a,) = StateStore(node.state_dir).read_files().attachments
    assert 9.9 < a.ready_age_s(now) < 10.1


@pytest.mark.parametrize(
    "entries",
    [
        [{"containerID": "kept"}, {"containerID": "old"}],
        [{"containerID": "kept", "ifname": "eth0"}, {"ifname": "eth0"}],
        [{"containerID": "kept", "ifname": "eth0"}, {"containerID": "old", "ifname": ""}],
    ],
)
def test_gc_refuses_a_list_with_an_entry_that_names_no_attachment(node: Node, entries) -> None:
    """An entry without its containerID or ifname would name nothing, and GC collects what its
    list does not name: the whole GC is refused (code 7, naming the entry), nothing collected."""
    node.put(att("old"), att("kept"))
    code, out = node.gc(**{"cni.dev/valid-attachments": entries})
    assert code == 1 and json.loads(out)["code"] == 7
    assert "cni.dev/valid-attachments: entry " in json.loads(out)["msg"]
    assert node.left() == ["gcnet/kept", "gcnet/old"]
    assert node.ipam_calls() == []


def test_gc_matches_the_list_keys_in_any_case(node: Node) -> None:
    """containerd and CRI-O write the list through libcni (Go), which reads ``IfName`` or
    ``CONTAINERID`` as the fields they name: so does GC."""
    node.put(att("old"), att("kept"))
    code, out = node.gc(**{"cni.dev/valid-attachments": [{"ContainerID": "kept", "IfName": "eth0"}]})
    assert (code, out) == (0, "")
    assert node.left() == ["gcnet/kept"]


@pytest.mark.parametrize("name", [NET, "cni-dra-repair"])
def test_gc_never_collects_repair_placeholders(node: Node, name: str) -> None:
    """``state repair``'s placeholders (network ``cni-dra-repair``) charge a live link no
    record tracks: only the DEL of that link's pod releases them, whatever network a GC names."""
    from cni_dra.attach.rebuild import REPAIR_NETWORK

    node.put(att("repair-pod", network=REPAIR_NETWORK))
    assert node.gc(name=name, **{"cni.dev/valid-attachments": []}) == (0, "")
    assert node.left() == ["cni-dra-repair/repair-pod"]
