"""Helpers (no tests): a small CNI test bed shared by the conformance and ipvlan netns tests.

``Bed`` holds stand-in NICs (veth ends) in an inventory, a state dir and a host-local
data dir under ``tmp_path``, and builds configs for any spec version, link type and
IPAM kind. It reads the kernel with pyroute2 directly (not through cni_dra), so tests
judge the plugin against an independent view. Nothing here asserts.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from netns_tests.runner import cni_dra_status, run_plugin

__all__ = [
    "VERSIONS",
    "RICH_VERSIONS",
    "CHECK_VERSIONS",
    "IPAM_KINDS",
    "Bed",
    "addr_flags",
    "links_named",
    "sysctl_in_netns",
]

DRIVER = "net.cni-dra.dev"
VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
RICH_VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
"""Versions whose results have ``interfaces``/``ips`` (0.3.0 on)."""
CHECK_VERSIONS = ["0.4.0", "1.0.0", "1.1.0"]
IPAM_KINDS = ["l2", "host-local-v4", "host-local-v6", "host-local-dual", "static"]

V4_SUBNET = "198.51.100.0/24"  # TEST-NET-2
V6_SUBNET = "2001:db8:4::/64"  # documentation prefix


class Bed:
    """Stand-in NICs + inventory + state for one test."""

    def __init__(self, tmp_path: Path, make_parent_nic, make_netns, nics: int = 1, mtu: int | None = None) -> None:
        self.tmp = tmp_path
        self.parents = [make_parent_nic(mtu=mtu) for _ in range(nics)]
        self.devices = [f"nic-{i}" for i in range(nics)]
        self.make_netns = make_netns
        self.state_dir = tmp_path / "state"
        self.ipam_dir = tmp_path / "ipam"
        self.inventory = tmp_path / "slice.json"
        self.inventory.write_text(json.dumps({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "n"},
            "spec": {"driver": DRIVER, "nodeName": "n", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{
                         "name": dev, "allowMultipleAllocations": True,
                         "attributes": {"ifName": {"string": nic}},
                         "capacity": {"bandwidth": {"value": "10G", "requestPolicy": {"default": "1G"}}},
                     } for dev, nic in zip(self.devices, self.parents)]},
        }))

    def ipam(self, kind: str) -> dict[str, Any]:
        """The ``ipam`` object for ``kind`` (one of :data:`IPAM_KINDS`, or ``static-rc``)."""
        data = str(self.ipam_dir)
        if kind == "l2":
            return {}
        if kind == "host-local-v4":
            return {"type": "host-local", "dataDir": data, "ranges": [[{"subnet": V4_SUBNET}]],
                    "routes": [{"dst": "203.0.113.0/24"}]}
        if kind == "host-local-v6":
            return {"type": "host-local", "dataDir": data, "ranges": [[{"subnet": V6_SUBNET, "gateway": "2001:db8:4::1"}]]}
        if kind == "host-local-dual":
            return {"type": "host-local", "dataDir": data,
                    "ranges": [[{"subnet": V4_SUBNET}], [{"subnet": V6_SUBNET}]]}
        if kind == "static":
            return {"type": "static", "addresses": [{"address": "198.51.100.77/24", "gateway": "198.51.100.1"}],
                    "routes": [{"dst": "203.0.113.0/24", "gw": "198.51.100.1"}]}
        if kind == "static-rc":
            return {"type": "static"}
        raise ValueError(kind)

    def conf(self, version: str = "1.1.0", ipam: str | dict[str, Any] = "host-local-v4", name: str = "confnet",
             **kw: Any) -> dict[str, Any]:
        c: dict[str, Any] = {
            "cniVersion": version, "name": name, "type": "cni-dra",
            "stateDir": str(self.state_dir), "inventory": str(self.inventory),
            "capacity": {"requests": {"bandwidth": "1G"}},
        }
        ipam_obj = ipam if isinstance(ipam, dict) else self.ipam(ipam)
        if ipam_obj:
            c["ipam"] = ipam_obj
        c.update(kw)
        return c

    def run(self, command: str, conf: dict[str, Any], netns: str = "", cid: str = "", ifname: str = "eth0",
            cni_args: str | None = None, **kw: Any) -> tuple[int, dict[str, Any] | None, str]:
        cid = cid or uuid.uuid4().hex[:12]
        args = cni_args if cni_args is not None else f"IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID={cid}"
        return run_plugin(command, conf, container_id=cid, netns=netns, ifname=ifname, cni_args=args, **kw)

    def status(self) -> dict[str, Any]:
        return cni_dra_status(self.state_dir, self.inventory)

    def attachments(self) -> list[tuple[str, str]]:
        return sorted((a["containerID"], a["ifname"]) for a in self.status()["attachments"])

    def age_attachments(self, seconds: float = 3600.0) -> None:
        """Move every attachment's ``readyAt`` ``seconds`` back, as if the runtime's GC came
        that long after the ADD (GC spares attachments that became ready moments ago). A
        transaction of the state store, as a cni-dra process would make it."""
        import time

        from cni_dra.state import StateStore
        from cni_dra.state.models import ready_at

        with StateStore(self.state_dir).transaction() as state:
            for att in state.attachments:
                age_s = att.ready_age_s(time.time())
                att.readyAt = ready_at(time.time() - (age_s or 0.0) - seconds)

    def ipam_reservations(self, network: str = "confnet") -> list[str]:
        """Addresses host-local holds for ``network`` (its file names)."""
        d = self.ipam_dir / network
        if not d.exists():
            return []
        return sorted(p.name for p in d.iterdir() if p.name[0].isdigit() or ":" in p.name)


def links_named(netns: str | None = None) -> list[tuple[str, str | None]]:
    """(name, kind) of every link in ``netns`` (None: the host)."""
    from pyroute2 import IPRoute

    kw = {"netns": netns} if netns else {}
    with IPRoute(**kw) as ipr:
        out = []
        for msg in ipr.link("dump"):
            info = msg.get_attr("IFLA_LINKINFO")
            out.append((msg.get_attr("IFLA_IFNAME"), info.get_attr("IFLA_INFO_KIND") if info is not None else None))
    return out


def addr_flags(netns: str, ifname: str) -> dict[str, int]:
    """CIDR -> IFA flags (IFA_FLAGS, else ifa_flags) of each IPv6 address of ``ifname``."""
    import ipaddress

    from pyroute2 import IPRoute

    with IPRoute(netns=netns) as ipr:
        (idx,) = ipr.link_lookup(ifname=ifname)
        out = {}
        for msg in ipr.addr("dump", index=idx, family=10):
            cidr = str(ipaddress.ip_interface(f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}"))
            out[cidr] = msg.get_attr("IFA_FLAGS") or msg["flags"]
    return out


def sysctl_in_netns(netns: str, key: str) -> str:
    """Read ``/proc/sys/<key>`` inside ``netns`` (via a child process that enters it)."""
    import subprocess

    proc = subprocess.run(
        ["nsenter", f"--net={netns}", "cat", f"/proc/sys/{key}"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"reading {key} in {netns} failed: {proc.stderr}")
    return proc.stdout.strip()
