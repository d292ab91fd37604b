"""GC: release every attachment of this network that the runtime no longer knows.

Source: CNI spec 1.1.0 "GC: Clean up any stale resources" (config version >= 1.1.0,
gated by the entry point with code 1) — the config carries ``cni.dev/valid-attachments``
(older runtimes: ``cni.dev/attachments``), a list of ``{"containerID", "ifname"}`` (keys
matched as libcni's Go decoding does, in any case; an entry without both is refused with
code 7 before anything is collected: :func:`cni_dra.protocol.config.gc_attachments`). For
each attachment of this network (``name``) in state that is not listed: delete its link
(only in the namespace it was added in, by identity, and only when a link of its name there
sits on its recorded NIC: :func:`cni_dra.attach.release.recorded_link_place`), release
its IPAM with the config recorded at ADD, release its capacity. Then GC is forwarded to the IPAM plugin (skipped for plugins older
than spec 1.1.0, which have no GC). Errors are collected and GC continues past them; the
first is raised at the end (its own CNI code), its ``details`` listing every failure.

What GC leaves alone, whatever the list says (README "Failure modes"):

* everything, when the config carries neither list (a hand-run or a runtime bug: an absent
  list says nothing about which attachments are stale, unlike an empty one) or sets
  ``disableGC`` (libcni keeps that key at the conflist level and then never calls GC; a
  config that carries it anyway gets a no-op);
* an attachment still being added or deleted (an ADD or DEL whose process is alive;
  stale ones were recovered first);
* an attachment that became ready less than :data:`GRACE_S` ago: the runtime may have
  built its list before that ADD finished;
* ``state repair``'s placeholders (network :data:`cni_dra.attach.rebuild.REPAIR_NETWORK`, also
  when the GC names that network): they charge a live link no record tracks, and only the
  DEL of that link's pod releases them.

The IPAM plugin's GC gets the runtime's list plus the attachments spared here, so it does
not release their addresses either.
"""

from __future__ import annotations

import json
import logging
import time

from cni_dra.attach.invocation import Invocation, ipam_codes
from cni_dra.errors import CniError

__all__ = ["GRACE_S", "cmd_gc"]

log = logging.getLogger("cni_dra.gc")

GRACE_S = 300.0
"""How long after its ADD finished an attachment is safe from GC (seconds).

A runtime builds its list of valid attachments, then sends GC; an ADD that finished in
between is not on the list. The gap is bounded by what the runtime does before the GC
reaches the plugin: CRI-O's ocicni takes its network lock for GC, so the GC waits behind
the sandbox operations already in flight, each bounded by the kubelet's CRI request
timeout (``runtimeRequestTimeout``, 2 min by default; past it the kubelet gives up and the
runtime deletes the sandbox with DEL itself); and the sandbox whose ADD finished joins
the runtime's list only when the rest of its start-up is done (the same bound). Then this
GC may wait for the state lock (``lockTimeoutSeconds``, 10 s by default). Five minutes is
more than twice the sum. What it costs: an attachment that really is stale and younger
than that survives one GC and is collected by the next one (DEL still releases it at any
time)."""


def cmd_gc(inv: Invocation) -> None:
    """Run GC for ``inv``. See module docstring."""
    conf = inv.conf
    if conf.disableGC:
        log.info("GC of network %r: disableGC is set; nothing collected", conf.name)
        return
    valid = conf.valid_attachments
    if valid is None:
        log.warning(
            "GC of network %r: the config has neither cni.dev/valid-attachments nor cni.dev/attachments; "
            "nothing collected (an absent list is not an empty one)",
            conf.name,
        )
        return

    from cni_dra.attach.rebuild import REPAIR_NETWORK
    from cni_dra.attach.recover import recover_pending
    from cni_dra.attach.release import recorded_link_place, release_attachment

    recover_pending(inv)  # stale intents and attachments lost in a reboot, before judging the rest
    keep = {(a["containerID"], a["ifname"]) for a in valid}
    now_s = time.time()
    stale, spared = [], []
    for att in inv.store.read().attachments:
        if att.network != conf.name or att.network == REPAIR_NETWORK or (att.containerID, att.ifname) in keep:
            continue
        age_s = att.ready_age_s(now_s)
        if att.phase != "ready":
            spared.append(att)
            log.info(
                "GC of network %r: %s/%s is %s (in progress); left alone",
                conf.name,
                att.containerID,
                att.ifname,
                att.phase,
            )
        elif age_s is not None and age_s < GRACE_S:
            spared.append(att)
            log.info(
                "GC of network %r: %s/%s became ready %.0f s ago (< %.0f s); left alone",
                conf.name,
                att.containerID,
                att.ifname,
                age_s,
                GRACE_S,
            )
        else:
            stale.append(att)
    errors: list[CniError] = []
    for att in stale:
        try:
            where = recorded_link_place(att, inv.host)
            release_attachment(
                att, inv.environ, inv.env.path, host=inv.host, delete_link=where is not None, netns=where
            )
            with inv.store.transaction() as txn:
                txn.remove(*att.key)
        except CniError as exc:
            log.error("GC of %s failed: %s", att.key, exc.msg)
            exc.msg = f"failed to garbage-collect attachment {att.containerID}/{att.ifname}: {exc.msg}"
            errors.append(exc)
    if conf.ipam_type:
        raw = (
            inv.raw
            if not spared
            else _with_valid(inv.raw, [{"containerID": a.containerID, "ifname": a.ifname} for a in spared])
        )
        try:
            with ipam_codes():
                inv.host.ipam_gc(conf.ipam_type, raw, inv.environ, inv.env.path)
        except CniError as exc:
            log.error("IPAM GC failed: %s", exc.msg)
            errors.append(exc)
    if errors:
        first = errors[0]
        if len(errors) > 1:
            first.details = "; ".join(e.msg for e in errors)
        raise first


def _with_valid(raw: bytes, extra: list[dict[str, str]]) -> bytes:
    """The GC config ``raw`` with ``extra`` appended to each list of valid attachments it has."""
    obj = json.loads(raw)
    for key in ("cni.dev/valid-attachments", "cni.dev/attachments"):
        if isinstance(obj.get(key), list):
            obj[key] = [*obj[key], *extra]
    return json.dumps(obj).encode()
