"""What every verb needs: the invocation (env, config, raw stdin), the inventory, the state store."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from types import EllipsisType
from typing import TYPE_CHECKING, Any

from cni_dra.errors import ClaimError, IpamError, StateError
from cni_dra.protocol.config import NetConf
from cni_dra.protocol.env import CniEnv
from cni_dra.state import StateStore
from cni_dra.state.schema import PreparedClaim, PreparedResult

if TYPE_CHECKING:
    from cni_dra.dra.objects import ResourceSlice
    from cni_dra.host.port import Host

__all__ = ["Concurrently", "Invocation", "claim_results_for", "ipam_codes"]


@dataclass
class Invocation:
    """One plugin invocation: parsed env, parsed config and the raw stdin bytes (what IPAM gets)."""

    env: CniEnv
    conf: NetConf
    raw: bytes
    environ: dict[str, str] = field(default_factory=dict)
    # ADD's effective invocation (cni_dra.attach.plan.effective_invocation): the prepared
    # allocation result whose device profile ``conf`` carries (None: none, standalone);
    # Ellipsis: ``conf`` is the runtime's as parsed, no profile looked for yet.
    profile_source: tuple[PreparedClaim, PreparedResult] | None | EllipsisType = ...
    # The machine the verb works on (cni_dra.host.port.Host), handed in by the CNI entry
    # point (cni_dra.cni.run) or a test. None: no verb can run on this invocation.
    port: Host | None = None

    @property
    def host(self) -> Host:
        """The :class:`~cni_dra.host.port.Host` every effect of this invocation goes through.
        Raises RuntimeError when none was handed in (a bug: :func:`cni_dra.cni.run` always does)."""
        if self.port is None:
            raise RuntimeError("no host handed to this invocation")
        return self.port

    @property
    def key(self) -> tuple[str, str, str]:
        """The attachment this invocation is about, as the state keys it: (network name,
        CNI_CONTAINERID, CNI_IFNAME)."""
        return (self.conf.name, self.env.container_id, self.env.ifname)

    @cached_property
    def store(self) -> StateStore:
        return StateStore(self.conf.stateDir, lock_timeout_s=self.conf.lockTimeoutSeconds)

    @cached_property
    def inventory(self) -> ResourceSlice:
        """The node's ResourceSlice (validated). Raises IOFailureError (5), InventoryError (7).

        A YAML inventory's parse is kept in the state directory, when it exists and passes
        the state's checks (:data:`~cni_dra.dra.inventory.INVENTORY_CACHE_FILE`): the next
        process does not import PyYAML to read the same text."""
        from cni_dra.dra.inventory import INVENTORY_CACHE_FILE, load_inventory

        try:
            cache = str(self.store.dir / INVENTORY_CACHE_FILE) if self.store.dir_exists() else None
        except StateError:  # an unsafe state directory: the verb says so when it uses the state
            cache = None
        return load_inventory(self.conf.inventory, parsed_cache=cache)

    @cached_property
    def fractional_capacity_range(self) -> bool:
        """The cluster's ``DRAFractionalCapacityRange`` gate as the agent recorded it in the
        state directory (:mod:`cni_dra.state.cluster_features`); off (Kubernetes 1.37's default)
        when nothing is recorded. Read once, by a standalone allocation only. Raises
        StateError (5) for a record that cannot be read."""
        from cni_dra.state.cluster_features import read_features

        found = read_features(self.store)
        return found is not None and found.fractional_capacity_range

    def with_conf(
        self, conf: NetConf, profile_source: tuple[PreparedClaim, PreparedResult] | None | EllipsisType = ...
    ) -> Invocation:
        """This invocation with ``conf`` as its config (a device profile applied, from the
        result ``profile_source``), sharing its state store and inventory once loaded."""
        other = Invocation(
            env=self.env,
            conf=conf,
            raw=self.raw,
            environ=self.environ,
            profile_source=profile_source,
            port=self.port,
        )
        for name in ("store", "inventory", "fractional_capacity_range"):
            if name in self.__dict__:
                other.__dict__[name] = self.__dict__[name]
        return other


def claim_results_for(
    claims: Sequence[PreparedClaim], driver: str, ifname: str
) -> tuple[PreparedClaim, PreparedResult] | None:
    """Pick the allocation result a pod's attachment ``ifname`` uses (claim mode).

    ``claims``: the pod's prepared ResourceClaims (:meth:`NodeState.prepared
    <cni_dra.state.schema.NodeState.prepared>`). Among the results of ``driver``, the one
    whose ``request`` equals CNI_IFNAME, else the only one. Returns (claim, result) or None
    when the pod has no result from this driver. Raises ClaimError (101) when several
    results match ambiguously (``failed to choose claim result for interface net1: the pod
    has 2 results from driver <driver> (claim <ns>/<name> request 'fast', claim <ns>/<name>
    request 'slow') and none is named 'net1': ...``) (prepare refuses claims that would make an interface so:
    :func:`cni_dra.state.prepared.interface_conflicts` is this rule's counterpart).
    """
    results = [(claim, res) for claim in claims for res in claim.results if res.driver == driver]
    if not results:
        return None
    named = [cr for cr in results if cr[1].request == ifname]
    if len(named) == 1:
        return named[0]
    if len(results) == 1:
        return results[0]
    which = ", ".join(
        f"claim {c.namespace}/{c.name} request {r.request!r}"
        for c, r in sorted(results, key=lambda cr: (cr[0].namespace, cr[0].name, cr[1].request))
    )
    raise ClaimError(
        f"failed to choose claim result for interface {ifname}: the pod has {len(results)} "
        f"results from driver {driver} ({which}) and none is named {ifname!r}: an interface takes the "
        "result whose request is named after it (with Multus: name the requests after the interfaces "
        "the pod's networks annotation asks for)"
    )


@contextmanager
def ipam_codes() -> Iterator[None]:
    """Around an IPAM call: the plugin's catch-all code 999 becomes IpamError's own 103
    (the message keeps the plugin's text), so cni-dra answers 999 only for its own bugs."""
    try:
        yield
    except IpamError as exc:
        if exc.code == 999:
            exc.code = IpamError.code
        raise


class Concurrently:
    """Run ``fn()`` in a thread started now, while the caller does something else.

    The thread starts in the caller's current network namespace (a thread inherits it), so
    start it before entering a pod's netns. :meth:`wait` joins it and returns
    ``(value, None)`` or ``(None, exception)``, :meth:`result` the value or raises; always call one (an IPAM plugin must never
    be left running). Used for the IPAM plugin's ADD, DEL and CHECK, which do not depend
    on the pod's link (except ``dhcp``: the verbs run it in order).
    """

    def __init__(self, fn: Callable[[], Any], name: str = "cni-dra-ipam") -> None:
        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                self._error = exc

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def wait(self) -> tuple[Any, BaseException | None]:
        self._thread.join()
        return self._value, self._error

    def result(self) -> Any:
        """:meth:`wait`, then ``fn``'s value, or its exception raised here."""
        value, error = self.wait()
        if error is not None:
            raise error
        return value
