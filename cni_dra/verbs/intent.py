"""Intents: what an ADD or DEL in progress has recorded, so that a crash at any point is
recoverable (:mod:`cni_dra.verbs.recover` finishes or undoes them).

ADD records its attachment as ``adding`` with its owner process before the first side
effect, in its reserving transaction (:mod:`cni_dra.verbs.add`), which returns an
:class:`AddIntent`; the IPAM step (:data:`~cni_dra.state.models.STEP_IPAM`) is recorded
there too when the network has IPAM (recovery then runs the IPAM DEL, a no-op when the
ADD had not reached IPAM), and the link needs no step: recovery deletes a link of that
name only when it sits on the recorded parent NIC, never another plugin's, and likewise a
link left under the temporary name the intent records (``tempName``: the ADD was killed
between creating the link and renaming it). The intent
ends with :meth:`AddIntent.complete` or :meth:`AddIntent.abandon`. DEL marks it
``deleting`` before its first effect (:func:`begin_delete`) and drops it after the last
(:func:`finish_delete`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cni_dra.errors import StateError, StateWriteError, TryAgainLaterError
from cni_dra.state import Attachment
from cni_dra.state.owner import current_owner, owner_alive
from cni_dra.verbs.common import Invocation
from cni_dra.verbs.recover import REPAIR_NETWORK, recover_pending

__all__ = ["AddIntent", "begin_delete", "finish_delete"]

log = logging.getLogger("cni_dra.intent")


def begin_delete(inv: Invocation) -> Attachment | None:
    """Start of DEL: recovery, then mark the attachment ``deleting`` (the intent) and return it.

    Returns None when the attachment is not in state, or when the state file is unreadable:
    DEL then still removes the link and releases IPAM from the runtime's config (logged).
    Raises TryAgainLaterError (11) while an ADD of the same attachment is in flight or the
    lock times out.
    """
    key = (inv.conf.name, inv.env.container_id, inv.env.ifname)
    try:
        recover_pending(inv)
        # Not fsync'ed (nor is finish_delete): a DEL record lost in a
        # kernel crash leaves the attachment charged until the first ADD/DEL/GC after the
        # reboot, which releases every attachment of the previous boot whose netns is gone.
        with inv.store.transaction(durable=False) as st:
            att = st.find(*key)
            if att is None:
                from cni_dra.netlink.netns import same_netns

                # A placeholder that ``state repair`` made for this pod's untracked link (the
                # same namespace by identity: repair names it /var/run/netns/..., the runtime
                # may say /run/netns/...).
                for placeholder in st.attachments:
                    if (placeholder.network == REPAIR_NETWORK and placeholder.ifname == inv.env.ifname
                            and inv.env.netns and same_netns(placeholder.netns, inv.env.netns)):
                        st.remove(*placeholder.key)
                        log.info("DEL %s: released the repair placeholder of %s", key, placeholder.ifname)
                        break
                return None
            if att.phase == "adding" and owner_alive(att.owner):
                raise TryAgainLaterError(
                    f"failed to delete {inv.env.ifname} for container {inv.env.container_id}: an ADD of "
                    "the same attachment is still in progress"
                )
            return st.update(att, phase="deleting", owner=current_owner())
    except StateWriteError:
        raise  # nothing written, nothing removed: the runtime retries the DEL
    except StateError as exc:
        log.error("DEL %s: %s; removing the link and releasing IPAM from the runtime's config only", key, exc.msg)
        return None


def finish_delete(inv: Invocation) -> None:
    """End of DEL: drop the attachment (its capacity is released)."""
    # Not fsync'ed (see begin_delete): a reboot releases it.
    with inv.store.transaction(durable=False) as state:
        state.remove(inv.conf.name, inv.env.container_id, inv.env.ifname)


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
        :func:`cni_dra.verbs.shaping.record`; None: none): phase ``ready``, ``readyAt`` now, no
        owner or steps. Raises StateError (5), ClaimError (101) if the record vanished."""
        from cni_dra.errors import ClaimError
        from cni_dra.state.claim_status import claim_status_record
        from cni_dra.state.models import ready_at

        with self.inv.store.transaction() as state:
            recorded = state.find(*self.key)
            if recorded is None:  # pragma: no cover - only a concurrent GC/repair could do this
                raise ClaimError(f"failed to complete ADD of {self.key}: the attachment vanished from state")
            extra = {"shaping": shaping} if shaping is not None else {}
            ready = state.update(recorded, phase="ready", result=result, owner=None, steps=(), tempName=None,
                                 readyAt=ready_at(time.time()), **extra)  # GC spares it for a grace period
            if ready.claim is not None:  # claim mode: the agent writes it into the claim's status
                state.add_status_update(claim_status_record(ready))

    def abandon(self) -> None:
        """Drop the record (capacity released)."""
        with self.inv.store.transaction() as state:
            state.remove(*self.key)
