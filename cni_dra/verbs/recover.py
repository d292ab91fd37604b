"""Crash recovery and repair of the node state: stale intents, reboots, corrupt files.

Intent records (:mod:`cni_dra.state.models`, :mod:`cni_dra.verbs.intent`): ADD records its
attachment as ``adding`` with its owner process, and the IPAM step when the network has
IPAM, before the first side effect; DEL marks it ``deleting`` before its first. An intent whose owner
process is dead is *stale*.

:func:`recover` (run at the start of ADD, DEL and GC, and by ``cni-dra state recover``):

1. under the lock, take over every stale intent (owner := this process, so a concurrent
   recovery leaves it alone) and, when the kernel boot id differs from the recorded one
   (a reboot), every attachment of the previous boot whose netns is gone (as ``deleting``);
   prepared claims stay: the kubelet prepares them again after a reboot;
2. outside the lock, per attachment and per step: ``adding`` is undone (the link is deleted
   when the step says it was made, or when a link of that name sits on the recorded parent,
   and so is a link still under the temporary name the intent records; IPAM is released
   when its step was reached), ``deleting`` is finished (link, IPAM), both through
   :mod:`cni_dra.verbs.release`;
3. under the lock, drop the attachment, releasing its capacity.

The runtime never saw a result for an ``adding`` attachment, so undoing is right; it will
retry the ADD or send DEL. Errors on one attachment are logged and leave it for the next
recovery; the others proceed.

:func:`repair` (``cni-dra state repair``) rebuilds an unreadable state file from the last
good backup plus the live links, deletes the ifb devices that shape no link any more, and
reports every change.

Source: CNI spec 1.1.0 "DEL" (must succeed when things are already gone), "GC"; KEP-5075
(capacity is charged until released). Errors: StateError (5), TryAgainLaterError (11).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from dataclasses import dataclass, field

from cni_dra.errors import CniError, TryAgainLaterError
from cni_dra.state import Attachment, NodeState, StateStore

if TYPE_CHECKING:
    from cni_dra.dra.models import ResourceSlice
    from cni_dra.netlink.netns import NetnsIdentity
from cni_dra.state.models import STEP_IPAM, STEP_LINK, Attachments, Owner
from cni_dra.state.owner import boot_id, current_owner, owner_alive
from cni_dra.state.repair import RepairView
from cni_dra.verbs.common import Invocation

__all__ = ["RecoveryReport", "recover", "recover_pending", "repair"]

log = logging.getLogger("cni_dra.recover")


@dataclass
class RecoveryReport:
    """What :func:`recover` or :func:`repair` did: one human-readable line per change in
    ``changes``, one per failure in ``errors`` (those attachments stay for the next run)."""

    changes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _same_owner(a: Owner | None, b: Owner) -> bool:
    return a is not None and (a.pid, a.start, a.boot) == (b.pid, b.start, b.boot)


def _netns_usable(path: str) -> bool:
    """True when ``path`` is a live netns other than the host's (errors count as unusable)."""
    from cni_dra.netlink.netns import is_host_netns, netns_exists

    if not path:
        return False
    try:
        return netns_exists(path) and not is_host_netns(path)
    except CniError:
        return False


def _netns_gone(path: str) -> bool:
    from cni_dra.netlink.netns import netns_exists

    if not path:
        return True
    try:
        return not netns_exists(path)
    except CniError:
        return False  # exists but is odd: not ours to judge gone


def _undo(
    att: Attachment, environ: Mapping[str, str], cni_path: Sequence[str] | None, *, earlier_boot: bool = False
) -> str:
    """Undo (``adding``) or finish (``deleting``, ``ready``) one attachment's side effects."""
    from cni_dra.netlink import info
    from cni_dra.verbs.release import release_attachment, release_temp_link

    finishing = att.phase != "adding"
    remove = False
    usable = _netns_usable(att.netns)
    if usable:
        remove = finishing or STEP_LINK in att.steps
        if not remove:  # an ADD that died: its link, if it made it, sits on the recorded parent
            parent = info.host_parent_of(att.netns, att.ifname)
            remove = parent is not None and parent.name == att.parent
    # ``earlier_boot``: the intent's owner ran in an earlier boot; records of older versions
    # kept their steps unsynced, so the last may be lost: release IPAM anyway (an IPAM DEL
    # of nothing is a no-op). STEP_LINK is only in such older records.
    ipam = finishing or STEP_LINK in att.steps or STEP_IPAM in att.steps or earlier_boot
    done = release_temp_link(att) if usable else []  # an ADD killed before its rename
    done += release_attachment(att, environ, cni_path, delete_link=remove, release_ipam=ipam)
    done.append(f"{_charge(att)} on {att.device} released")
    return "; ".join(done)


def _charge(att: Attachment) -> str:
    return ",".join(f"{k} {v}" for k, v in sorted(att.consumedCapacity.items())) or "the whole device (no amount recorded)"


def _describe(att: Attachment) -> str:
    return f"attachment {att.network}/{att.containerID}/{att.ifname} ({att.phase}, steps {', '.join(att.steps) or '-'})"


def _anything_to_do(st: NodeState, boot: str) -> bool:
    if st.bootID != boot:
        return True
    return any(a.phase != "ready" and not owner_alive(a.owner) for a in st.attachments)


def recover(
    store: StateStore, *, environ: Mapping[str, str], cni_path: Sequence[str] | None = None
) -> RecoveryReport:
    """Finish or undo stale intents and release attachments lost in a reboot (module docstring).

    ``environ``: base environment for IPAM plugins (CNI_PATH from ``cni_path`` when given).
    Returns the report. Raises StateError (5) for an unreadable state file and
    TryAgainLaterError (11) on lock timeout; per-attachment failures go to ``errors``.
    """
    report = RecoveryReport()
    boot = boot_id()
    if not (store.path.exists() or store.backup_path.exists()):
        return report  # no state yet: nothing to recover, and nothing is created
    if not _anything_to_do(store.peek(), boot):  # the common case costs no lock
        return report
    me = current_owner()
    work: list[tuple[Attachment, bool]] = []  # (copy, its owner ran in an earlier boot)
    with store.transaction() as st:
        rebooted = st.bootID is not None and st.bootID != boot
        for att in list(st.attachments):
            if att.phase in ("adding", "deleting"):
                if owner_alive(att.owner):
                    continue
                why = "its process died"
            elif rebooted and _netns_gone(att.netns):
                why = "the node rebooted and its netns is gone"
            else:
                continue
            earlier = att.owner is not None and bool(att.owner.boot) and att.owner.boot != boot
            phase = "deleting" if att.phase == "ready" else att.phase
            taken = st.update(att, phase=phase, owner=me)
            work.append((taken, earlier))
            report.changes.append(f"{_describe(taken)}: {why}")
        if st.bootID != boot:
            if rebooted:
                report.changes.append(f"boot id changed from {st.bootID} to {boot}")
            st.set_boot_id(boot)
    for att, earlier in work:
        try:
            what = _undo(att, environ, cni_path, earlier_boot=earlier)
        except CniError as exc:
            report.errors.append(f"{_describe(att)}: {exc.msg}")
            log.error("recovery of %s failed: %s", att.key, exc.msg)
            continue
        with store.transaction() as st:
            cur = st.find(*att.key)
            if cur is not None and _same_owner(cur.owner, me):
                st.remove(*att.key)
        if att.phase == "adding" and att.claim is not None:  # claim mode: the agent reports it on the claim
            from cni_dra.state.claim_status import record_add_failure

            record_add_failure(store, att, TryAgainLaterError(
                f"the ADD of {att.ifname} for container {att.containerID} was interrupted (its process died); undone"))
        report.changes.append(f"{_describe(att)}: {what}")
        log.warning("recovered %s: %s", att.key, what)
    return report


def recover_pending(inv: Invocation) -> RecoveryReport:
    """:func:`recover` for a plugin invocation (start of ADD, DEL, GC). Raises as :func:`recover`."""
    return recover(inv.store, environ=inv.environ, cni_path=inv.env.path)


def _live_links(state: NodeState) -> dict[tuple[str, str], str]:
    """(netns, ifname) → host parent name for each attachment whose link is alive."""
    from cni_dra.netlink import info

    out = {}
    for att in state.attachments:
        if not _netns_usable(att.netns):
            continue
        try:
            parent = info.host_parent_of(att.netns, att.ifname)
        except CniError:
            continue
        if parent is not None:
            out[(att.netns, att.ifname)] = parent.name
    return out


REPAIR_NETWORK = "cni-dra-repair"
"""Network name of the placeholder attachments ``state repair`` makes for untracked live links."""


def _pod_netns_paths() -> list[str]:
    """Every usable network namespace under ``/var/run/netns`` but the host's, sorted."""
    import os

    try:
        names = sorted(os.listdir("/var/run/netns"))
    except OSError:
        return []
    return [path for path in (f"/var/run/netns/{name}" for name in names) if _netns_usable(path)]


def _known_links(live: Iterable[tuple[str, str]]) -> set[tuple[NetnsIdentity, str]]:
    """(namespace identity, ifname) of the attachments' live links ``live`` ((netns path,
    ifname), as :func:`_live_links` keys them): a namespace is the same whatever path names it."""
    from cni_dra.netlink.netns import netns_identity_or_none

    return {(ident, ifname) for path, ifname in live if (ident := netns_identity_or_none(path)) is not None}


def _untracked_links(
    paths: Sequence[str], known: set[tuple[NetnsIdentity, str]], parents: set[str]
) -> list[tuple[str, str, str, str]]:
    """Macvlan/ipvlan links in the namespaces ``paths`` on an inventory NIC that no
    attachment names (``known``: :func:`_known_links`, by namespace identity, so a pod added
    as ``/run/netns/x`` is found tracked under ``/var/run/netns/x``): (netns path, link name,
    link kind, parent host name)."""
    from cni_dra.netlink import info
    from cni_dra.netlink.netns import in_netns, netns_identity

    found: list[tuple[str, str, str, str]] = []
    for path in paths:
        try:
            ident = netns_identity(path)
            with in_netns(path):
                kids = [(li.name, li.kind) for li in info.list_host_links() if li.kind in ("macvlan", "ipvlan")]
            for kid, kind in kids:
                if (ident, kid) in known:
                    continue
                parent = info.host_parent_of(path, kid)
                if parent is not None and parent.name in parents:
                    found.append((path, kid, str(kind), parent.name))
        except CniError:
            continue
    return found


def _remove_leaked_ifbs(paths: Sequence[str], report: RecoveryReport) -> None:
    """Delete the ifb devices in ``paths`` whose shaped link is gone and that no record
    names any more (:func:`cni_dra.netlink.shaping.remove_leaked_ifbs`); one change each."""
    from cni_dra.netlink import shaping

    for path in paths:
        try:
            removed = shaping.remove_leaked_ifbs(path)
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
    paths = _pod_netns_paths()
    with store.replace() as view:
        base = _repair_base(store, view, report)
        if base is not None:
            live = _live_links(base)
            kept = _reconcile(base.attachments, live, environ, cni_path, report)
            found = _untracked_links(paths, _known_links(live), set(parents))
            kept += _charge_untracked([f for f in found if not is_temp_name(f[1])], slice_, report)
            _remove_temp_links([f for f in found if is_temp_name(f[1])], kept, report)
            view.write(base.model_copy(update={"attachments": Attachments(kept), "bootID": boot_id()}))
    _remove_leaked_ifbs(paths, report)
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
    why = view.backup_error.msg if view.backup_error else "no backup"
    report.changes.append(f"{why}: starting from an empty state (prepared claims are lost; "
                          "the kubelet prepares them again)")
    return NodeState()


def _reconcile(
    attachments: Iterable[Attachment],
    live: Mapping[tuple[str, str], str],
    environ: Mapping[str, str],
    cni_path: Sequence[str] | None,
    report: RecoveryReport,
) -> list[Attachment]:
    """The attachments repair keeps (see :func:`repair`); the others are released."""
    keep = []
    for att in attachments:
        parent = live.get((att.netns, att.ifname))
        # An in-flight intent stays, unless it is an ADD whose link is live: the records
        # past a bad journal line are lost, so its "ready" may have been among them, and
        # its owner (a resident agent) lives on; it is kept as ready below, else its DEL
        # would answer "ADD in progress" for as long as the agent runs.
        if att.phase != "ready" and owner_alive(att.owner) and not (
            att.phase == "adding" and parent == att.parent
        ):
            keep.append(att)
            continue
        if att.phase != "deleting" and parent == att.parent:
            if att.phase == "adding":  # the backup is one write behind: the ADD may have completed
                report.changes.append(f"kept {_describe(att)} as ready: its link is live on {parent}")
                att = att.model_copy(update={"phase": "ready", "owner": None, "steps": (), "tempName": None})
            keep.append(att)
            continue
        try:
            earlier = att.owner is not None and bool(att.owner.boot) and att.owner.boot != boot_id()
            what = _undo(att, environ, cni_path, earlier_boot=earlier)
        except CniError as exc:
            report.errors.append(f"{_describe(att)}: {exc.msg}; kept")
            keep.append(att)
            continue
        report.changes.append(f"dropped {_describe(att)}: link not live; {what}")
    return keep


def _remove_temp_links(found: Sequence[tuple[str, str, str, str]], kept: Sequence[Attachment],
                       report: RecoveryReport) -> None:
    """Delete the links of ``found`` (:func:`_untracked_links`) left under a temporary name,
    except those an ADD still running may be renaming (the names of its ``tempName``)."""
    from cni_dra.netlink import sublink
    from cni_dra.netlink.netns import netns_identity_or_none

    running = {(ident, name) for a in kept if a.tempName and a.phase == "adding"
               and (ident := netns_identity_or_none(a.netns)) is not None
               for name in sublink.temp_names(a.tempName)}
    for netns, kid, _kind, _parent in found:
        if (netns_identity_or_none(netns), kid) in running:
            continue
        try:
            if sublink.delete_link(netns, kid):
                report.changes.append(f"removed leaked temporary link {kid} in {netns}")
        except CniError as exc:
            report.errors.append(f"leaked temporary link {kid} in {netns}: {exc.msg}")


def _charge_untracked(
    found: Sequence[tuple[str, str, str, str]], slice_: ResourceSlice | None, report: RecoveryReport,
) -> list[Attachment]:
    """Placeholder attachments charging untracked links on inventory NICs (see :func:`repair`)."""
    out: list[Attachment] = []
    by_parent = {}
    if slice_ is not None:
        from cni_dra.dra.models import device_attribute

        by_parent = {device_attribute(d, "ifName", slice_.spec.driver): d for d in slice_.spec.devices}
    for netns, kid, kind, parent_name in found:
        device = by_parent.get(parent_name)
        where = f"{kid} in {netns} on {parent_name}"
        if device is None or slice_ is None:
            report.changes.append(f"untracked link {where}: not charged (no inventory device for it)")
            continue
        out.append(Attachment(
            network=REPAIR_NETWORK, containerID=f"repair-{netns.rsplit('/', 1)[-1]}"[:128], ifname=kid,
            netns=netns, driver=slice_.spec.driver, pool=slice_.spec.pool.name, device=device.name,
            parent=parent_name, linkType=kind, phase="ready",
            consumedCapacity={k: c.value for k, c in device.capacity.items()},
        ))
        report.changes.append(
            f"untracked link {where}: charged the whole capacity of device {device.name} "
            "(its share is unknown) until its pod's DEL"
        )
    return out
