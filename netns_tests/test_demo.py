"""The demo sequence (README "Demo", scripts/demo.sh) as a test, through the installed executable.

Same steps as scripts/demo.sh, driven with netns_tests/runner.py (env + stdin, as a
runtime): two stand-in NICs of 10G (requestPolicy default 1G, validRange min 100M
step 100M), pods asking 4G, 3G, 10G, 8G, then a prepared claim on eth-b for 6G.
Each placement is judged twice: by the attachment's device in ``cni-dra status
--json`` and by the kernel (the pod link's parent ifindex). Expected values are
the demo's, written out here, never computed by cni-dra.

The node is a :class:`netns_tests.bed.NodeBed`. Device names (eth-a, eth-b) differ from the host interface names (random veth
names from ``make_parent_nic``), so the inventory's name -> ifName mapping is
exercised too.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from netns_tests.bed import DRIVER, NodeBed
from netns_tests.runner import (
    cni_dra_cli,
    cni_dra_status,
    host_ifindex,
    k8s_cni_args,
    link_in_netns,
    run_plugin,
)
from tests.builders import allocation_result, resource_claim

POOL = "demo-node"
SUBNET = "192.0.2.0/24"  # TEST-NET-1: documentation addresses, never routed
IFNAME = "net1"


def _pod_uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def _claim(pod_uid: str, device: str, bandwidth: str, share_id: str) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaim as the API server returns it once allocated."""
    return resource_claim(
        allocation_result(
            device, request=IFNAME, pool=POOL, consumed={"bandwidth": bandwidth}, share_id=share_id
        ),
        uid="5c1a1e00-0000-4000-8000-000000000005",
        name="pod5-net",
        namespace="demo",
        requests=[
            {
                "name": IFNAME,
                "exactly": {
                    "deviceClassName": DRIVER,
                    "allocationMode": "ExactCount",
                    "count": 1,
                    "capacity": {"requests": {"bandwidth": bandwidth}},
                },
            }
        ],
        reserved_for=[{"resource": "pods", "name": "pod5", "uid": pod_uid}],
    )


def _names_remaining(text: str, names: tuple[str, ...], quantity: str) -> bool:
    """True when ``quantity`` appears as a token within 30 characters of a mention
    of the NIC (by device name or ifName) in an error text."""
    token = re.compile(rf"(?<![\w.]){re.escape(quantity)}(?![\w.])")
    for name in names:
        for m in re.finditer(re.escape(name), text):
            window = text[max(0, m.start() - 30) : m.end() + 30]
            if token.search(window):
                return True
    return False


class Demo:
    """The demo's node: two stand-in NICs, one inventory, one state dir, pods as netns."""

    def __init__(self, make_netns, make_parent_nic, tmp_path: Path) -> None:
        self.make_netns = make_netns
        self.node = NodeBed(
            tmp_path,
            [make_parent_nic(), make_parent_nic()],
            devices=["eth-a", "eth-b"],
            pool=POOL,
            network="cni-dra-demo",
            version="1.1.0",
        )
        self.nics = self.node.parents
        self.state_dir = self.node.state_dir
        self.ipam_dir = self.node.ipam_dir
        self.inventory = self.node.inventory
        self.netns: dict[str, str] = {}

    def conf(
        self,
        bandwidth: str | None,
        policy: str = "best-fit",
        state_dir: Path | None = None,
        ipam_dir: Path | None = None,
    ) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "cniVersion": "1.1.0",
            "name": "cni-dra-demo",
            "type": "cni-dra",
            "driver": DRIVER,
            "stateDir": str(state_dir or self.state_dir),
            "inventory": str(self.inventory),
            "linkType": "macvlan",
            "mode": "bridge",
            "selectionPolicy": policy,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": SUBNET}]],
                "dataDir": str(ipam_dir or self.ipam_dir),
            },
        }
        if bandwidth is not None:
            conf["capacity"] = {"requests": {"bandwidth": bandwidth}}
        return conf

    def run(self, command: str, pod: int, conf: dict[str, Any], netns: str | None = None):
        if netns is None:
            netns = self.netns.setdefault(f"pod{pod}", self.make_netns())
        return run_plugin(
            command,
            conf,
            container_id=f"ctr-pod{pod}",
            netns=netns,
            ifname=IFNAME,
            cni_args=k8s_cni_args(
                namespace="demo", name=f"pod{pod}", uid=_pod_uid(pod), infra_container_id=f"ctr-pod{pod}"
            ),
        )

    def status(self, state_dir: Path | None = None) -> dict[str, Any]:
        return cni_dra_status(state_dir or self.state_dir, self.inventory)

    def attachment(self, pod: int, state_dir: Path | None = None) -> dict[str, Any]:
        found = [a for a in self.status(state_dir)["attachments"] if a["containerID"] == f"ctr-pod{pod}"]
        assert len(found) == 1, f"pod{pod}: want one attachment in status, got {found}"
        return found[0]

    def remaining(self) -> dict[str, str]:
        return {d["name"]: d["remaining"].get("bandwidth") for d in self.status()["devices"]}

    def consumed(self) -> dict[str, str]:
        return {d["name"]: d["consumed"].get("bandwidth") for d in self.status()["devices"]}

    def parent_of(self, pod: int) -> int | None:
        link = link_in_netns(self.netns[f"pod{pod}"], IFNAME)
        assert link is not None, f"pod{pod}: no {IFNAME} in its netns"
        assert link["kind"] == "macvlan"
        return link["parent_ifindex"]

    def add_ok(self, pod: int, bandwidth: str | None, policy: str = "best-fit") -> dict[str, Any]:
        code, out, err = self.run("ADD", pod, self.conf(bandwidth, policy))
        assert code == 0, f"pod{pod} ADD failed: {out} {err}"
        assert out is not None and out.get("ips"), f"pod{pod}: result without ips: {out}"
        return out

    def del_ok(self, pod: int) -> None:
        code, out, err = self.run("DEL", pod, self.conf("1G"))
        assert code == 0, f"pod{pod} DEL failed: {out} {err}"


@pytest.fixture
def demo(make_netns, make_parent_nic, tmp_path) -> Demo:
    return Demo(make_netns, make_parent_nic, tmp_path)


def test_demo_sequence(demo: Demo, tmp_path: Path) -> None:
    eth_a_idx, eth_b_idx = host_ifindex(demo.nics["eth-a"]), host_ifindex(demo.nics["eth-b"])
    assert demo.remaining() == {"eth-a": "10G", "eth-b": "10G"}

    # pod1 asks 4G: both NICs empty, best-fit tie broken by name -> eth-a.
    demo.add_ok(1, "4G")
    assert demo.attachment(1)["device"] == "eth-a"
    assert demo.parent_of(1) == eth_a_idx
    assert demo.remaining() == {"eth-a": "6G", "eth-b": "10G"}

    # pod2 asks 3G: least-allocated would pick eth-b (tried on a scratch copy of
    # the state and IPAM data, then undone) ...
    scratch_state, scratch_ipam = tmp_path / "state-scratch", tmp_path / "ipam-scratch"
    shutil.copytree(demo.state_dir, scratch_state)
    shutil.copytree(demo.ipam_dir, scratch_ipam)
    scratch_ns = demo.make_netns()
    scratch_conf = demo.conf("3G", "least-allocated", scratch_state, scratch_ipam)
    code, out, err = demo.run("ADD", 2, scratch_conf, netns=scratch_ns)
    assert code == 0, f"scratch least-allocated ADD failed: {out} {err}"
    assert demo.attachment(2, scratch_state)["device"] == "eth-b"
    assert link_in_netns(scratch_ns, IFNAME)["parent_ifindex"] == eth_b_idx
    code, out, err = demo.run("DEL", 2, scratch_conf, netns=scratch_ns)
    assert code == 0, f"scratch DEL failed: {out} {err}"
    # ... and the real books did not see it; best-fit packs eth-a.
    assert demo.remaining() == {"eth-a": "6G", "eth-b": "10G"}
    demo.add_ok(2, "3G")
    assert demo.attachment(2)["device"] == "eth-a"
    assert demo.parent_of(2) == eth_a_idx
    assert demo.remaining() == {"eth-a": "3G", "eth-b": "10G"}

    # pod3 asks 10G -> only eth-b fits.
    demo.add_ok(3, "10G")
    assert demo.attachment(3)["device"] == "eth-b"
    assert demo.parent_of(3) == eth_b_idx
    assert demo.remaining() == {"eth-a": "3G", "eth-b": "0"}

    # pod4 asks 8G -> refused with a CNI error naming the request and what each NIC has left.
    code, out, err = demo.run("ADD", 4, demo.conf("8G"))
    assert code != 0
    assert out is not None and isinstance(out.get("code"), int) and out["code"] != 0, (out, err)
    text = f"{out.get('msg', '')} {out.get('details', '')}"
    assert "8G" in text, text
    assert _names_remaining(text, ("eth-a", demo.nics["eth-a"]), "3G"), text
    assert _names_remaining(text, ("eth-b", demo.nics["eth-b"]), "0"), text
    assert link_in_netns(demo.netns["pod4"], IFNAME) is None
    assert demo.remaining() == {"eth-a": "3G", "eth-b": "0"}

    demo.del_ok(3)
    assert link_in_netns(demo.netns["pod3"], IFNAME) is None
    assert demo.remaining() == {"eth-a": "3G", "eth-b": "10G"}

    # pod5: prepared claim allocated on eth-b with 6G and a shareID -> claim mode.
    share_id = "3f2c1b0a-9e8d-4c7b-a6f5-e4d3c2b1a098"
    claim_file = tmp_path / "pod5-claim.json"
    claim_file.write_text(json.dumps(_claim(_pod_uid(5), "eth-b", "6G", share_id)))
    env = {"CNI_DRA_STATE_DIR": str(demo.state_dir), "CNI_DRA_INVENTORY": str(demo.inventory)}
    proc = cni_dra_cli("claims", "prepare", "--pod-uid", _pod_uid(5), str(claim_file), env=env)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    demo.add_ok(5, None)
    att = demo.attachment(5)
    assert att["device"] == "eth-b"
    assert att["shareID"] == share_id
    assert att["consumedCapacity"] == {"bandwidth": "6G"}
    assert demo.parent_of(5) == eth_b_idx
    assert demo.remaining() == {"eth-a": "3G", "eth-b": "4G"}

    # Delete everything: capacity back to zero, links gone, no IP still reserved.
    for pod in (1, 2, 5):
        demo.del_ok(pod)
        assert link_in_netns(demo.netns[f"pod{pod}"], IFNAME) is None
    proc = cni_dra_cli("claims", "unprepare", "--pod-uid", _pod_uid(5), env=env)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert demo.consumed() == {"eth-a": "0", "eth-b": "0"}
    assert demo.remaining() == {"eth-a": "10G", "eth-b": "10G"}
    assert demo.status()["attachments"] == []
    reserved = [
        p.name
        for p in demo.ipam_dir.rglob("*")
        if p.is_file() and p.name != "lock" and not p.name.startswith("last_reserved_ip")
    ]
    assert reserved == []
