"""Builders of the documents unit tests feed cni-dra: CNI env, network config, ResourceSlice,
allocated ResourceClaim, state Attachment; and a stand-in for the agent's fast-path service.

Each returns a fresh plain value (dict, bytes or model) with the defaults most tests want;
keyword arguments name what a test changes. Nothing here touches the disk except
:func:`write_slice`, :func:`fake_agent` (its socket) and :func:`run_verb` (the network's
state directory), and nothing asserts.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni_dra.fastpath.wire import decode_frames

__all__ = [
    "DRIVER",
    "FakeAgent",
    "allocation_result",
    "attachment",
    "cni_env",
    "device",
    "fake_agent",
    "netconf",
    "netconf_bytes",
    "profile_config",
    "resource_claim",
    "resource_slice",
    "run_verb",
    "write_slice",
]

DRIVER = "net.cni-dra.dev"


# -- the runtime's side ------------------------------------------------------------------------
def cni_env(
    command: str = "ADD",
    *,
    container_id: str = "c1",
    netns: str = "/var/run/netns/x",
    ifname: str = "eth0",
    path: str = "/opt/cni/bin",
    args: str | None = None,
    **extra: str,
) -> dict[str, str]:
    """The CNI_* variables a runtime sets for ``command``; ``args`` sets CNI_ARGS (unset if
    None or empty), ``extra`` adds or overrides variables by name."""
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container_id,
        "CNI_NETNS": netns,
        "CNI_IFNAME": ifname,
        "CNI_PATH": path,
    }
    if args:
        env["CNI_ARGS"] = args
    env.update(extra)
    return env


def run_verb(host: Any, command: str, conf: dict[str, Any], **env: str) -> tuple[int, Any]:
    """Run the plugin's ``command`` in this process on ``host`` (a
    :class:`~tests.fake_host.FakeHost`) with ``conf`` on stdin and :func:`cni_env` ``(command,
    **env)``: (the exit code, what it printed parsed as JSON, None when it printed nothing)."""
    from cni_dra.cni import run

    out = io.StringIO()
    code = run(
        {**cni_env(command, **env), "PATH": "/usr/bin:/bin"}, json.dumps(conf).encode(), out, host=host
    )
    return code, json.loads(out.getvalue()) if out.getvalue().strip() else None


def netconf(version: str = "1.1.0", name: str = "net1", **kw: Any) -> dict[str, Any]:
    """A cni-dra network config: ``cniVersion``, ``name``, ``type`` and ``kw`` as given."""
    conf: dict[str, Any] = {"cniVersion": version, "name": name, "type": "cni-dra"}
    conf.update(kw)
    return conf


def netconf_bytes(version: str = "1.1.0", name: str = "net1", **kw: Any) -> bytes:
    """:func:`netconf` as the JSON bytes a runtime writes to stdin."""
    return json.dumps(netconf(version, name, **kw)).encode()


# -- ResourceSlice (the inventory) -----------------------------------------------------------
def device(
    name: str,
    ifname: str | None = None,
    bandwidth: str | None = "10G",
    *,
    shared: bool = True,
    request_policy: Mapping[str, Any] | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One ResourceSlice device: attribute ``ifName`` (default ``if-<name>``; ``attributes``
    adds more), capacity ``bandwidth`` (None: no capacity) with ``request_policy`` if given,
    ``allowMultipleAllocations`` when ``shared``."""
    dev: dict[str, Any] = {"name": name}
    if shared:
        dev["allowMultipleAllocations"] = True
    dev["attributes"] = {
        "ifName": {"string": ifname if ifname is not None else f"if-{name}"},
        **(attributes or {}),
    }
    if bandwidth is not None:
        cap: dict[str, Any] = {"value": bandwidth}
        if request_policy is not None:
            cap["requestPolicy"] = dict(request_policy)
        dev["capacity"] = {"bandwidth": cap}
    return dev


def resource_slice(
    devices: list[dict[str, Any]],
    *,
    driver: str = DRIVER,
    pool: str = "n",
    node: str | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceSlice of ``devices`` (see :func:`device`) for pool
    ``pool`` on node ``node`` (default: the pool's name), named ``name`` (default: the pool's)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or pool},
        "spec": {
            "driver": driver,
            "nodeName": node or pool,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def write_slice(path: Path, devices: list[dict[str, Any]], **kw: Any) -> Path:
    """Write :func:`resource_slice` as JSON to ``path``; returns ``path``."""
    path.write_text(json.dumps(resource_slice(devices, **kw)))
    return path


# -- ResourceClaim ----------------------------------------------------------------------------
def allocation_result(
    device: str,
    *,
    request: str = "net",
    driver: str = DRIVER,
    pool: str = "n",
    consumed: Mapping[str, str] | None = None,
    share_id: str | None = None,
) -> dict[str, Any]:
    """One ``status.allocation.devices.results`` entry; ``consumed`` becomes
    ``consumedCapacity`` and ``share_id`` ``shareID`` (each left out when None)."""
    result: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if consumed is not None:
        result["consumedCapacity"] = dict(consumed)
    if share_id is not None:
        result["shareID"] = share_id
    return result


def profile_config(
    source: str = "FromClaim", *, requests: list[str] | None = None, driver: str = DRIVER, **fields: Any
) -> dict[str, Any]:
    """One ``status.allocation.devices.config`` entry carrying an ``InterfaceConfig`` of
    ``fields`` (``linkType="ipvlan", mtu=9000``) for ``driver``; ``requests`` when given."""
    entry: dict[str, Any] = {
        "source": source,
        "opaque": {
            "driver": driver,
            "parameters": {"apiVersion": "net.cni-dra.dev/v1alpha1", "kind": "InterfaceConfig", **fields},
        },
    }
    if requests is not None:
        entry["requests"] = list(requests)
    return entry


def resource_claim(
    *results: dict[str, Any],
    uid: str = "u",
    name: str = "c",
    namespace: str = "ns",
    requests: list[dict[str, Any]] | None = None,
    reserved_for: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An allocated ResourceClaim with ``results`` (see :func:`allocation_result`); ``requests``
    fills ``spec.devices.requests``, ``reserved_for`` ``status.reservedFor`` and ``config``
    ``status.allocation.devices.config`` (see :func:`profile_config`) when given."""
    claim: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace, "uid": uid}}
    if requests is not None:
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            **claim,
            "spec": {"devices": {"requests": requests}},
        }
    claim["status"] = {"allocation": {"devices": {"results": list(results)}}}
    if config is not None:
        claim["status"]["allocation"]["devices"]["config"] = list(config)
    if reserved_for is not None:
        claim["status"]["reservedFor"] = reserved_for
    return claim


# -- state ------------------------------------------------------------------------------------
def attachment(
    cid: str = "c",
    device: str = "nic-a",
    *,
    network: str = "net1",
    ifname: str = "eth0",
    driver: str = DRIVER,
    pool: str = "n",
    parent: str | None = None,
    phase: str = "ready",
    **kw: Any,
) -> Any:
    """A state :class:`~cni_dra.state.schema.Attachment` of container ``cid`` on ``device``
    (parent NIC ``parent``, default ``if-<device>``), ``phase`` ready unless told; ``kw``
    sets any other field (``consumedCapacity``, ``linkType``, ``shareID``, ...)."""
    from cni_dra.state.schema import Attachment

    return Attachment(
        network=network,
        containerID=cid,
        ifname=ifname,
        driver=driver,
        pool=pool,
        device=device,
        parent=parent if parent is not None else f"if-{device}",
        phase=phase,
        **kw,
    )


# -- the agent's fast path ------------------------------------------------------------------
@dataclass
class FakeAgent:
    """What :func:`fake_agent` serves at ``path``, and what it saw: the frames of each request
    (:data:`cni_dra.fastpath.wire` request: identity, cwd, environment, stdin) and the number
    of connections accepted."""

    path: str
    answer: Callable[[list[bytes]], bytes | None]
    requests: list[list[bytes]] = field(default_factory=list)
    connections: int = 0


@contextlib.contextmanager
def fake_agent(directory: Path, answer: Callable[[list[bytes]], bytes | None]) -> Iterator[FakeAgent]:
    """A stand-in for the agent's fast-path service on ``directory``/fp.sock (``directory`` is
    created 0700): one thread accepts each connection, reads the request to its end, records
    it and sends ``answer(frames)`` (None: closes without a word). Stops on leaving."""
    directory.mkdir(mode=0o700)
    os.chmod(directory, 0o700)
    agent = FakeAgent(str(directory / "fp.sock"), answer)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(agent.path)
    sock.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                agent.connections += 1
                data = b""
                while chunk := conn.recv(1 << 16):
                    data += chunk
                frames = decode_frames(data, 4)
                agent.requests.append(frames)
                reply = agent.answer(frames)
                try:
                    if reply is not None:
                        conn.sendall(reply)
                except BrokenPipeError:  # the client gave up waiting
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        thread.join(timeout=5)


# -- waiting ----------------------------------------------------------------------------------
def wait_for(cond: Callable[[], Any], timeout_s: float = 30.0, what: str = "condition") -> Any:
    """Poll ``cond`` every 50 ms; return its first truthy value, or fail with AssertionError
    (naming ``what``) after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached in {timeout_s}s")


def share_ids() -> Callable[[], str]:
    """A generator of shareIDs for the allocator: the same lowercase UUIDs in the same order
    on every call (``00000000-0000-4000-8000-000000000001``, ...)."""
    n = itertools.count(1)
    return lambda: f"00000000-0000-4000-8000-{next(n):012d}"
