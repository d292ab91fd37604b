"""Intents: what an ADD or DEL in progress has recorded, so that a crash at any point is
recoverable (:mod:`cni_dra.attach.recover` finishes or undoes them).

ADD records its attachment as ``adding`` with its owner process before the first side
effect, in its reserving transaction (:mod:`cni_dra.verbs.add`), which returns an
:class:`AddIntent`; the IPAM step (:data:`~cni_dra.state.schema.STEP_IPAM`) is recorded
there too when the network has IPAM (recovery then runs the IPAM DEL, a no-op when the
ADD had not reached IPAM), and the link needs no step: recovery deletes a link of that
name only when it sits on the recorded parent NIC, never another plugin's, and likewise a
link left under the temporary name the intent records (``tempName``: the ADD was killed
between creating the link and renaming it). The intent
ends with :meth:`AddIntent.complete` or :meth:`AddIntent.abandon`. DEL marks it
``deleting`` before its first effect (:func:`begin_delete`) and drops it after the last
(:func:`finish_delete`).

An intent of a live process stops another ADD or DEL of the same attachment with code 11
("still in progress"), except one that recovery took over from a dead process
(``recovering``, :mod:`cni_dra.attach.recover`): the attachment's own ADD or DEL (the retry
of the interrupted invocation, typically) waits for that recovery to finish, at most
``lockTimeoutSeconds`` (:func:`wait_for_recovery`), then goes on; only past that bound does
it answer code 11 (:class:`RecoveryInProgressError`).

An intent names its owner by process, and the agent serves verbs in threads: a second DEL
of an attachment in another thread of the process whose DEL holds its intent would take
that intent over as from another live process, and the first, ending, would then drop the
record while the second still releases the link and the address (after which a new ADD of
the same attachment could reserve it beside them). So DELs of one attachment run one at a
time in a process (:func:`one_delete_at_a_time`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from cni_dra.attach.invocation import Invocation
from cni_dra.attach.rebuild import REPAIR_NETWORK
from cni_dra.attach.recover import recover_pending
from cni_dra.errors import StateError, StateWriteError, TryAgainLaterError
from cni_dra.state import Attachment
from cni_dra.state.owner import current_owner, owner_alive

__all__ = [
    "AddIntent",
    "RecoveryInProgressError",
    "begin_delete",
    "finish_delete",
    "one_delete_at_a_time",
    "recovery_holds",
    "wait_for_recovery",
]

log = logging.getLogger("cni_dra.intent")

_RECOVERY_POLL_S = 0.02


class RecoveryInProgressError(TryAgainLaterError):
    """The attachment ``key``'s intent is held by a live process that is recovering it (code
    11 when it is still held after the wait, :func:`wait_for_recovery`)."""

    def __init__(self, msg: str, key: tuple[str, str, str]) -> None:
        super().__init__(msg)
        self.key = key


def recovery_holds(att: Attachment) -> bool:
    """Whether ``att`` is an intent that a live process took over to recover it."""
    return bool(att.recovering) and att.phase != "ready" and owner_alive(att.owner)


def recovery_in_progress(inv: Invocation, att: Attachment, verb: str) -> RecoveryInProgressError:
    """The error for ``verb`` (``add``, ``delete``) of ``inv``'s attachment ``att``, held by a recovery."""
    pid = att.owner.pid if att.owner else "?"
    return RecoveryInProgressError(
        f"failed to {verb} {inv.env.ifname} for container {inv.env.container_id}: its interrupted "
        f"{'ADD' if att.phase == 'adding' else 'DEL'} is still being recovered by process {pid}",
        att.key,
    )


def wait_for_recovery(inv: Invocation, busy: RecoveryInProgressError, deadline: float) -> None:
    """Wait until no live recovery holds the attachment ``busy.key`` (it finished, failed and
    gave the intent back, or its process died), polling the state without the lock; raise
    ``busy`` (code 11) at ``deadline`` (the host's :meth:`~cni_dra.host.port.Host.monotonic`).
    An unreadable state ends the wait (the caller's next step reports it)."""
    host = inv.host
    while True:
        if host.monotonic() >= deadline:
            raise busy
        host.sleep(_RECOVERY_POLL_S)
        try:
            att = inv.store.peek().find(*busy.key)
        except StateError:
            return
        if att is None or not recovery_holds(att):
            return


_deletes = threading.Condition()
_deleting: set[tuple[str, str, str]] = set()  # attachments whose DEL runs in this process


@contextlib.contextmanager
def one_delete_at_a_time(inv: Invocation) -> Iterator[None]:
    """Run a whole DEL of ``inv``'s attachment alone among this process's threads (module
    docstring): a DEL of it in another thread is waited for, at most ``lockTimeoutSeconds``,
    then code 11 (TryAgainLaterError). An in-process invocation, alone in its process, never waits."""
    key = inv.key
    with _deletes:
        if not _deletes.wait_for(lambda: key not in _deleting, timeout=inv.conf.lockTimeoutSeconds):
            raise TryAgainLaterError(
                f"failed to delete {inv.env.ifname} for container {inv.env.container_id}: a DEL of the "
                "same attachment is still in progress"
            )
        _deleting.add(key)
    try:
        yield
    finally:
        with _deletes:
            _deleting.discard(key)
            _deletes.notify_all()


def begin_delete(inv: Invocation) -> Attachment | None:
    """Start of DEL: :func:`_begin_delete`, waiting for a recovery of the same attachment
    (module docstring). Raises as it does."""
    deadline: float | None = None
    while True:
        try:
            return _begin_delete(inv)
        except RecoveryInProgressError as busy:
            if deadline is None:
                deadline = inv.host.monotonic() + inv.conf.lockTimeoutSeconds
            wait_for_recovery(inv, busy, deadline)


def _begin_delete(inv: Invocation) -> Attachment | None:
    """Start of DEL: recovery, then mark the attachment ``deleting`` (the intent) and return it.

    Returns None when the attachment is not in state, or when the state file is unreadable:
    DEL then still removes the link and releases IPAM from the runtime's config (logged).
    Raises TryAgainLaterError (11) while an ADD of the same attachment is in flight or the
    lock times out.
    """
    key = inv.key
    try:
        recover_pending(inv)
        # Not fsync'ed (nor is finish_delete): a DEL record lost in a
        # kernel crash leaves the attachment charged until the first ADD/DEL/GC after the
        # reboot, which releases every attachment of the previous boot whose netns is gone.
        with inv.store.transaction(durable=False) as txn:
            att = txn.find(*key)
            if att is None:
                from cni_dra.attach.release import names_recorded_netns

                # A placeholder that ``state repair`` made for this pod's untracked link (the
                # same namespace by identity: repair names it /var/run/netns/..., the runtime
                # may say /run/netns/...).
                ident = None
                for placeholder in txn.attachments:
                    if (
                        placeholder.network != REPAIR_NETWORK
                        or placeholder.ifname != inv.env.ifname
                        or not inv.env.netns
                    ):
                        continue
                    ident = ident or inv.host.netns_identity_or_none(inv.env.netns)
                    if names_recorded_netns(placeholder, inv.env.netns, ident, inv.host):
                        txn.remove(*placeholder.key)
                        log.info("DEL %s: released the repair placeholder of %s", key, placeholder.ifname)
                        break
                return None
            if att.phase == "adding" and recovery_holds(att):
                raise recovery_in_progress(inv, att, "delete")
            if att.phase == "adding" and owner_alive(att.owner):
                raise TryAgainLaterError(
                    f"failed to delete {inv.env.ifname} for container {inv.env.container_id}: an ADD of "
                    "the same attachment is still in progress"
                )
            return txn.update(att, phase="deleting", owner=current_owner(), recovering=None)
    except StateWriteError:
        raise  # nothing written, nothing removed: the runtime retries the DEL
    except StateError as exc:
        log.error(
            "DEL %s: %s; removing the link and releasing IPAM from the runtime's config only", key, exc.msg
        )
        return None


def finish_delete(inv: Invocation) -> None:
    """End of DEL: drop the attachment (its capacity is released), while it is still this
    DEL's ``deleting`` intent. Another process may own the record by now: a concurrent DEL
    of the same attachment that took the intent over (it drops the record when it is done,
    or recovery does if it dies), or, once that one dropped it, a new ADD of the same
    container and interface (``adding``, then ``ready``). Dropping such a record would release
    capacity and forget a link and an address still held, and let one more ADD in beside them."""
    # Not fsync'ed (see begin_delete): a reboot releases it.
    with inv.store.transaction(durable=False) as txn:
        att = txn.find(*inv.key)
        if att is None:
            return
        if att.phase != "deleting" or att.owner != current_owner():
            log.info("DEL %s: the record is now %s of another process; left to it", att.key, att.phase)
            return
        txn.remove(*att.key)


class AddIntent:
    """The handle of an ADD in progress, returned by its reserving transaction (the
    attachment recorded ``adding`` with its owner and steps, capacity charged).

    :meth:`complete` makes it ``ready`` with its result (one synced transaction, which also
    leaves the claim status record of a claim-mode attachment); :meth:`abandon` drops it,
    releasing the capacity (the ADD's last undo).
    """

    def __init__(self, inv: Invocation, att: Attachment) -> None:
        self.inv = inv
        self.att = att  # as reserved

    @property
    def key(self) -> tuple[str, str, str]:
        return self.att.key

    def complete(self, result: dict[str, Any], shaping: dict[str, Any] | None = None) -> None:
        """Record ``result`` (CNI 1.1.0 form) and ``shaping`` (the traffic control installed,
        :func:`cni_dra.attach.shaping_plan.record`; None: none): phase ``ready``, ``readyAt`` now, no
        owner or steps. Raises StateError (5), ClaimError (101) if the record vanished."""
        from cni_dra.errors import ClaimError
        from cni_dra.state.claim_status import claim_status_record
        from cni_dra.state.schema import ready_at

        with self.inv.store.transaction() as txn:
            recorded = txn.find(*self.key)
            if recorded is None:  # pragma: no cover - only a concurrent GC/repair could do this
                raise ClaimError(f"failed to complete ADD of {self.key}: the attachment vanished from state")
            extra = {"shaping": shaping} if shaping is not None else {}
            ready = txn.update(
                recorded,
                phase="ready",
                result=result,
                owner=None,
                steps=(),
                tempName=None,
                recovering=None,
                readyAt=ready_at(time.time()),
                **extra,
            )  # GC spares it for a grace period
            if ready.claim is not None:  # claim mode: the agent writes it into the claim's status
                txn.add_status_update(claim_status_record(ready))

    def abandon(self) -> None:
        """Drop the record (capacity released)."""
        with self.inv.store.transaction() as txn:
            txn.remove(*self.key)
