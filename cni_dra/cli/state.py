"""``cni-dra state recover|repair``: the operator's tools for the node state file.

* ``recover``: finish or undo the intents of crashed ADD/DEL runs and release attachments
  lost in a reboot (what every ADD, DEL and GC also does first);
* ``repair``: reconcile the state with the live links (a healthy one too), rebuilding an
  unreadable ``state.json`` from its backup first.

Both print one line per change and exit 0, or 1 when something could not be done (listed).
See README "Failure modes".
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import click

from cni_dra.cli.options import STATE_DIR_OPT
from cni_dra.protocol.config import DEFAULT_INVENTORY

if TYPE_CHECKING:
    from cni_dra.attach.recover import RecoveryReport

__all__ = ["state"]


@click.group()
def state() -> None:
    """The node state file: crash recovery and repair."""


_CNI_PATH = click.option(
    "--cni-path",
    envvar="CNI_PATH",
    default="/opt/cni/bin",
    show_default=True,
    help="Where the IPAM plugins are (':'-separated, like CNI_PATH).",
)
_JSON = click.option(
    "--json", "as_json", is_flag=True, envvar="CNI_DRA_JSON", help="Print {changes, errors} as JSON."
)


def _print(report: RecoveryReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"changes": report.changes, "errors": report.errors}, indent=2))
    else:
        for line in report.changes:
            click.echo(line)
        for line in report.errors:
            click.echo(f"error: {line}", err=True)
        if not report.changes and not report.errors:
            click.echo("nothing to do")
    if report.errors:
        raise SystemExit(1)


def _cni_path(value: str) -> list[str]:
    return [p for p in value.split(":") if p]


@state.command("recover")
@STATE_DIR_OPT
@_CNI_PATH
@_JSON
def recover_cmd(state_dir: str, cni_path: str, as_json: bool) -> None:
    """Finish or undo interrupted ADD/DEL runs; release attachments of a previous boot whose netns is gone."""
    from cni_dra.attach.recover import recover
    from cni_dra.host.kernel import KernelHost
    from cni_dra.state import StateStore

    report = recover(
        StateStore(state_dir), environ=dict(os.environ), host=KernelHost(), cni_path=_cni_path(cni_path)
    )
    _print(report, as_json)


@state.command("repair")
@STATE_DIR_OPT
@_CNI_PATH
@click.option(
    "--inventory",
    envvar="CNI_DRA_INVENTORY",
    default=DEFAULT_INVENTORY,
    show_default=True,
    help="The node's ResourceSlice (its NICs are searched for untracked links).",
)
@_JSON
def repair_cmd(state_dir: str, cni_path: str, inventory: str, as_json: bool) -> None:
    """Reconcile the state with the live links, reporting each change; an unreadable state
    file is first rebuilt from its backup.

    Also on a healthy state: attachments whose link is gone are dropped (their IPAM released
    with the recorded config, found under --cni-path), intents of dead processes undone or
    finished (those of live ones kept); every namespace in /var/run/netns is scanned:
    macvlan/ipvlan links there on an inventory NIC that no attachment names are charged
    their device's whole capacity until their pod's DEL, links left under a temporary name
    and ifb devices that shape no link any more are deleted."""
    from cni_dra.attach.rebuild import repair
    from cni_dra.errors import CniError
    from cni_dra.host.kernel import KernelHost
    from cni_dra.state import StateStore

    parents: list[str] = []
    slice_ = None
    try:
        from cni_dra.dra.inventory import load_inventory
        from cni_dra.dra.objects import device_attribute

        slice_ = load_inventory(inventory)
        parents = [str(device_attribute(d, "ifName", slice_.spec.driver)) for d in slice_.spec.devices]
    except CniError as exc:
        click.echo(f"warning: inventory not used ({exc.msg}); untracked links are not searched", err=True)
    report = repair(
        StateStore(state_dir),
        environ=dict(os.environ),
        cni_path=_cni_path(cni_path),
        parents=parents,
        slice_=slice_,
        host=KernelHost(),
    )
    _print(report, as_json)
