"""Drive the installed cni-dra executable exactly as a container runtime does.

A runtime (containerd, CRI-O, via libcni) runs the plugin binary found on
``CNI_PATH`` with the CNI_* variables in its environment and the network
configuration as JSON on stdin, then reads one JSON document from stdout (the
result, or an error object with ``code``/``msg``/``details``) and judges success
by the exit status (CNI spec 1.1.0, sections "Parameters" and "Result").

Nothing here asserts: the helpers return what happened and the tests judge it.
They run the executable in a subprocess (never ``cni_dra`` in-process), so the
tests cover the install layout too.

Link helpers use pyroute2 (never ``ip`` output) to read what the plugin made.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "write_shared_nic_inventory",
    "CNI_EXE",
    "CNI_PATH",
    "K8S_CNI_ARGS",
    "k8s_cni_args",
    "run_plugin",
    "cni_dra_cli",
    "cni_dra_status",
    "host_ifindex",
    "link_in_netns",
]

# The installed executable and plugin dir, as a runtime sees them. The env
# overrides exist for trying the harness against another build; CI uses the defaults.
CNI_EXE = os.environ.get("CNI_DRA_TEST_EXE", "/opt/cni/bin/cni-dra")
CNI_PATH = os.environ.get("CNI_DRA_TEST_CNI_PATH", "/opt/cni/bin")
# What containerd and CRI-O send for a Kubernetes pod (CNI_ARGS).
K8S_CNI_ARGS = (
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=c;K8S_POD_UID=u"
)
# A runtime's environment is its own; keep ours minimal and explicit so that
# nothing from the test process (PYTHONPATH, a venv) leaks into the plugin.
# CNI_DRA_STATE_VERIFY=1: every state commit of the plugin is re-read from scratch and
# compared with memory (cni_dra.state.store), so a change the journal missed fails the test.
_BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "CNI_DRA_STATE_VERIFY": "1",
}
_TIMEOUT_S = 60


def k8s_cni_args(*, namespace: str, name: str, uid: str, infra_container_id: str) -> str:
    """CNI_ARGS as a kubelet-driven runtime builds them for one pod sandbox.

    Returns ``"IgnoreUnknown=1;K8S_POD_NAMESPACE=..;K8S_POD_NAME=..;
    K8S_POD_INFRA_CONTAINER_ID=..;K8S_POD_UID=.."``.
    """
    return (
        f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};"
        f"K8S_POD_INFRA_CONTAINER_ID={infra_container_id};K8S_POD_UID={uid}"
    )


def run_plugin(
    command: str,
    conf: Mapping[str, Any],
    *,
    container_id: str,
    netns: str,
    ifname: str,
    cni_args: str | None = K8S_CNI_ARGS,
    cni_path: str = CNI_PATH,
    exe: str = CNI_EXE,
    extra_env: Mapping[str, str] | None = None,
    timeout_s: float = _TIMEOUT_S,
) -> tuple[int, dict[str, Any] | None, str]:
    """Run ``exe`` once as a runtime would and return ``(exit_code, stdout_json, stderr)``.

    ``command`` is the CNI_COMMAND (ADD, DEL, CHECK, VERSION, ...); ``conf`` is the
    network configuration written as JSON to stdin (for a conflist, one plugin's
    config with ``name``/``cniVersion``/``prevResult`` injected as libcni does).
    ``netns`` may be ``""`` (DEL allows an empty CNI_NETNS); ``cni_args=None``
    leaves CNI_ARGS unset. ``stdout_json`` is the parsed stdout, or ``None`` when
    stdout was empty or not JSON (the raw text is then appended to ``stderr``
    after a marker, so a failing test shows it). ``timeout_s`` bounds the run (a
    loaded machine needs more). Asserts nothing.
    """
    env = dict(_BASE_ENV)
    env.update(
        {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container_id,
            "CNI_NETNS": netns,
            "CNI_IFNAME": ifname,
            "CNI_PATH": cni_path,
        }
    )
    if cni_args is not None:
        env["CNI_ARGS"] = cni_args
    if extra_env:
        env.update(extra_env)
    proc = subprocess.run(
        [exe],
        input=json.dumps(conf).encode(),
        env=env,
        capture_output=True,
        timeout=timeout_s,
        check=False,
    )
    out = proc.stdout.decode(errors="replace")
    err = proc.stderr.decode(errors="replace")
    parsed: dict[str, Any] | None = None
    if out.strip():
        try:
            parsed = json.loads(out)
        except json.JSONDecodeError:
            err += f"\n--- stdout (not JSON) ---\n{out}"
    return proc.returncode, parsed, err


def cni_dra_cli(
    *args: str,
    exe: str = CNI_EXE,
    input_text: str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the operator CLI (``exe ARGS...`` without CNI_COMMAND); asserts nothing.

    ``env`` adds variables (e.g. the ``CNI_DRA_STATE_DIR``/``CNI_DRA_INVENTORY``
    twins of ``--state-dir``/``--inventory``) to a minimal environment.
    """
    return subprocess.run(
        [exe, *args],
        input=input_text,
        env={**_BASE_ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        check=False,
    )


def cni_dra_status(
    state_dir: str | os.PathLike[str], inventory: str | os.PathLike[str], *, exe: str = CNI_EXE
) -> dict[str, Any]:
    """``cni-dra status --state-dir DIR --inventory FILE --json``, parsed.

    Shape (README "Architecture", ``status --json``): ``{"devices": [{"name", "ifName", "capacity",
    "consumed", "remaining"}], "attachments": [{"podUID", "containerID", "ifname",
    "netns", "device", "consumedCapacity", "shareID"}]}``, quantities as canonical
    Kubernetes quantity strings. Raises ``RuntimeError`` (with stderr) when the CLI
    exits non-zero or prints no JSON, since nothing can be judged then.
    """
    proc = cni_dra_cli(
        "status",
        "--state-dir",
        os.fspath(state_dir),
        "--inventory",
        os.fspath(inventory),
        "--json",
        exe=exe,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"cni-dra status exited {proc.returncode}: {proc.stderr}{proc.stdout}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"cni-dra status --json printed no JSON: {proc.stdout!r}") from exc


def host_ifindex(ifname: str) -> int | None:
    """ifindex of ``ifname`` in the test process's (host) netns, or None if absent."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=ifname)
    return found[0] if found else None


def link_in_netns(netns: str, ifname: str) -> dict[str, Any] | None:
    """What the kernel says about ``ifname`` inside the netns at path ``netns``.

    Returns None when the netns file or the link does not exist, else
    ``{"ifname", "kind", "parent_ifindex", "mtu", "mac", "ipv4": [CIDR...],
    "ipv6": [CIDR...]}``. ``parent_ifindex`` is IFLA_LINK: for a macvlan moved
    into a netns it is the parent's ifindex in the host netns.
    """
    if not os.path.exists(netns):
        return None
    from pyroute2 import IPRoute

    with IPRoute(netns=netns) as ipr:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            return None
        link = ipr.link("get", index=found[0])[0]
        addrs = ipr.addr("dump", index=found[0])
    linkinfo = link.get_attr("IFLA_LINKINFO")
    kind = linkinfo.get_attr("IFLA_INFO_KIND") if linkinfo is not None else None
    ipv4, ipv6 = [], []
    for a in addrs:
        cidr = f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}"
        if a["family"] == 2:
            ipv4.append(cidr)
        elif a["family"] == 10 and not cidr.startswith("fe80:"):
            ipv6.append(cidr)
    return {
        "ifname": link.get_attr("IFLA_IFNAME"),
        "kind": kind,
        "parent_ifindex": link.get_attr("IFLA_LINK"),
        "mtu": link.get_attr("IFLA_MTU"),
        "mac": link.get_attr("IFLA_ADDRESS"),
        "ipv4": ipv4,
        "ipv6": ipv6,
    }


def write_shared_nic_inventory(
    path: Path,
    parents: dict[str, str],
    bandwidth: str = "10G",
    driver: str = "net.cni-dra.dev",
    *,
    request_policy: dict[str, Any] | None = None,
    pool: str = "n",
) -> Path:
    """Write a resource.k8s.io/v1 ResourceSlice (pool and node ``pool``) to ``path``: one shared
    device per ``parents`` entry (device name → host ifName), ``bandwidth`` each, with
    ``request_policy`` (default: the demo's, default 1G, validRange min 100M step 100M).
    Returns ``path``."""
    policy = (
        request_policy
        if request_policy is not None
        else {"default": "1G", "validRange": {"min": "100M", "step": "100M"}}
    )
    devices = [
        {
            "name": dev,
            "allowMultipleAllocations": True,
            "attributes": {"ifName": {"string": ifname}},
            "capacity": {"bandwidth": {"value": bandwidth, "requestPolicy": policy}},
        }
        for dev, ifname in parents.items()
    ]
    path.write_text(
        json.dumps(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": pool},
                "spec": {
                    "driver": driver,
                    "nodeName": pool,
                    "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices,
                },
            }
        )
    )
    return path
