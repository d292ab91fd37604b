"""The DRA kubelet plugin's gRPC side: two unix sockets, as the kubelet expects them.

* ``<plugin_dir>/dra.sock`` (default plugin_dir ``/var/lib/kubelet/plugins/<driver>``):
  the DRA plugin service ``DRAPlugin`` of API ``v1`` and ``v1beta1`` (same handlers), with
  a ``health`` feed the resource health service ``DRAResourceHealth`` of API ``v1`` and
  ``v1alpha1`` (:mod:`cni_dra.k8s.dra_health`), and the gRPC health service
  ``grpc.health.v1.Health``;
* ``<registry_dir>/<driver>-reg.sock`` (default ``/var/lib/kubelet/plugins_registry``):
  plugin registration API v1. ``GetInfo`` answers type ``DRAPlugin``, the driver name, the
  DRA socket path and ``supported_versions`` ``["v1.DRAPlugin", "v1beta1.DRAPlugin"]``, and
  with a health feed also ``"v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"``: the
  list is how a 1.37 kubelet learns which services the plugin offers (it watches resource
  health only when one is listed); ``NotifyRegistrationStatus`` records the kubelet's verdict.

This module is a thin adapter: it decodes requests and encodes responses; the work is a
``driver`` object with ``prepare_claims([(namespace, uid, name), ...]) -> [[device] |
exception]`` (one answer per claim of the call, in order; devices with ``request_names``,
``pool_name``, ``device_name``, ``share_id``, ``cdi_device_ids``: the claims of one call are
one pod's, and the driver judges them together) and ``unprepare(namespace, uid, name)``. A
:class:`~cni_dra.errors.CniError` (or any other exception) for one claim becomes that
claim's ``error`` string, so the kubelet retries only that claim; the RPC itself succeeds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cni_dra.k8s.protos import DRA_SERVICES, RESOURCE_HEALTH_SERVICES, load

if TYPE_CHECKING:
    from cni_dra.k8s.dra_health import HealthFeed

__all__ = ["KubeletPlugin", "DEFAULT_PLUGINS_DIR", "DEFAULT_REGISTRY_DIR", "HEALTH_SERVICES"]

log = logging.getLogger("cni_dra.k8s.kubelet")

DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
# Full gRPC service names served on the DRA socket (health answers SERVING for these and "";
# with a health feed also for RESOURCE_HEALTH_SERVICES, whose proto packages are v1 and v1alpha1).
HEALTH_SERVICES = (
    "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
)


def _error_text(exc: BaseException) -> str:
    from cni_dra.errors import CniError

    if isinstance(exc, CniError):
        return f"{type(exc).__name__} (CNI code {exc.code}): {exc.msg}" + (
            f": {exc.details}" if exc.details else ""
        )
    return f"{type(exc).__name__}: {exc}"


def _dra_servicer(proto: str, driver: Any) -> Any:
    pb2, services = load(proto)

    class DRAPlugin(services.DRAPluginServicer):  # type: ignore[misc, name-defined]  # generated at build time or in memory: no types
        def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
            resp = pb2.NodePrepareResourcesResponse()
            claims = list(request.claims)
            try:
                answers = driver.prepare_claims([(c.namespace, c.uid, c.name) for c in claims])
            except Exception as exc:  # noqa: BLE001 - reported for every claim, kubelet retries
                answers = [exc for _ in claims]
            for claim, answer in zip(claims, answers, strict=True):
                out = resp.claims[claim.uid]
                if isinstance(answer, BaseException):
                    out.error = _error_text(answer)
                    log.warning("prepare %s/%s failed: %s", claim.namespace, claim.name, out.error)
                    continue
                for dev in answer:
                    out.devices.add(
                        request_names=list(dev.request_names),
                        pool_name=dev.pool_name,
                        device_name=dev.device_name,
                        cdi_device_ids=list(dev.cdi_device_ids),
                        share_id=dev.share_id,
                    )
            return resp

        def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
            resp = pb2.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                out = resp.claims[claim.uid]
                try:
                    driver.unprepare(claim.namespace, claim.uid, claim.name)
                except Exception as exc:  # noqa: BLE001
                    out.error = _error_text(exc)
                    log.warning("unprepare %s/%s failed: %s", claim.namespace, claim.name, out.error)
            return resp

    return DRAPlugin(), services.add_DRAPluginServicer_to_server


def _health_servicer(serving: threading.Event, names: tuple[str, ...]) -> Any:
    pb2, services = load("health_v1")
    status_cls = pb2.HealthCheckResponse

    class Health(services.HealthServicer):  # type: ignore[misc, name-defined]  # generated at build time or in memory: no types
        def _status(self, service: str) -> int | None:
            if service not in ("",) + names:
                return None
            status: int = status_cls.SERVING if serving.is_set() else status_cls.NOT_SERVING
            return status

        def Check(self, request: Any, context: Any) -> Any:  # noqa: N802
            import grpc

            st = self._status(request.service)
            if st is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
            return status_cls(status=st)

        def Watch(self, request: Any, context: Any) -> Any:  # noqa: N802
            last = None
            while context.is_active():
                st = self._status(request.service)
                st = status_cls.SERVICE_UNKNOWN if st is None else st
                if st != last:
                    last = st
                    yield status_cls(status=st)
                time.sleep(0.5)

    return Health(), services.add_HealthServicer_to_server


def _registration_servicer(plugin: KubeletPlugin) -> Any:
    pb2, services = load("pluginregistration_v1")

    class Registration(services.RegistrationServicer):  # type: ignore[misc, name-defined]  # generated at build time or in memory: no types
        def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
            return pb2.PluginInfo(
                type="DRAPlugin",
                name=plugin.driver_name,
                endpoint=str(plugin.dra_socket),
                supported_versions=plugin.supported_versions(),
            )

        def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
            plugin.registered = bool(request.plugin_registered)
            plugin.registration_error = request.error
            if request.plugin_registered:
                log.info("kubelet registered the plugin %s", plugin.driver_name)
            else:
                log.error("kubelet refused the plugin %s: %s", plugin.driver_name, request.error)
            return pb2.RegistrationStatusResponse()

    return Registration(), services.add_RegistrationServicer_to_server


class KubeletPlugin:
    """The plugin's gRPC servers. ``start()`` binds both sockets (DRA first, so it is
    ready when the kubelet reads the registration); ``stop()`` closes them and removes
    the socket files. Raises IOFailureError (5) when a socket cannot be bound.
    """

    def __init__(
        self,
        driver_name: str,
        driver: Any,
        *,
        plugin_dir: str | None = None,
        registry_dir: str = DEFAULT_REGISTRY_DIR,
        versions: tuple[str, ...] = ("dra_v1", "dra_v1beta1"),
        health: HealthFeed | None = None,
        max_workers: int = 8,
    ) -> None:
        self.driver_name = driver_name
        self.driver = driver
        self.plugin_dir = Path(plugin_dir or os.path.join(DEFAULT_PLUGINS_DIR, driver_name))
        self.registry_dir = Path(registry_dir)
        self.dra_socket = self.plugin_dir / "dra.sock"
        self.registration_socket = self.registry_dir / f"{driver_name}-reg.sock"
        self.versions = versions
        self.health = health
        self.max_workers = max_workers  # each open health stream holds one
        self.registered: bool | None = None
        self.registration_error = ""
        self.serving = threading.Event()
        self._servers: list[Any] = []

    def _serve(self, path: Path, servicers: list[tuple[Any, Any]]) -> Any:
        import grpc

        from cni_dra.errors import IOFailureError

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_socket() or path.exists():
                path.unlink()  # a stale socket of an earlier run
        except OSError as exc:
            raise IOFailureError(f"failed to prepare socket {path}: {exc}") from exc
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="grpc")
        )
        for servicer, add in servicers:
            add(servicer, server)
        try:
            server.add_insecure_port(f"unix://{path}")
        except RuntimeError as exc:
            raise IOFailureError(f"failed to listen on {path}: {exc}") from exc
        server.start()
        self._servers.append((server, path))
        return server

    def supported_versions(self) -> list[str]:
        """What ``GetInfo`` announces: the DRA services, then the resource health ones."""
        out = [DRA_SERVICES[p] for p in self.versions]
        if self.health is not None:
            out += list(RESOURCE_HEALTH_SERVICES.values())
        return out

    def start(self) -> None:
        """Serve the DRA and health services, then the registration socket."""
        servicers = [_dra_servicer(v, self.driver) for v in self.versions]
        names: tuple[str, ...] = HEALTH_SERVICES
        if self.health is not None:
            from cni_dra.k8s.dra_health import resource_health_servicer

            self.health.reopen()
            servicers += [resource_health_servicer(p, self.health) for p in RESOURCE_HEALTH_SERVICES]
            names += tuple(RESOURCE_HEALTH_SERVICES.values())
        self._serve(self.dra_socket, servicers + [_health_servicer(self.serving, names)])
        self.serving.set()
        self._serve(self.registration_socket, [_registration_servicer(self)])
        log.info(
            "kubelet plugin %s on %s, registration on %s",
            self.driver_name,
            self.dra_socket,
            self.registration_socket,
        )

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving (registration first) and remove the socket files."""
        self.serving.clear()
        if self.health is not None:
            self.health.close()  # open resource health streams end
        for server, path in reversed(self._servers):
            server.stop(grace_s).wait(grace_s + 1)
            try:
                path.unlink()
            except OSError:
                pass
        self._servers.clear()
