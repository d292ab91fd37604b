"""The kubelet's ``DRAResourceHealth`` service (KEP-4680): device health as a gRPC stream.

The kubelet opens ``NodeWatchResources`` once per registered plugin and keeps it open; each
message is a complete report (every device of the driver), and a device whose last report
is older than its ``health_check_timeout_seconds`` reads as Unknown. The kubelet shows the
health of the devices a container's claims hold in
``pod.status.containerStatuses[].allocatedResourcesStatus`` (``Healthy``, ``Unhealthy``,
``Unknown``, with the message), for containers that name the claim in
``resources.claims``.

:class:`HealthFeed` is the hand-over: the agent publishes the latest complete report
(:meth:`HealthFeed.publish`, from any thread); every open stream sends it when it changes
and sends it again every ``resend_s`` so that the kubelet never times it out. Served in
API ``v1`` and ``v1alpha1`` (same messages, other proto package) by
:func:`resource_health_servicer`, on the DRA socket (:mod:`cni_dra.k8s.kubelet_plugin`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cni_dra.k8s.protos import load

__all__ = ["DeviceHealth", "HealthFeed", "resource_health_servicer"]


@dataclass(frozen=True)
class DeviceHealth:
    """One device's health as reported to the kubelet.

    ``pool`` and ``device``: the names published in the ResourceSlice; ``healthy``: True,
    False, or None (unknown); ``message``: shown in the pod status (the kubelet keeps
    1024 characters); ``updated_s``: Unix seconds when this status was determined.
    """

    pool: str
    device: str
    healthy: bool | None
    message: str
    updated_s: int


class HealthFeed:
    """The latest complete health report and a version that changes with it.

    ``timeout_s``: the ``health_check_timeout_seconds`` each device carries (after that long
    without a report the kubelet shows Unknown); ``resend_s``: how often an open stream
    repeats the report when nothing changed (default a third of ``timeout_s``).
    """

    def __init__(self, *, timeout_s: int = 60, resend_s: float | None = None) -> None:
        if timeout_s < 1:
            raise ValueError(f"health timeout must be at least 1 s, got {timeout_s}")
        self.timeout_s = timeout_s
        self.resend_s = resend_s if resend_s is not None else max(timeout_s / 3, 0.5)
        self._cond = threading.Condition()
        self._version = 0  # 0: nothing published yet
        self._devices: tuple[DeviceHealth, ...] = ()
        self._closed = False

    def publish(self, devices: Sequence[DeviceHealth]) -> bool:
        """Make ``devices`` the current report; True when it differs from the last one
        (then every open stream sends it at once)."""
        new = tuple(devices)
        with self._cond:
            if self._version and new == self._devices:
                return False
            self._devices = new
            self._version += 1
            self._cond.notify_all()
            return True

    def current(self) -> tuple[int, tuple[DeviceHealth, ...]]:
        """(version, devices) of the current report."""
        with self._cond:
            return self._version, self._devices

    def wait(
        self, after: int, timeout_s: float, *, cancelled: Callable[[], bool] = lambda: False
    ) -> tuple[int, tuple[DeviceHealth, ...]] | None:
        """Block until the version differs from ``after`` (a report was published), or
        ``timeout_s`` passed; returns the current (version, devices), or None once the feed
        is closed or ``cancelled()`` is true. A report was published at least once when
        this returns anything but None with a version above 0."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while not self._closed and not cancelled() and self._version == after:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._closed or cancelled():
                return None
            return self._version, self._devices

    def kick(self) -> None:
        """Wake every waiting stream (one of them was cancelled)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """End every open stream (the plugin stops)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def reopen(self) -> None:
        """Serve streams again after :meth:`close` (the plugin starts again)."""
        with self._cond:
            self._closed = False


def _response(pb2: Any, devices: Sequence[DeviceHealth], timeout_s: int) -> Any:
    resp = pb2.NodeWatchResourcesResponse()
    for d in devices:
        health = pb2.UNKNOWN if d.healthy is None else (pb2.HEALTHY if d.healthy else pb2.UNHEALTHY)
        resp.devices.add(
            device=pb2.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
            health=health,
            last_updated_time=int(d.updated_s),
            health_check_timeout_seconds=timeout_s,
            message=d.message[:1024],
        )
    return resp


def resource_health_servicer(proto: str, feed: HealthFeed) -> tuple[Any, Any]:
    """(servicer, add-to-server function) of ``DRAResourceHealth`` for ``proto``
    (``dra_health_v1`` or ``dra_health_v1alpha1``) over ``feed``."""
    pb2, services = load(proto)

    class DRAResourceHealth(services.DRAResourceHealthServicer):  # type: ignore[misc, name-defined]  # generated: no types
        def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802 - gRPC name
            gone = threading.Event()

            def ended() -> None:
                gone.set()
                feed.kick()

            if not context.add_callback(ended):
                return  # the RPC already ended
            sent = 0
            while not gone.is_set():
                got = feed.wait(sent, feed.resend_s if sent else 3600.0, cancelled=gone.is_set)
                if got is None:
                    return
                version, devices = got
                if version == 0:
                    continue  # nothing published yet: the first report opens the stream
                sent = version
                yield _response(pb2, devices, feed.timeout_s)

    return DRAResourceHealth(), services.add_DRAResourceHealthServicer_to_server
