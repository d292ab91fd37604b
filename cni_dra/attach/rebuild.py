"""``cni-dra state repair``: rebuild the node state from what survives plus the live links.

:func:`repair` starts from the state as it reads (its journal cut at a bad record), else
the snapshot's backup copy, else nothing; reconciles every attachment with the kernel
(:func:`_reconcile`); charges the macvlan/ipvlan links on inventory NICs that no attachment
names as placeholders of network :data:`REPAIR_NETWORK`; deletes links left under a
temporary name and ifb devices whose link is gone; and reports every change. What it does
to a healthy state is the same reconciliation (README "Failure modes").

Errors: StateError (5), TryAgainLaterError (11).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cni_dra.attach.recover import RecoveryReport, describe_attachment, undo_attachment
from cni_dra.errors import CniError
from cni_dra.state import Attachment, NodeState, StateStore
from cni_dra.state.codec import REPAIR_HINT
from cni_dra.state.owner import boot_id, owner_alive
from cni_dra.state.salvage import RepairView
from cni_dra.state.schema import Attachments

if TYPE_CHECKING:
    from cni_dra.dra.objects import ResourceSlice
    from cni_dra.host.port import Host
    from cni_dra.netlink.netns import NetnsIdentity

__all__ = ["REPAIR_NETWORK", "repair"]

log = logging.getLogger("cni_dra.repair")


def _live_links(state: NodeState, host: Host) -> dict[tuple[str, str, str], str]:
    """Attachment key → host parent name, for each attachment whose link is alive in the
    namespace it was added in (:func:`~cni_dra.attach.release.recorded_netns_path`: a path
    that names another namespace now does not count)."""
    from cni_dra.attach.release import recorded_netns_path

    out = {}
    for att in state.attachments:
        where = recorded_netns_path(att, host)
        if where is None:
            continue
        try:
            parent = host.host_parent_of(where, att.ifname)
        except CniError:
            continue
        if parent is not None:
            out[att.key] = parent.name
    return out


def _netns_usable(path: str, host: Host) -> bool:
    """True when ``path`` is a live netns other than the host's (errors count as unusable)."""
    if not path:
        return False
    try:
        ident = host.netns_lookup(path)
    except CniError:
        return False
    return ident is not None and ident != host.host_netns_identity()


REPAIR_NETWORK = "cni-dra-repair"
"""Network name of the placeholder attachments ``state repair`` makes for untracked live links."""


def _pod_netns_paths(host: Host) -> list[str]:
    """Every usable network namespace under ``/var/run/netns`` but the host's, sorted."""
    return [path for path in host.netns_dir_paths() if _netns_usable(path, host)]


def _known_links(
    state: NodeState, live: Mapping[tuple[str, str, str], str], host: Host
) -> set[tuple[NetnsIdentity, str]]:
    """(namespace identity, ifname) of the attachments' live links (``live``: :func:`_live_links`):
    a namespace is the same whatever path names it."""
    out: set[tuple[NetnsIdentity, str]] = set()
    for att in state.attachments:
        if att.key in live:
            ident = (
                att.netnsIdentity if att.netnsIdentity is not None else host.netns_identity_or_none(att.netns)
            )
            if ident is not None:
                out.add((ident, att.ifname))
    return out


def _untracked_links(
    paths: Sequence[str], known: set[tuple[NetnsIdentity, str]], parents: set[str], host: Host
) -> list[tuple[str, str, str, str]]:
    """Macvlan/ipvlan links in the namespaces ``paths`` on an inventory NIC that no
    attachment names (``known``: :func:`_known_links`, by namespace identity, so a pod added
    as ``/run/netns/x`` is found tracked under ``/var/run/netns/x``): (netns path, link name,
    link kind, parent host name). A namespace that several paths name (``ip netns attach``
    gives a pod's namespace a second name) is searched once, under the first path: each of
    its links is one link, charged once."""
    found: list[tuple[str, str, str, str]] = []
    seen: set[NetnsIdentity] = set()
    for path in paths:
        try:
            ident = host.netns_identity(path)
            if ident in seen:
                continue
            seen.add(ident)
            kids = [
                (li.name, li.kind) for li in host.links_in_netns(path) if li.kind in ("macvlan", "ipvlan")
            ]
            for kid, kind in kids:
                if (ident, kid) in known:
                    continue
                parent = host.host_parent_of(path, kid)
                if parent is not None and parent.name in parents:
                    found.append((path, kid, str(kind), parent.name))
        except CniError:
            continue
    return found


def _remove_leaked_ifbs(paths: Sequence[str], report: RecoveryReport, host: Host) -> None:
    """Delete the ifb devices in ``paths`` whose shaped link is gone and that no record
    names any more (:func:`cni_dra.netlink.shaping.remove_leaked_ifbs`); one change each."""
    for path in paths:
        try:
            removed = host.remove_leaked_ifbs(path)
        except CniError as exc:
            report.errors.append(f"leaked ifb devices in {path}: {exc.msg}")
            continue
        report.changes += [f"removed leaked ifb device {name} in {path}" for name in removed]


def repair(
    store: StateStore,
    *,
    environ: Mapping[str, str],
    cni_path: Sequence[str] | None = None,
    parents: Sequence[str] = (),
    slice_: ResourceSlice | None = None,
    host: Host,
) -> RecoveryReport:
    """Rebuild the state file from the last good backup plus the live links (``cni-dra state repair``).

    * an unreadable ``state.json`` is moved aside (``state.json.corrupt-<unix s>``);
    * the base is the current file if it reads fine, else the backup, else an empty state
      (then prepared claims are lost: the kubelet prepares them again on its next sync);
    * every attachment whose link is gone is dropped and its IPAM released; ``ready`` and
      ``adding`` ones with a live link on their recorded parent stay (as ``ready``: the records
      after a bad one are lost, so an ``adding`` there may have completed), whether or not
      their owner still runs (a resident agent does); other in-flight intents with a live
      owner stay; ``deleting`` ones are finished;
    * macvlan/ipvlan links in ``/var/run/netns/*`` on one of ``parents`` (inventory NICs)
      named as cni-dra names a link before its rename
      (:func:`cni_dra.netlink.sublink.is_temp_name`) were left by an ADD killed halfway:
      they are deleted (those of an ADD still in flight excepted) and never charged;
    * the other such links that no attachment names (the same namespace by identity,
      whatever path the attachment recorded, and the same ifname) are charged with their
      device's WHOLE capacity (their share is unknown; charging less could promise the NIC
      twice) as a placeholder attachment of network :data:`REPAIR_NETWORK`, which the pod's
      DEL (same netns by identity, same ifname) releases.
      ``slice_`` (the inventory ResourceSlice) maps parents to devices; without it they
      are only reported;
    * ifb devices in ``/var/run/netns/*`` that carry cni-dra's mark and are named by the
      shaping rule whose shaped link is gone (:func:`cni_dra.netlink.shaping.remove_leaked_ifbs`;
      their records were lost with the state, or the link was deleted without its record)
      are deleted, also when there is no state file; an ifb device of a live link stays
      (tracked or charged as a placeholder above: the link's DEL removes both), an ifb
      device named otherwise or without the mark is not cni-dra's.

    Returns the report. Raises StateError (5) when the directory cannot be written,
    TryAgainLaterError (11) on lock timeout.
    """
    from cni_dra.netlink.sublink import is_temp_name

    report = RecoveryReport()
    paths = _pod_netns_paths(host)
    with store.replace() as view:
        base = _repair_base(store, view, report)
        if base is not None:
            live = _live_links(base, host)
            kept = _reconcile(
                base.attachments, live, environ, cni_path, report, host=host, lost=_records_lost(view)
            )
            found = _untracked_links(paths, _known_links(base, live, host), set(parents), host)
            kept += _charge_untracked([f for f in found if not is_temp_name(f[1])], slice_, report, host)
            _remove_temp_links([f for f in found if is_temp_name(f[1])], kept, report, host)
            view.write(base.model_copy(update={"attachments": Attachments(kept), "bootID": boot_id()}))
    _remove_leaked_ifbs(paths, report, host)
    return report


def _repair_base(store: StateStore, view: RepairView, report: RecoveryReport) -> NodeState | None:
    """What repair starts from: the current state (its journal cut at a bad record), else
    the backup, else an empty state; None when there is no state file at all."""
    if view.current is not None:
        if view.error is not None:  # the snapshot is good, its journal is not
            report.changes.append(f"state unreadable: {view.error.msg.split(';')[0]}")
            report.changes.append(
                f"kept {store.path.name} and the journal records before the bad one; moved the journal to "
                f"{view.journal_aside.name if view.journal_aside else '-'}"
            )
        return view.current
    if view.error is None:
        report.changes.append("no state file: nothing to repair")
        return None
    report.changes.append(f"state unreadable: {view.error.msg.split(';')[0]}")
    if view.aside is not None:
        report.changes.append(f"moved the unreadable {store.path.name} to {view.aside.name}")
    if view.backup is not None:
        base = view.backup
        report.changes.append(
            f"restored {len(base.attachments)} attachment(s) and "
            f"{sum(map(len, base.claims.values()))} prepared claim(s) from {store.backup_path.name}"
        )
        return base
    why = view.backup_error.msg.removesuffix(REPAIR_HINT) if view.backup_error else "no backup"
    report.changes.append(
        f"{why}: starting from an empty state (prepared claims are lost; the kubelet prepares them again)"
    )
    return NodeState()


def _records_lost(view: RepairView) -> bool:
    """Whether records may be missing from the base repair starts from: the journal was cut
    at a bad record, or the snapshot was unreadable (the backup, or nothing, replaced it)."""
    return view.error is not None


def _reconcile(
    attachments: Iterable[Attachment],
    live: Mapping[tuple[str, str, str], str],
    environ: Mapping[str, str],
    cni_path: Sequence[str] | None,
    report: RecoveryReport,
    *,
    host: Host,
    lost: bool,
) -> list[Attachment]:
    """The attachments repair keeps (see :func:`repair`); the others are released.

    ``ready``: kept while its link is live on its recorded parent, else released. ``adding``
    with such a live link when records may be ``lost`` (:func:`_records_lost`): its "ready"
    record may have been among them, whatever its owner (an in-process ADD has exited, the
    agent lives on), so it is kept as ready with the shaping read back from its link
    (:func:`_as_ready`). Otherwise an intent whose owner lives stays as it is (an ADD or DEL
    in flight keeps its own), and one whose owner is dead is undone or finished, as
    recovery does."""
    keep = []
    for att in attachments:
        parent = live.get(att.key)
        if att.phase == "ready" and parent == att.parent:
            keep.append(att)
            continue
        if att.phase == "adding" and lost and parent == att.parent:
            keep.append(_as_ready(att, parent, report, host))
            continue
        if att.phase != "ready" and owner_alive(att.owner):
            keep.append(att)
            continue
        try:
            earlier = att.owner is not None and bool(att.owner.boot) and att.owner.boot != boot_id()
            what = undo_attachment(att, environ, cni_path, host=host, earlier_boot=earlier)
        except CniError as exc:
            report.errors.append(f"{describe_attachment(att)}: {exc.msg}; kept")
            keep.append(att)
            continue
        why = "link not live" if att.phase == "ready" else "its process died"
        report.changes.append(f"dropped {describe_attachment(att)}: {why}; {what}")
    return keep


def _as_ready(att: Attachment, parent: str, report: RecoveryReport, host: Host) -> Attachment:
    """``att`` (an ``adding`` intent whose link is live on ``parent``) as a ``ready``
    attachment recording the shaping found on its link (read back from the kernel: an
    empty record when none was found, so that its DEL still removes an ifb device the ADD
    may have made), ``readyAt`` now (GC's grace) and no result (a repeated ADD of it is
    refused; CHECK and DEL need none)."""
    import time

    from cni_dra.attach.shaping_plan import record
    from cni_dra.state.schema import ready_at

    try:
        found = host.read_shaping(att.netns, att.ifname)
    except CniError as exc:
        report.errors.append(f"{describe_attachment(att)}: {exc.msg}; its shaping is not recorded")
        found = None
    shaping = record(found) if found is not None else {}
    report.changes.append(
        f"kept {describe_attachment(att)} as ready: its link is live on {parent} and the records after a bad one are "
        f"lost (its ADD may have completed); shaping found: {_shaping_words(shaping)}"
    )
    return Attachment.model_validate(
        {
            **att.__dict__,
            "phase": "ready",
            "owner": None,
            "steps": (),
            "tempName": None,
            "recovering": None,
            "shaping": shaping,
            "readyAt": ready_at(time.time()),
        }
    )


def _shaping_words(recorded: Mapping[str, Any]) -> str:
    parts = [f"{d} {recorded[d]['rateBps']} bit/s" for d in ("egress", "ingress") if recorded.get(d)]
    if recorded.get("ifb"):
        parts.append(f"ifb device {recorded['ifb']}")
    return ", ".join(parts) or "none"


def _remove_temp_links(
    found: Sequence[tuple[str, str, str, str]], kept: Sequence[Attachment], report: RecoveryReport, host: Host
) -> None:
    """Delete the links of ``found`` (:func:`_untracked_links`) left under a temporary name,
    except those an ADD still running may be renaming (the names of its ``tempName``)."""
    from cni_dra.netlink.sublink import temp_names

    running = {
        (ident, name)
        for a in kept
        if a.tempName and a.phase == "adding" and (ident := host.netns_identity_or_none(a.netns)) is not None
        for name in temp_names(a.tempName)
    }
    for netns, kid, _kind, _parent in found:
        if (host.netns_identity_or_none(netns), kid) in running:
            continue
        try:
            if host.delete_link(netns, kid):
                report.changes.append(f"removed leaked temporary link {kid} in {netns}")
        except CniError as exc:
            report.errors.append(f"leaked temporary link {kid} in {netns}: {exc.msg}")


def _charge_untracked(
    found: Sequence[tuple[str, str, str, str]],
    slice_: ResourceSlice | None,
    report: RecoveryReport,
    host: Host,
) -> list[Attachment]:
    """Placeholder attachments charging untracked links on inventory NICs (see :func:`repair`)."""

    out: list[Attachment] = []
    by_parent = {}
    if slice_ is not None:
        from cni_dra.dra.objects import device_attribute

        by_parent = {device_attribute(d, "ifName", slice_.spec.driver): d for d in slice_.spec.devices}
    for netns, kid, kind, parent_name in found:
        device = by_parent.get(parent_name)
        where = f"{kid} in {netns} on {parent_name}"
        if device is None or slice_ is None:
            report.changes.append(f"untracked link {where}: not charged (no inventory device for it)")
            continue
        out.append(
            Attachment(
                network=REPAIR_NETWORK,
                containerID=f"repair-{netns.rsplit('/', 1)[-1]}"[:128],
                ifname=kid,
                netns=netns,
                netnsIdentity=host.netns_identity_or_none(netns),
                driver=slice_.spec.driver,
                pool=slice_.spec.pool.name,
                device=device.name,
                parent=parent_name,
                linkType=kind,
                phase="ready",
                consumedCapacity={k: c.value for k, c in device.capacity.items()},
            )
        )
        report.changes.append(
            f"untracked link {where}: charged the whole capacity of device {device.name} "
            "(its share is unknown) until its pod's DEL"
        )
    return out
