"""Intents: what an ADD or DEL in progress has recorded, so that a crash at any point is
recoverable (:mod:`cni_dra.verbs.recover` finishes or undoes them).

ADD records its attachment as ``adding`` with its owner process before the first side
effect (the reserving transaction in :mod:`cni_dra.verbs.add`) and appends a step after
each (:func:`record_step`: :data:`~cni_dra.state.models.STEP_LINK`,
:data:`~cni_dra.state.models.STEP_IPAM`). DEL marks it ``deleting`` before its first
(:func:`begin_delete`) and drops it after the last (:func:`finish_delete`).
"""

from __future__ import annotations

import logging

from cni_dra.errors import StateError, StateWriteError, TryAgainLaterError
from cni_dra.state import Attachment
from cni_dra.state.owner import current_owner, owner_alive
from cni_dra.verbs.common import Invocation
from cni_dra.verbs.recover import REPAIR_NETWORK, recover_pending

__all__ = ["record_step", "begin_delete", "finish_delete"]

log = logging.getLogger("cni_dra.intent")


def record_step(inv: Invocation, step: str) -> None:
    """Append ``step`` to the intent of this invocation's attachment (under the lock)."""
    key = (inv.conf.name, inv.env.container_id, inv.env.ifname)
    # Not fsync'ed: the record outlives this process (a crash), and after a kernel crash the
    # reboot rule of _undo releases IPAM of a previous boot's intent whatever its steps say.
    with inv.store.transaction(durable=False) as st:
        att = st.find(*key)
        if att is not None and step not in att.steps:
            att.steps = [*att.steps, step]  # assigned, so the store journals it


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
                # A placeholder that ``state repair`` made for this pod's untracked link.
                for placeholder in st.attachments:
                    if (placeholder.network == REPAIR_NETWORK and placeholder.netns == (inv.env.netns or "")
                            and placeholder.ifname == inv.env.ifname and inv.env.netns):
                        st.attachments.remove(placeholder)
                        log.info("DEL %s: released the repair placeholder of %s", key, placeholder.ifname)
                        break
                return None
            if att.phase == "adding" and owner_alive(att.owner):
                raise TryAgainLaterError(
                    f"failed to delete {inv.env.ifname} for container {inv.env.container_id}: an ADD of "
                    "the same attachment is still in progress"
                )
            att.phase = "deleting"
            att.owner = current_owner()
            return att.model_copy(deep=True)
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
