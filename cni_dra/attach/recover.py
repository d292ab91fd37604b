"""Crash recovery of the node state: stale intents and reboots.

Intent records (:mod:`cni_dra.state.schema`, :mod:`cni_dra.attach.intent`): ADD records its
attachment as ``adding`` with its owner process, and the IPAM step when the network has
IPAM, before the first side effect; DEL marks it ``deleting`` before its first. An intent whose owner
process is dead is *stale*.

:func:`recover` (run at the start of ADD, DEL and GC, and by ``cni-dra state recover``):

1. under the lock, take over every stale intent (owner := this process, so a concurrent
   recovery leaves it alone; marked ``recovering``, so the attachment's own ADD or DEL
   waits for it, :mod:`cni_dra.attach.intent`) and, when the kernel boot id differs from the recorded one
   (a reboot), every attachment of the previous boot whose netns is gone (as ``deleting``);
   prepared claims stay: the kubelet prepares them again after a reboot;
2. outside the lock, per attachment and per step: ``adding`` is undone (the link is deleted
   when the step says it was made, or when a link of that name sits on the recorded parent
   in the namespace the attachment recorded, by identity, and so is a link still under
   the temporary name the intent records; IPAM is released when its step was reached),
   ``deleting`` is finished (link, IPAM), both through :mod:`cni_dra.attach.release`;
3. under the lock, drop the attachment, releasing its capacity.

The runtime never saw a result for an ``adding`` attachment, so undoing is right; it will
retry the ADD or send DEL. Errors on one attachment are logged and give its intent back to
the owner it had, for the next recovery; the others proceed.

:mod:`cni_dra.attach.rebuild` (``cni-dra state repair``) rebuilds an unreadable state file
from the last good backup plus the live links, and uses :func:`undo_attachment` for what it drops.

Source: CNI spec 1.1.0 "DEL" (must succeed when things are already gone), "GC"; KEP-5075
(capacity is charged until released). Errors: StateError (5), TryAgainLaterError (11).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cni_dra.attach.invocation import Invocation
from cni_dra.errors import CniError, TryAgainLaterError
from cni_dra.state import Attachment, NodeState, StateStore
from cni_dra.state.owner import boot_id, current_owner, owner_alive
from cni_dra.state.schema import STEP_IPAM, STEP_LINK, Owner

if TYPE_CHECKING:
    from cni_dra.host.port import Host

__all__ = ["RecoveryReport", "describe_attachment", "recover", "recover_pending", "undo_attachment"]

log = logging.getLogger("cni_dra.recover")


@dataclass
class RecoveryReport:
    """What :func:`recover` or :func:`cni_dra.attach.rebuild.repair` did: one human-readable line per change in
    ``changes``, one per failure in ``errors`` (those attachments stay for the next run)."""

    changes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _same_owner(a: Owner | None, b: Owner) -> bool:
    return a is not None and (a.pid, a.start, a.boot) == (b.pid, b.start, b.boot)


def _netns_gone(path: str, host: Host) -> bool:
    if not path:
        return True
    try:
        return host.netns_lookup(path) is None
    except CniError:
        return False  # exists but is odd: not ours to judge gone


def undo_attachment(
    att: Attachment,
    environ: Mapping[str, str],
    cni_path: Sequence[str] | None,
    *,
    host: Host,
    earlier_boot: bool = False,
) -> str:
    """Undo (``adding``) or finish (``deleting``, ``ready``) one attachment's side effects.

    Its link goes only from the namespace it was added in (the recorded identity, wherever
    it is named now), and only when a link of its name there is absent (its ifb device, if
    left, goes) or sits on the recorded parent (:func:`~cni_dra.attach.release.recorded_link_place`);
    records of older versions with the link step delete it by name, as they always did."""
    from cni_dra.attach.release import (
        recorded_link_place,
        recorded_netns_path,
        release_attachment,
        release_temp_link,
    )

    finishing = att.phase != "adding"
    where = recorded_netns_path(att, host)
    if where is not None and (finishing or STEP_LINK not in att.steps):
        where = recorded_link_place(att, host)
    # ``earlier_boot``: the intent's owner ran in an earlier boot; records of older versions
    # kept their steps unsynced, so the last may be lost: release IPAM anyway (an IPAM DEL
    # of nothing is a no-op). STEP_LINK is only in such older records.
    ipam = finishing or STEP_LINK in att.steps or STEP_IPAM in att.steps or earlier_boot
    done = release_temp_link(att, host)  # an ADD killed before its rename
    done += release_attachment(
        att, environ, cni_path, host=host, delete_link=where is not None, release_ipam=ipam, netns=where
    )
    done.append(f"{_charge(att)} on {att.device} released")
    return "; ".join(done)


def _charge(att: Attachment) -> str:
    return (
        ",".join(f"{k} {v}" for k, v in sorted(att.consumedCapacity.items()))
        or "the whole device (no amount recorded)"
    )


def describe_attachment(att: Attachment) -> str:
    return f"attachment {att.network}/{att.containerID}/{att.ifname} ({att.phase}, steps {', '.join(att.steps) or '-'})"


def _anything_to_do(st: NodeState, boot: str) -> bool:
    if st.bootID != boot:
        return True
    return any(not owner_alive(a.owner) for a in st.attachments.intents())


def recover(
    store: StateStore,
    *,
    environ: Mapping[str, str],
    host: Host,
    cni_path: Sequence[str] | None = None,
) -> RecoveryReport:
    """Finish or undo stale intents and release attachments lost in a reboot (module docstring).

    ``environ``: base environment for IPAM plugins (CNI_PATH from ``cni_path`` when given).
    ``host``: the machine (:class:`cni_dra.host.port.Host`) links and IPAM are released on.
    Returns the report. Raises StateError (5) for an unreadable state file or a state
    directory that cannot be used (as every reader of it does: not a directory, not ours,
    not searchable) and TryAgainLaterError (11) on lock timeout; per-attachment failures go
    to ``errors``.
    """
    report = RecoveryReport()
    boot = boot_id()
    if not store.dir_exists() or not (store.path.exists() or store.backup_path.exists()):
        return report  # no state yet: nothing to recover, and nothing is created
    if not _anything_to_do(store.peek(), boot):  # the common case costs no lock
        return report
    me = current_owner()
    work: list[tuple[Attachment, bool, Owner | None]] = []  # (copy, owner ran in an earlier boot, that owner)
    with store.transaction() as txn:
        rebooted = txn.bootID is not None and txn.bootID != boot
        for att in list(txn.attachments):
            if att.phase in ("adding", "deleting"):
                if owner_alive(att.owner):
                    continue
                why = "its process died"
            elif rebooted and _netns_gone(att.netns, host):
                why = "the node rebooted and its netns is gone"
            else:
                continue
            earlier = att.owner is not None and bool(att.owner.boot) and att.owner.boot != boot
            phase = "deleting" if att.phase == "ready" else att.phase
            # ``recovering``: the attachment's own ADD or DEL waits for this instead of code 11
            taken = txn.update(att, phase=phase, owner=me, recovering=True)
            work.append((taken, earlier, att.owner))
            report.changes.append(f"{describe_attachment(taken)}: {why}")
        if txn.bootID != boot:
            if rebooted:
                report.changes.append(f"boot id changed from {txn.bootID} to {boot}")
            txn.set_boot_id(boot)
    for att, earlier, was in work:
        try:
            what = undo_attachment(att, environ, cni_path, host=host, earlier_boot=earlier)
        except CniError as exc:
            report.errors.append(f"{describe_attachment(att)}: {exc.msg}")
            log.error("recovery of %s failed: %s", att.key, exc.msg)
            _give_back(store, att, me, was)
            continue
        with store.transaction() as txn:
            cur = txn.find(*att.key)
            if cur is not None and _same_owner(cur.owner, me):
                txn.remove(*att.key)
        if att.phase == "adding" and att.claim is not None:  # claim mode: the agent reports it on the claim
            from cni_dra.state.claim_status import record_add_failure

            record_add_failure(
                store,
                att,
                TryAgainLaterError(
                    f"the ADD of {att.ifname} for container {att.containerID} was interrupted (its process died); undone"
                ),
            )
        report.changes.append(f"{describe_attachment(att)}: {what}")
        log.warning("recovered %s: %s", att.key, what)
    return report


def _give_back(store: StateStore, att: Attachment, me: Owner, was: Owner | None) -> None:
    """After a failed recovery of ``att``: its intent goes back to the owner it had (``was``,
    dead), so the next recovery (any process's) tries again, rather than staying with this
    process, which may live on (an agent) and would hold it, and the attachment's own
    ADD or DEL, for as long as it runs."""
    try:
        with store.transaction() as txn:
            cur = txn.find(*att.key)
            if cur is not None and _same_owner(cur.owner, me):
                txn.update(cur, owner=was, recovering=None)
    except CniError as exc:  # the intent stays with this process; its death frees it
        log.error("recovery of %s: could not give the intent back: %s", att.key, exc.msg)


def recover_pending(inv: Invocation) -> RecoveryReport:
    """:func:`recover` for a plugin invocation (start of ADD, DEL, GC). Raises as :func:`recover`."""
    return recover(inv.store, environ=inv.environ, host=inv.host, cni_path=inv.env.path)
