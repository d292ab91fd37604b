"""The operator CLI (click): a thin shell over library calls.

Commands: ``status``, ``claims prepare|unprepare``, ``inventory discover`` (here), and
``allocate``, ``agent``, ``state recover|repair`` (each in its own module, added to the
group at the bottom of this one). Every option has an environment twin
(``CNI_DRA_STATE_DIR``, ``CNI_DRA_INVENTORY``, ...; the shared ones are in
:mod:`cni_dra.cli.options`). Errors print ``Type: message`` on stderr and exit non-zero.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

import click

from cni_dra.cli.agent import agent as agent_command
from cni_dra.cli.allocate import make_allocate_command
from cni_dra.cli.options import CONFLIST_OPT, INVENTORY_OPT, STATE_DIR_OPT
from cni_dra.cli.state import state as state_group
from cni_dra.errors import CniError
from cni_dra.protocol.config import DEFAULT_DRIVER

__all__ = ["cli"]


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
@cli.command()
@STATE_DIR_OPT
@INVENTORY_OPT
@click.option(
    "--json", "as_json", is_flag=True, envvar="CNI_DRA_JSON", help="Print the stable JSON document."
)
@click.option(
    "--prometheus",
    "prom_file",
    default=None,
    envvar="CNI_DRA_PROMETHEUS_FILE",
    help="Write the node gauges to FILE (node_exporter textfile collector format) instead.",
)
def status(state_dir: str, inventory: str, as_json: bool, prom_file: str | None) -> None:
    """Capacity per NIC (capacity, consumed, remaining) and every attachment."""
    from cni_dra.report import status_report

    if prom_file:
        from cni_dra.agent.metrics import write_textfile

        return write_textfile(prom_file, state_dir, inventory)
    report = status_report(state_dir, inventory)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"driver {report['driver']}  pool {report['pool']}")

    def fmt(m: dict[str, Any]) -> str:
        return ",".join(f"{k}={v}" for k, v in m.items()) or "-"

    rows: list[tuple[str, ...]] = [("DEVICE", "IFNAME", "CAPACITY", "CONSUMED", "REMAINING")]
    for d in report["devices"]:
        rows.append(
            (d["name"], str(d["ifName"]), fmt(d["capacity"]), fmt(d["consumed"]), fmt(d["remaining"]))
        )
    _table(rows)
    click.echo("")
    rows = [("POD", "CONTAINER", "IFNAME", "DEVICE", "CONSUMED", "SHAPED", "LINK", "SHAREID", "PHASE")]
    for a in report["attachments"]:
        # a pod's name, else its UID, else its netns: all a repair placeholder knows of its pod
        pod = f"{a['podNamespace']}/{a['podName']}" if a["podName"] else (a["podUID"] or a["netns"] or "-")
        charged = ",".join(f"{k}={v}" for k, v in a["consumedCapacity"].items()) or "-"
        if not a["consumedRecorded"]:
            charged += " (not recorded: whole device)"
        shaped = ",".join(f"{d}={b['rate']}" for d, b in (a["shaping"] or {}).items() if d != "ifb") or "-"
        rows.append(
            (
                pod,
                a["containerID"][:12],
                a["ifname"],
                a["device"],
                charged,
                shaped,
                _link(a),
                a["shareID"] or "-",
                a["phase"],
            )
        )
    _table(rows)
    if report["preparedClaims"]:
        click.echo("")
        click.echo(
            "prepared claims (their results reserve capacity until an attachment uses them or they are unprepared):"
        )
        rows = [("POD UID", "CLAIM", "CLAIM UID")]
        for c in report["preparedClaims"]:
            rows.append((c["podUID"], f"{c['namespace']}/{c['name']}", str(c["uid"])))
        _table(rows)


def _link(att: dict[str, Any]) -> str:
    """The LINK column: the link kind, and with a device profile its mode, flag, MTU and
    MAC and the fields the DRA configuration set, e.g. ``ipvlan/l3/bridge mtu=9000
    (profile: linkType,mode,mtu)``."""
    prof = att["profile"]
    if not prof:
        return str(att["linkType"])
    out = "/".join(str(prof[k]) for k in ("linkType", "mode", "ipvlanFlag") if prof.get(k))
    out += "".join(f" {k}={prof[k]}" for k in ("mtu", "mac") if prof.get(k) is not None)
    if not prof["shaping"]:
        out += " unshaped"
    return f"{out} (profile: {','.join(prof['fromConfig'])})"


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


# -- claims ------------------------------------------------------------------------------
@cli.group()
def claims() -> None:
    """Prepared ResourceClaims in the node state (the path the kubelet plugin uses)."""


def _read_text(path: str) -> str:
    from cni_dra.errors import IOFailureError

    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise IOFailureError(f"failed to read {path}: {exc.strerror}") from exc


@claims.command("prepare")
@STATE_DIR_OPT
@INVENTORY_OPT
@CONFLIST_OPT
@click.option(
    "--pod-uid", required=True, envvar="CNI_DRA_POD_UID", help="UID of the pod the claim is reserved for."
)
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
def claims_prepare(
    state_dir: str, inventory: str, conflists: tuple[str, ...], pod_uid: str, file: str
) -> None:
    """Add the allocated ResourceClaim(s) in FILE (JSON or YAML, a List or several
    documents; '-' for stdin) for a pod, all or none. Results of the inventory's driver
    must name its pool and devices (checked when the inventory file exists), the device
    profiles their config asks must validate within the --conflist limits, and together
    with the pod's prepared claims they must give each interface at most one result."""
    import os

    from cni_dra.dra.claim_files import parse_claim_objects
    from cni_dra.dra.inventory import load_inventory
    from cni_dra.protocol.profile import load_limits
    from cni_dra.state.preparing import check_claim_against_inventory, prepare_claims

    objs = parse_claim_objects(_read_text(file), file)
    slice_ = load_inventory(inventory) if os.path.exists(inventory) else None
    driver = slice_.spec.driver if slice_ is not None else DEFAULT_DRIVER
    limits = load_limits(conflists)
    if slice_ is not None:
        for obj in objs:
            check_claim_against_inventory(obj, slice_)
    changed = prepare_claims(state_dir, pod_uid, objs, driver=driver, limits=limits)
    for obj, did in zip(objs, changed, strict=True):
        name = (obj.get("metadata") or {}).get("name")
        click.echo(f"claim {name} {'prepared' if did else 'already prepared'} for pod {pod_uid}")


@claims.command("unprepare")
@STATE_DIR_OPT
@click.option("--pod-uid", required=True, envvar="CNI_DRA_POD_UID")
@click.option("--claim-uid", default=None, help="Only this claim (default: all of the pod's).")
def claims_unprepare(state_dir: str, pod_uid: str, claim_uid: str | None) -> None:
    """Remove a pod's prepared claims (idempotent)."""
    from cni_dra.state.preparing import unprepare_claims

    n = unprepare_claims(state_dir, pod_uid, claim_uid)
    click.echo(f"{n} claim(s) unprepared for pod {pod_uid}")


# -- inventory ---------------------------------------------------------------------------
@cli.group()
def inventory() -> None:
    """The node's NIC inventory (a resource.k8s.io/v1 ResourceSlice)."""


@inventory.command("discover")
@click.option(
    "--interface",
    "-i",
    "interfaces",
    multiple=True,
    envvar="CNI_DRA_INTERFACES",
    help="Only these host interfaces (repeatable; the variable: separated by spaces).",
)
@click.option(
    "--default-bandwidth",
    default="10G",
    show_default=True,
    envvar="CNI_DRA_DEFAULT_BANDWIDTH",
    help="Bandwidth (bits/s quantity) when the driver reports no speed.",
)
@click.option(
    "--request-policy",
    default=None,
    envvar="CNI_DRA_REQUEST_POLICY",
    help="requestPolicy (YAML or JSON, as in a ResourceSlice) of every device that names none "
    "[default: default 1G or the whole NIC, validRange min 1M].",
)
@click.option(
    "--devices",
    "devices_file",
    default=None,
    envvar="CNI_DRA_DEVICES",
    type=click.Path(dir_okay=False),
    help="YAML or JSON list of NICs to publish, each {ifName, name, bandwidth, requestPolicy} (all but "
    "ifName optional): exactly these, instead of -i or every eligible NIC.",
)
@click.option("--driver", default=DEFAULT_DRIVER, show_default=True, envvar="CNI_DRA_DRIVER")
@click.option("--node-name", default=None, envvar="NODE_NAME", help="spec.nodeName (default: hostname).")
@click.option("--output", "-o", default="-", help="File to write (default stdout).")
def inventory_discover(
    interfaces: tuple[str, ...],
    default_bandwidth: str,
    request_policy: str | None,
    devices_file: str | None,
    driver: str,
    node_name: str | None,
    output: str,
) -> None:
    """Write a ResourceSlice for the host's NICs (speed from sysfs, else --default-bandwidth).

    The slice is checked as the plugin and the agent will read it before it is written
    (temporary file, then rename)."""
    import os

    import yaml

    from cni_dra.discover import discover_slice
    from cni_dra.dra.inventory import parse_inventory
    from cni_dra.quantity import Quantity

    try:
        Quantity.parse(default_bandwidth)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--default-bandwidth") from exc
    policy = _yaml_option(request_policy, "--request-policy", dict) if request_policy else None
    devices = _nic_specs(devices_file) if devices_file else None
    try:
        doc = discover_slice(
            interfaces=list(interfaces),
            default_bandwidth=default_bandwidth,
            driver=driver,
            node_name=node_name,
            request_policy=policy,
            devices=devices,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--devices") from exc
    text = yaml.safe_dump(doc, sort_keys=False)
    parse_inventory(
        text, output if output != "-" else "<discovered>"
    )  # raises InvalidConfigError naming the field
    if output == "-":
        click.echo(text, nl=False)
        return
    from cni_dra.errors import IOFailureError

    tmp = f"{output}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, output)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise IOFailureError(f"failed to write inventory {output}: {exc.strerror or exc}") from exc
    click.echo(f"wrote {output} ({len(doc['spec']['devices'])} devices)", err=True)


def _yaml_option(text: str, hint: str, kind: type) -> Any:
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise click.BadParameter(f"not YAML or JSON: {exc}", param_hint=hint) from exc
    if not isinstance(value, kind):
        raise click.BadParameter(f"must be a {'mapping' if kind is dict else 'list'}", param_hint=hint)
    return value


def _nic_specs(path: str) -> list[Any]:
    from pydantic import ValidationError

    from cni_dra.discover import NicSpec

    try:
        with open(path, encoding="utf-8") as f:
            entries = _yaml_option(f.read(), "--devices", list)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint="--devices") from exc
    try:
        return [NicSpec.model_validate(entry) for entry in entries]
    except ValidationError as exc:
        raise click.BadParameter(
            f"{path}: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}", param_hint="--devices"
        ) from exc


# -- the commands of the other modules -----------------------------------------------------
cli.add_command(make_allocate_command())
cli.add_command(agent_command)
cli.add_command(state_group)
