"""The operator CLI (click): a thin shell over library calls.

Commands: ``status``, ``claims prepare|unprepare``, ``inventory discover``. Every option
has an environment twin (``CNI_DRA_STATE_DIR``, ``CNI_DRA_INVENTORY``, ...). Errors print
``Type: message`` on stderr and exit non-zero.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from cni_dra.errors import CniError
from cni_dra.quantity import Quantity
from cni_dra.protocol.config import DEFAULT_DRIVER, DEFAULT_INVENTORY, DEFAULT_STATE_DIR

__all__ = ["cli"]

STATE_DIR_OPT = click.option(
    "--state-dir", envvar="CNI_DRA_STATE_DIR", default=DEFAULT_STATE_DIR, show_default=True,
    help="Directory of the node state (the plugin config's stateDir).",
)
INVENTORY_OPT = click.option(
    "--inventory", envvar="CNI_DRA_INVENTORY", default=DEFAULT_INVENTORY, show_default=True,
    help="The node's ResourceSlice file (the plugin config's inventory).",
)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CniError as exc:
            click.echo(f"{type(exc).__name__}: {exc.msg}", err=True)
            if exc.details:
                click.echo(f"  {exc.details}", err=True)
            ctx.exit(1)


@click.group(cls=_Group)
@click.version_option(package_name="cni-dra")
def cli() -> None:
    """cni-dra: CNI plugin and node tools for sharing NICs by bandwidth (Kubernetes DRA, KEP-5075)."""


# -- status -------------------------------------------------------------------------------
def status_report(state_dir: str, inventory: str) -> dict[str, Any]:
    """The ``status --json`` document (stable interface for scripts).

    Shape: ``{"devices": [{"name", "ifName", "capacity": {name: q}, "consumed": {...},
    "remaining": {...}}], "attachments": [{"podUID", "containerID", "ifname", "netns",
    "device", "consumedCapacity": {...}, "shareID", ...}]}``; quantities are canonical
    Kubernetes quantity strings (bandwidth in bits per second). ``consumed`` counts
    attachments and prepared claim results not attached yet.
    """
    from cni_dra.allocator import remaining
    from cni_dra.dra.inventory import load_inventory
    from cni_dra.dra.models import device_attribute
    from cni_dra.state import StateStore

    slice_ = load_inventory(inventory)
    state = StateStore(state_dir).read()
    driver, pool = slice_.spec.driver, slice_.spec.pool.name
    consumed = state.consumed_by_device(driver, pool)
    devices = []
    for d in sorted(slice_.spec.devices, key=lambda d: d.name):
        used = consumed.get(d.name, {})
        devices.append(
            {
                "name": d.name,
                "ifName": device_attribute(d, "ifName", driver),
                "capacity": {k: str(c.value) for k, c in sorted(d.capacity.items())},
                "consumed": {k: str(used.get(k, Quantity.ZERO)) for k, c in sorted(d.capacity.items())},
                "remaining": {k: str(v) for k, v in sorted(remaining(d, used).items())},
            }
        )
    attachments = []
    for a in state.attachments:
        attachments.append(
            {
                "podUID": a.podUID,
                "podNamespace": a.podNamespace,
                "podName": a.podName,
                "network": a.network,
                "containerID": a.containerID,
                "ifname": a.ifname,
                "netns": a.netns,
                "device": a.device,
                "ifName": a.ifName,
                "consumedCapacity": {k: str(v) for k, v in sorted(a.consumedCapacity.items())},
                "shareID": a.shareID,
                "phase": a.phase,
                "claim": a.claim.model_dump() if a.claim else None,
            }
        )
    claims = [
        {"podUID": uid, "namespace": c.get("metadata", {}).get("namespace"), "name": c.get("metadata", {}).get("name"),
         "uid": c.get("metadata", {}).get("uid")}
        for uid, cs in sorted(state.claims.items()) for c in cs
    ]
    return {"driver": driver, "pool": pool, "devices": devices, "attachments": attachments, "preparedClaims": claims}


@cli.command()
@STATE_DIR_OPT
@INVENTORY_OPT
@click.option("--json", "as_json", is_flag=True, envvar="CNI_DRA_JSON", help="Print the stable JSON document.")
def status(state_dir: str, inventory: str, as_json: bool) -> None:
    """Capacity per NIC (capacity, consumed, remaining) and every attachment."""
    report = status_report(state_dir, inventory)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"driver {report['driver']}  pool {report['pool']}")
    rows = [("DEVICE", "IFNAME", "CAPACITY", "CONSUMED", "REMAINING")]
    for d in report["devices"]:
        fmt = lambda m: ",".join(f"{k}={v}" for k, v in m.items()) or "-"  # noqa: E731
        rows.append((d["name"], str(d["ifName"]), fmt(d["capacity"]), fmt(d["consumed"]), fmt(d["remaining"])))
    _table(rows)
    click.echo("")
    rows = [("POD", "CONTAINER", "IFNAME", "DEVICE", "CONSUMED", "SHAREID", "PHASE")]
    for a in report["attachments"]:
        pod = f"{a['podNamespace']}/{a['podName']}" if a["podName"] else (a["podUID"] or "-")
        rows.append((pod, a["containerID"][:12], a["ifname"], a["device"],
                     ",".join(f"{k}={v}" for k, v in a["consumedCapacity"].items()) or "-",
                     a["shareID"] or "-", a["phase"]))
    _table(rows)


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


# -- claims ------------------------------------------------------------------------------
@cli.group()
def claims() -> None:
    """Prepared ResourceClaims in the node state (the path the kubelet plugin uses)."""


def prepare_claim(state_dir: str, pod_uid: str, claim_obj: dict[str, Any]) -> bool:
    """Store a resource.k8s.io/v1 ResourceClaim (with ``status.allocation``) for ``pod_uid``.

    Idempotent: a claim with the same ``metadata.uid`` is replaced. Returns True when the
    state changed. Raises InvalidConfigError (7) for a claim that does not validate.
    """
    from pydantic import ValidationError

    from cni_dra.dra.models import ResourceClaim
    from cni_dra.errors import InvalidConfigError
    from cni_dra.state import StateStore

    try:
        claim = ResourceClaim.model_validate(claim_obj)
    except (ValidationError, ValueError) as exc:
        raise InvalidConfigError(f"failed to prepare claim: not a valid resource.k8s.io/v1 ResourceClaim: {exc}") from exc
    if claim.status is None or claim.status.allocation is None:
        raise InvalidConfigError(f"failed to prepare claim {claim.metadata.name}: it has no status.allocation")
    uid = claim.metadata.uid or claim.metadata.name
    with StateStore(state_dir).transaction() as state:
        existing = state.claims.setdefault(pod_uid, [])
        for i, c in enumerate(existing):
            m = c.get("metadata") or {}
            if (m.get("uid") or m.get("name")) == uid:
                if c == claim_obj:
                    return False
                existing[i] = claim_obj
                return True
        existing.append(claim_obj)
        return True


def unprepare_claims(state_dir: str, pod_uid: str, claim_uid: str | None = None) -> int:
    """Remove the prepared claims of ``pod_uid`` (only ``claim_uid`` when given). Returns how many."""
    from cni_dra.state import StateStore

    with StateStore(state_dir).transaction() as state:
        existing = state.claims.get(pod_uid, [])
        keep = [c for c in existing if claim_uid and (c.get("metadata") or {}).get("uid") != claim_uid]
        removed = len(existing) - len(keep)
        if keep:
            state.claims[pod_uid] = keep
        else:
            state.claims.pop(pod_uid, None)
        return removed


def _load_doc(path: str) -> Any:
    from cni_dra.errors import DecodeError, IOFailureError

    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as exc:
        raise IOFailureError(f"failed to read {path}: {exc.strerror}") from exc
    try:
        return json.loads(text)
    except ValueError:
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise DecodeError(f"failed to decode {path}: neither JSON nor YAML: {exc}") from exc


@claims.command("prepare")
@STATE_DIR_OPT
@click.option("--pod-uid", required=True, envvar="CNI_DRA_POD_UID", help="UID of the pod the claim is reserved for.")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
def claims_prepare(state_dir: str, pod_uid: str, file: str) -> None:
    """Add the allocated ResourceClaim in FILE (JSON or YAML, '-' for stdin) for a pod."""
    changed = prepare_claim(state_dir, pod_uid, _load_doc(file))
    click.echo(f"claim {'prepared' if changed else 'already prepared'} for pod {pod_uid}")


@claims.command("unprepare")
@STATE_DIR_OPT
@click.option("--pod-uid", required=True, envvar="CNI_DRA_POD_UID")
@click.option("--claim-uid", default=None, help="Only this claim (default: all of the pod's).")
def claims_unprepare(state_dir: str, pod_uid: str, claim_uid: str | None) -> None:
    """Remove a pod's prepared claims (idempotent)."""
    n = unprepare_claims(state_dir, pod_uid, claim_uid)
    click.echo(f"{n} claim(s) unprepared for pod {pod_uid}")


# -- inventory ---------------------------------------------------------------------------
@cli.group()
def inventory() -> None:
    """The node's NIC inventory (a resource.k8s.io/v1 ResourceSlice)."""


@inventory.command("discover")
@click.option("--interface", "-i", "interfaces", multiple=True, help="Only these host interfaces (repeatable).")
@click.option("--default-bandwidth", default="10G", show_default=True, envvar="CNI_DRA_DEFAULT_BANDWIDTH",
              help="Bandwidth (bits/s quantity) when the driver reports no speed.")
@click.option("--driver", default=DEFAULT_DRIVER, show_default=True, envvar="CNI_DRA_DRIVER")
@click.option("--node-name", default=None, envvar="NODE_NAME", help="spec.nodeName (default: hostname).")
@click.option("--output", "-o", default="-", help="File to write (default stdout).")
def inventory_discover(interfaces: tuple[str, ...], default_bandwidth: str, driver: str,
                       node_name: str | None, output: str) -> None:
    """Write a ResourceSlice for the host's NICs (speed from sysfs, else --default-bandwidth)."""
    from cni_dra.discover import discover_slice

    doc = discover_slice(interfaces=list(interfaces), default_bandwidth=default_bandwidth, driver=driver,
                         node_name=node_name)
    import yaml

    text = yaml.safe_dump(doc, sort_keys=False)
    if output == "-":
        click.echo(text, nl=False)
    else:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
        click.echo(f"wrote {output} ({len(doc['spec']['devices'])} devices)", err=True)
