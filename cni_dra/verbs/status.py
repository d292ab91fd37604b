"""STATUS: can this plugin serve ADD now?

Source: CNI spec 1.1.0 "STATUS: Check plugin status" (config version >= 1.1.0, gated by
the entry point with code 1). Exit 0 when the inventory is readable, at least one of its
NICs exists on the host, the kernel has every piece of traffic shaping when the network
shapes (``shaping`` not false), and the IPAM plugin (``ipam.type``) is ready. Otherwise:

* PluginNotAvailableError (50): the inventory cannot be read or validated, none of its
  NICs exists, the dhcp IPAM daemon's socket is absent (the reference dhcp plugin
  1.1.1 has no STATUS verb, so cni-dra checks the socket itself), or the network shapes
  and the kernel lacks a piece of it: ``plugin not available: the network shapes traffic
  ("shaping") and this kernel lacks ifb; load the kernel module ifb (modprobe ifb) or set
  "shaping": false in the network config`` (the pieces: ``ifb``, ``the tbf qdisc``
  (module sch_tbf), ``the ingress qdisc, u32 classifier or mirred action`` (sch_ingress,
  cls_u32, act_mirred)); every shaped ADD would fail with code 102 ``kernel lacks ...``;
* the IPAM plugin's own code (50 or 51 when it reports itself unavailable; its STATUS
  is forwarded when it speaks spec 1.1.0, skipped when it is older).

The shaping probe (:func:`shaping_lacks`) shapes ``lo`` of a throwaway network namespace
as ADD shapes a pod interface (:func:`cni_dra.netlink.shaping.probe_kernel`). Runtimes
call STATUS often (containerd on every CRI status call), so a kernel found complete is
remembered for the boot in ``<stateDir>/`` :data:`SHAPING_PROBE_FILE` (``{"bootID": ...,
"lacks": null}``): one probe per boot and state directory. A kernel found lacking a piece is
not remembered: every STATUS probes again (about 9 ms), so loading the module makes the
next STATUS pass. A state directory that fails the state's own checks (a
symlink, writable by group or others...) is not used: then every STATUS probes. With
``shaping: false`` nothing is probed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from cni_dra.attach.invocation import Invocation, ipam_codes
from cni_dra.errors import CniError, PluginNotAvailableError
from cni_dra.state import StateStore

if TYPE_CHECKING:
    from cni_dra.host.port import Host

__all__ = ["cmd_status", "DHCP_DEFAULT_SOCKET", "SHAPING_PROBE_FILE", "dhcp_socket_missing", "shaping_lacks"]

SHAPING_PROBE_FILE = "shaping-probe.json"
"""The kept answer of the shaping probe, in the state directory (module docstring)."""


DHCP_DEFAULT_SOCKET = "/run/cni/dhcp.sock"
"""Where the reference dhcp daemon listens unless ``ipam.daemonSocketPath`` says otherwise."""


def cmd_status(inv: Invocation) -> None:
    """Run STATUS for ``inv``. Raises PluginNotAvailableError (50) or the IPAM plugin's error."""
    from cni_dra.dra.objects import device_attribute

    conf, host = inv.conf, inv.host
    try:
        slice_ = inv.inventory
    except CniError as exc:
        raise PluginNotAvailableError(f"plugin not available: inventory {conf.inventory}: {exc.msg}") from exc
    names = [device_attribute(d, "ifName", slice_.spec.driver) for d in slice_.spec.devices]
    if not any(isinstance(n, str) and host.host_link(n) is not None for n in names):
        raise PluginNotAvailableError(
            f"plugin not available: none of the inventory's NICs exists on this host ({', '.join(map(str, names))})"
        )
    if conf.shaping is not None:
        _check_shaping(inv.store, host)
    if not conf.ipam_type:
        return
    with ipam_codes():
        forwarded = host.ipam_status(conf.ipam_type, inv.raw, inv.environ, inv.env.path)
    sock = None if forwarded else dhcp_socket_missing(conf.ipam.model_dump())
    if sock:
        raise PluginNotAvailableError(
            f"plugin not available: the dhcp IPAM daemon socket {sock} is absent "
            "(start the reference dhcp daemon: dhcp daemon)"
        )


def _check_shaping(store: StateStore, host: Host) -> None:
    """Raise PluginNotAvailableError (50) naming the piece of shaping the kernel lacks and the fix."""
    try:
        lacks = shaping_lacks(store, host)
    except CniError as exc:
        raise PluginNotAvailableError(
            f"plugin not available: cannot check the kernel's traffic control for shaping: {exc.msg}"
        ) from exc
    if lacks is None:
        return
    from cni_dra.netlink.shaping import KERNEL_PIECES

    modules = KERNEL_PIECES.get(lacks)
    if modules is None:
        load = "load the kernel module that provides it"
    elif len(modules) == 1:
        load = f"load the kernel module {modules[0]} (modprobe {modules[0]})"
    else:
        load = f"load the kernel modules {', '.join(modules)} (modprobe -a {' '.join(modules)})"
    raise PluginNotAvailableError(
        f'plugin not available: the network shapes traffic ("shaping") and this kernel lacks {lacks}; '
        f'{load} or set "shaping": false in the network config'
    )


def shaping_lacks(store: StateStore, host: Host) -> str | None:
    """The piece of shaping this kernel lacks (as ADD names it), or None: None when this
    boot's probe found the kernel complete (kept in ``store``'s directory), else
    :func:`cni_dra.netlink.shaping.probe_kernel`'s answer, kept there when it is None. A state directory that cannot be used (it fails the state's own
    checks: a symlink, writable by others...) or a file that cannot be read or written only
    costs a probe per call. Raises IOFailureError (5) / NetlinkError (102) when the probe
    itself fails.
    """
    from cni_dra.state.owner import boot_id

    boot = boot_id()
    try:
        path: Path | None = store.private_dir() / SHAPING_PROBE_FILE
    except CniError:
        path = None
    if path is not None and _complete_this_boot(path, boot):
        return None
    lacks = host.probe_shaping()
    if path is not None and lacks is None:
        _keep(path, {"bootID": boot, "lacks": None})
    return lacks


def _complete_this_boot(path: Path, boot: str) -> bool:
    """Whether ``path`` says this boot's probe found the kernel complete."""
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(kept, dict) and kept.get("bootID") == boot and "lacks" in kept and kept["lacks"] is None


def _keep(path: Path, doc: dict[str, object]) -> None:
    """Write ``doc`` to ``path`` (0600, a temporary file renamed); a failure is ignored."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def dhcp_socket_missing(ipam_conf: dict[str, object]) -> str | None:
    """For ``ipam.type`` dhcp: the daemon socket path (``ipam.daemonSocketPath``, default
    :data:`DHCP_DEFAULT_SOCKET`) when no socket is there; None otherwise or for other types."""
    if ipam_conf.get("type") != "dhcp":
        return None
    sock = str(ipam_conf.get("daemonSocketPath") or DHCP_DEFAULT_SOCKET)
    return None if _is_socket(sock) else sock


def _is_socket(path: str) -> bool:
    import stat

    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False
