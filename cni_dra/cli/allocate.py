"""``cni-dra allocate``: dry-run the allocator for ResourceClaims on this node.

Prints, per claim and in the order given, the resource.k8s.io/v1 ``status.allocation``
the claim would get (``devices.results[]`` with request, driver, pool, device,
consumedCapacity, shareID) or why it does not fit, request by request. Claims are
allocated in order, each seeing what the earlier ones consumed. Nothing is written or
created: ``--state-dir`` reads a lock-free snapshot (``StateStore.peek``). The inventory is
checked with the API server's rules only (not cni-dra's ``ifName`` rule).

Output (JSON or YAML) is a list, one entry per claim::

    [{"claim": "ns/name", "allocation": {...status.allocation...}},
     {"claim": "ns/other", "error": "claim ... cannot be allocated: ...",
      "reasons": {"<request>": "<device>: <why>; ..." or "fits alone on <devices>",
                  "claim": "requests a and b fit alone but not together: <constraint or capacity>"}}]

``reasons`` has an entry per request: each device's rejection when the request is
tried on its own against the node's usage, or the devices it fits alone; when every
request fits alone, ``claim`` names the requests that fail together and the
constraint, shared capacity or dedicated device that makes them fail. stderr gives
one ``NoCapacityError: claim ... cannot be allocated:`` line per claim (``cannot be
allocated (the scheduler's allocation stops with an error, SchedulerError):`` for an
aborted one), then one indented line per entry.

Exit status: 0 when every claim fits, 1 when one does not, 2 on bad input (the
error is printed as ``Type: message`` on stderr).

``--fractional-capacity-range`` (env ``CNI_DRA_FRACTIONAL_CAPACITY_RANGE``) gives the
cluster's ``DRAFractionalCapacityRange`` gate, which decides how a stepped ``validRange``
rounds (:mod:`cni_dra.allocator.capacity`): ``on``, ``off``, or ``auto`` (the default):
what the agent recorded in ``--state-dir`` (:mod:`cni_dra.state.cluster_features`), else off,
the Kubernetes 1.37 default. A claim whose search stopped instead of finding nothing fits
(a request a device's range cannot compute, a claim the API server would refuse) has
``"aborted": true``: the scheduler reports it as an error, not as unschedulable.

``--state`` is a hidden, deprecated alias of ``--state-dir``.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

import click

from cni_dra.allocator.claim_allocator import ClaimNoFit, NodeUsage, allocate_claims, claim_id
from cni_dra.allocator.select import POLICIES, Policy
from cni_dra.cli.options import state_dir_option
from cni_dra.dra.claim_files import load_claims, load_consumed
from cni_dra.dra.claims import AllocationResult, ResourceClaim
from cni_dra.dra.inventory import load_inventory
from cni_dra.dra.objects import ResourceSlice, to_api
from cni_dra.errors import CniError
from cni_dra.quantity import Quantity

__all__ = [
    "AllocateEntry",
    "FRACTIONAL_CHOICES",
    "make_allocate_command",
    "read_node_usage",
    "read_fractional",
    "run_allocate",
    "StateReader",
    "new_share_id",
]

FRACTIONAL_CHOICES = ("auto", "on", "off")


class AllocateEntry(TypedDict, total=False):
    """One claim's line of the output: ``claim`` (namespace/name) and either its
    ``allocation`` (the API's AllocationResult) or an ``error`` with ``reasons`` (request
    name or ``claim`` → why)."""

    claim: str
    allocation: dict[str, Any]
    error: str
    reasons: dict[str, str]
    aborted: bool


#: Reads the node's usage of the slice's pool from a state directory: either a
#: :class:`NodeUsage` or the simple ``{device: {capacity: Quantity}}`` shape (then a
#: dedicated device with any entry counts as held). Raises a CniError on failure.
StateReader = Callable[[str, ResourceSlice], "NodeUsage | Mapping[str, Mapping[str, Quantity]]"]


def read_node_usage(state_dir: str, slice_: ResourceSlice) -> NodeUsage:
    """What the node state in ``state_dir`` charges per device of ``slice_``'s pool.

    A dry run: a lock-free snapshot (``StateStore.peek``), so nothing, not even
    state.lock, is created. Raises CniError subclasses (an unreadable state).
    """
    from cni_dra.state import StateStore
    from cni_dra.state.ledger import node_usage

    devices = {d.name: d for d in slice_.spec.devices}
    return node_usage(StateStore(state_dir).peek(), slice_.spec.driver, slice_.spec.pool.name, devices)


def read_fractional(state_dir: str | None) -> bool:
    """``auto``: the ``DRAFractionalCapacityRange`` gate the agent recorded in
    ``state_dir`` (:mod:`cni_dra.state.cluster_features`), else off (Kubernetes 1.37's default).
    Raises StateError (5) for a record that cannot be read."""
    if state_dir is None:
        return False
    from cni_dra.state import StateStore
    from cni_dra.state.cluster_features import read_features

    found = read_features(StateStore(state_dir))
    return found is not None and found.fractional_capacity_range


def new_share_id() -> str:
    """A fresh shareID: a lowercase RFC 4122 UUID (KEP-5075)."""
    return str(uuid.uuid4())


def run_allocate(
    slice_: ResourceSlice,
    claims: Sequence[ResourceClaim],
    usage: NodeUsage,
    share_id: Callable[[], str],
    policy: Policy = "first-fit",
    *,
    fractional_capacity_range: bool = False,
) -> tuple[list[AllocateEntry], bool]:
    """Allocate ``claims`` in order under the cluster's ``DRAFractionalCapacityRange``
    gate ``fractional_capacity_range``; return (output entries, all fitted)."""
    outcomes = allocate_claims(
        claims, slice_, usage, share_id, policy, fractional_capacity_range=fractional_capacity_range
    )
    out: list[AllocateEntry] = []
    ok = True
    for claim, res in zip(claims, outcomes, strict=True):
        cid = claim_id(claim)
        if isinstance(res, ClaimNoFit):
            ok = False
            entry: AllocateEntry = {"claim": cid, "error": str(res), "reasons": dict(res.reasons)}
            if res.aborted:
                entry["aborted"] = True
            out.append(entry)
        else:
            assert isinstance(res, AllocationResult)
            out.append({"claim": cid, "allocation": to_api(res)})
    return out, ok


def _usage(
    slice_: ResourceSlice, state_dir: str | None, consumed: str | None, state_reader: StateReader
) -> NodeUsage:
    if state_dir is not None and consumed is not None:
        raise click.UsageError("--state-dir and --consumed are mutually exclusive")
    if consumed is not None:
        return NodeUsage.from_consumed(_checked_consumed(consumed, slice_), slice_.spec.devices)
    if state_dir is not None:
        got = state_reader(state_dir, slice_)
        if isinstance(got, NodeUsage):
            return got
        return NodeUsage.from_consumed(got, slice_.spec.devices)
    return NodeUsage()


def _checked_consumed(path: str, slice_: ResourceSlice) -> Mapping[str, Mapping[str, Quantity]]:
    """The ``--consumed`` file, each entry naming a device of the inventory with an amount
    that is not negative: a misspelt device would charge nothing and a negative amount
    would add capacity, and the dry run would answer for another node than this one.
    Raises IOFailureError (5) or InvalidConfigError (7)."""
    from cni_dra.errors import InvalidConfigError

    got = load_consumed(path)
    names = {d.name for d in slice_.spec.devices}
    for device, caps in got.items():
        if device not in names:
            raise InvalidConfigError(
                f"failed to load consumed-capacity file {path}: {device}: no such device in the inventory "
                f"(devices: {', '.join(sorted(names)) or 'none'})"
            )
        for key, amount in caps.items():
            if amount < Quantity.ZERO:
                raise InvalidConfigError(
                    f"failed to load consumed-capacity file {path}: {device}.{key}: {amount} is negative"
                )
    return got


def _dump(entries: list[AllocateEntry], output: str) -> str:
    if output == "yaml":
        import yaml  # lazy

        return yaml.safe_dump(entries, sort_keys=False)
    return json.dumps(entries, indent=2) + "\n"


# The long options of ``allocate`` (make_allocate_command), each a click decorator.
_INVENTORY_OPTION = click.option(
    "--inventory",
    "inventory",
    required=True,
    envvar="CNI_DRA_INVENTORY",
    help="ResourceSlice file (YAML or JSON) listing the node's devices; checked with the "
    "API server's rules only, so a slice of another driver (no ifName) is accepted.",
)
_STATE_DIR_OPTION = state_dir_option(
    default=None,
    deprecated_alias="--state",
    help="Node state directory: start from what is allocated there. Read-only: a "
    "snapshot of state.json taken without the state lock (nothing is created, "
    "not even state.lock), so a concurrent ADD/DEL may make it stale at once.",
)
_FRACTIONAL_OPTION = click.option(
    "--fractional-capacity-range",
    "fractional",
    type=click.Choice(list(FRACTIONAL_CHOICES)),
    default="auto",
    show_default=True,
    envvar="CNI_DRA_FRACTIONAL_CAPACITY_RANGE",
    help="The cluster's DRAFractionalCapacityRange feature gate, which decides how a stepped "
    "validRange rounds: on (milli-units), off (whole units, Kubernetes 1.37's default), "
    "auto (what the agent recorded in --state-dir, else off).",
)


def make_allocate_command(
    state_reader: StateReader = read_node_usage,
    share_id: Callable[[], str] = new_share_id,
) -> click.Command:
    """Build the ``allocate`` click command.

    ``state_reader(state_dir, slice_)`` serves ``--state-dir`` (:func:`read_node_usage`
    by default); ``share_id`` mints shareIDs (uuid4 by default; tests pass a
    deterministic generator).
    """

    @click.command("allocate")
    @_INVENTORY_OPTION
    @click.option(
        "--claim",
        "claim_paths",
        multiple=True,
        required=True,
        envvar="CNI_DRA_CLAIM",
        help="ResourceClaim file; repeat to allocate several claims in order.",
    )
    @_STATE_DIR_OPTION
    @click.option(
        "--consumed",
        "consumed",
        default=None,
        envvar="CNI_DRA_CONSUMED",
        help='JSON/YAML file {"<device>": {"<capacity>": "<quantity>"}} of what is consumed '
        "(devices of the inventory, amounts not negative).",
    )
    @click.option(
        "--policy",
        type=click.Choice(list(POLICIES)),
        default="first-fit",
        show_default=True,
        envvar="CNI_DRA_POLICY",
        help="Order in which candidate devices are tried.",
    )
    @_FRACTIONAL_OPTION
    @click.option(
        "-o",
        "--output",
        type=click.Choice(["json", "yaml"]),
        default="json",
        show_default=True,
        envvar="CNI_DRA_OUTPUT",
    )
    def allocate(
        inventory: str,
        claim_paths: tuple[str, ...],
        state_dir: str | None,
        consumed: str | None,
        policy: Policy,  # one of POLICIES (click.Choice)
        fractional: str,
        output: str,
    ) -> None:
        """Print the status.allocation each CLAIM would get on this node (dry run)."""
        try:
            slice_ = load_inventory(inventory, plugin_rules=False)
            claims = [c for path in claim_paths for c in load_claims(path)]
            usage = _usage(slice_, state_dir, consumed, state_reader)
            gate = fractional == "on" if fractional != "auto" else read_fractional(state_dir)
            entries, ok = run_allocate(
                slice_, claims, usage, share_id, policy, fractional_capacity_range=gate
            )
        except CniError as exc:
            click.echo(f"{type(exc).__name__}: {exc.msg}", err=True)
            sys.exit(2)
        _print(entries, ok, output)

    return allocate


def _print(entries: list[AllocateEntry], ok: bool, output: str) -> None:
    """The allocations on stdout; for each claim that does not fit, why on stderr (one line
    per request, and one for the combination) and exit code 1."""
    click.echo(_dump(entries, output), nl=False)
    if ok:
        return
    for e in entries:
        if "error" in e:
            stops = (
                " (the scheduler's allocation stops with an error, SchedulerError)"
                if e.get("aborted")
                else ""
            )
            click.echo(f"NoCapacityError: claim {e['claim']} cannot be allocated{stops}:", err=True)
            for req, why in e["reasons"].items():
                click.echo(f"  {'claim' if req == 'claim' else 'request ' + req}: {why}", err=True)
    sys.exit(1)
