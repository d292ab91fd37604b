"""The agent's systemd units (``conf/systemd``): the socket the plugin looks for with a mode
only root can use, a service that keeps the node's namespaces (else the fast path declines
every caller), and both accepted by ``systemd-analyze verify``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cni_dra.fastpath.activation import FDNAME
from cni_dra.fastpath.wire import DEFAULT_SOCKET

UNITS = Path(__file__).resolve().parent.parent / "conf" / "systemd"
SOCKET = UNITS / "cni-dra-agent.socket"
SERVICE = UNITS / "cni-dra-agent.service"

# Each gives the service a mount namespace (or another namespace) of its own: the agent
# would then decline every caller (paths in their input name other objects).
NAMESPACING = (
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "PrivateNetwork",
    "PrivateMounts",
    "PrivateUsers",
    "PrivateIPC",
    "ReadOnlyPaths",
    "ReadWritePaths",
    "InaccessiblePaths",
    "TemporaryFileSystem",
    "BindPaths",
    "BindReadOnlyPaths",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectHostname",
    "ProtectProc",
    "ProcSubset",
    "RootDirectory",
    "RootImage",
    "NetworkNamespacePath",
    "JoinsNamespaceOf",
    "MountAPIVFS",
    "DynamicUser",
    "StateDirectory",
    "RuntimeDirectory",
    "LogsDirectory",
    "CacheDirectory",
    "ConfigurationDirectory",
)


def directives(path: Path) -> dict[str, list[str]]:
    """``Key=value`` lines of a unit file, by key (sections ignored, comments skipped)."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;[":
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_the_socket_is_the_plugins_and_only_root_can_use_it():
    d = directives(SOCKET)
    assert d["ListenStream"] == [DEFAULT_SOCKET]
    assert d["FileDescriptorName"] == [FDNAME]
    assert d["SocketUser"] == ["root"] and d["SocketGroup"] == ["root"]
    assert d["SocketMode"] == ["0600"] and d["DirectoryMode"] == ["0700"]
    assert d["WantedBy"] == ["sockets.target"]


def test_the_service_runs_the_installed_agent_without_kubernetes_in_the_nodes_namespaces():
    d = directives(SERVICE)
    assert d["ExecStart"] == [
        "/opt/cni/bin/cni-dra agent --no-kubernetes"
    ]  # install.sh rewrites the directory
    assert d["WorkingDirectory"] == ["/"]  # where runtimes run plugins: callers elsewhere are declined
    assert d["Requires"] == ["cni-dra-agent.socket"]
    assert not set(d) & set(NAMESPACING), set(d) & set(NAMESPACING)
    caps = d["CapabilityBoundingSet"][0].split()
    assert caps and set(caps) <= {"CAP_NET_ADMIN", "CAP_SYS_ADMIN"}, caps
    assert d["NoNewPrivileges"] == ["yes"]
    assert set(d["RestrictAddressFamilies"][0].split()) == {"AF_UNIX", "AF_NETLINK", "AF_INET", "AF_INET6"}


def render(tmp_path: Path) -> Path:
    """The units as ``scripts/install.sh units`` writes them for CNI_BIN_DIR=tmp/bin (the
    same substitution; the netns test runs the script itself), with an executable there."""
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "cni-dra"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    out = tmp_path / "units"
    out.mkdir()
    for unit in (SOCKET, SERVICE):
        (out / unit.name).write_text(
            unit.read_text().replace("ExecStart=/opt/cni/bin/cni-dra ", f"ExecStart={exe} ")
        )
    return out


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None and not os.environ.get("CI"),
    reason="systemd-analyze not installed (apt install systemd)",
)
def test_systemd_analyze_verifies_the_units(tmp_path):
    units = render(tmp_path)
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(units / u.name) for u in (SOCKET, SERVICE))],
        capture_output=True,
        text=True,
        cwd=units,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", (
        proc
    )  # warnings too (unknown keys)


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None and not os.environ.get("CI"),
    reason="systemd-analyze not installed (apt install systemd)",
)
def test_systemd_analyze_rejects_a_broken_unit(tmp_path):
    """The check above can fail: an unknown directive is reported."""
    units = render(tmp_path)
    service = units / SERVICE.name
    service.write_text(service.read_text().replace("UMask=0077", "UMask=0077\nProtectSystemm=strict"))
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(units / SOCKET.name), str(service)],
        capture_output=True,
        text=True,
        cwd=units,
        timeout=60,
    )
    assert "ProtectSystemm" in proc.stderr
