"""The API server, through the official ``kubernetes`` client (resource.k8s.io/v1, core/v1).

Only this package imports ``kubernetes``. Objects cross this boundary as plain dicts in
the API's JSON shape (camelCase, as ``kubectl get -o json`` prints them), so the layers
above never see client models. Errors are translated:

* HTTP 404 → ``None`` from getters, ``False`` from deletes;
* HTTP 409 (conflict: stale resourceVersion, UID precondition) → TryAgainLaterError (11);
* any other HTTP error, and connection failures → IOFailureError (5) with the status and
  the server's message in ``details``;
* a kubeconfig / in-cluster config that does not load, or a body the client's models
  refuse (unknown field, wrong type) → InvalidConfigError (7).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal, overload

from cni_dra.errors import InvalidConfigError, IOFailureError, TryAgainLaterError

__all__ = ["KubeApi"]

_TIMEOUT_S = 15.0


class KubeApi:
    """The calls the agent makes. Build with :meth:`from_config`; tests may pass ``host``."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._client = api_client
        self._resource = client.ResourceV1Api(api_client)
        self._core = client.CoreV1Api(api_client)

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, *, host: str | None = None) -> KubeApi:
        """Client from ``kubeconfig`` (a file), else the in-cluster service account config.

        ``host``: a plain URL without credentials (tests). Raises InvalidConfigError (7).
        """
        from kubernetes import client, config

        cfg = client.Configuration()
        try:
            if host is not None:
                cfg.host = host
            elif kubeconfig:
                config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
            else:
                config.load_incluster_config(client_configuration=cfg)
        except (config.ConfigException, OSError, ValueError, TypeError) as exc:
            where = kubeconfig or "the in-cluster service account"
            raise InvalidConfigError(f"failed to load Kubernetes client config from {where}: {exc}") from exc
        cfg.retries = 0  # the agent retries with its own backoff
        return cls(client.ApiClient(cfg))

    def close(self) -> None:
        """Release the HTTP connection pool."""
        self._client.close()

    # -- helpers ---------------------------------------------------------------------------
    @overload
    def _call(
        self,
        what: str,
        fn: Callable[..., object],
        *args: Any,
        missing_ok: Literal[False] = False,
        **kwargs: Any,
    ) -> dict[str, Any]: ...

    @overload
    def _call(
        self, what: str, fn: Callable[..., object], *args: Any, missing_ok: Literal[True], **kwargs: Any
    ) -> dict[str, Any] | None: ...

    def _call(
        self, what: str, fn: Callable[..., object], *args: Any, missing_ok: bool = False, **kwargs: Any
    ) -> dict[str, Any] | None:
        """``fn(*args, **kwargs)``'s object as JSON-ready dicts (None: 404 with ``missing_ok``)."""
        from kubernetes.client.exceptions import ApiException
        from pydantic import ValidationError
        from urllib3.exceptions import HTTPError

        try:
            obj = fn(*args, _request_timeout=_TIMEOUT_S, **kwargs)
        except ValidationError as exc:  # the client's models refuse what we would send
            raise InvalidConfigError(
                f"failed to {what}: the request does not fit the API's schema", str(exc)
            ) from exc
        except ApiException as exc:
            if exc.status == 404 and missing_ok:
                return None
            msg = f"failed to {what}: HTTP {exc.status} {exc.reason or ''}".rstrip()
            if exc.status == 409:
                raise TryAgainLaterError(msg, _message(exc.body)) from exc
            raise IOFailureError(msg, _message(exc.body)) from exc
        except (HTTPError, OSError) as exc:
            raise IOFailureError(f"failed to {what}: {exc}") from exc
        out: dict[str, Any] = self._client.sanitize_for_serialization(obj)
        return out

    # -- the API server's own metrics ------------------------------------------------------
    def get_metrics_text(self, families: tuple[str, ...] = ()) -> str | None:
        """The API server's ``/metrics`` (Prometheus text format), asking for the metric
        ``families`` only (``name[]`` query parameters: an API server built with
        client_golang 1.21 or later, as Kubernetes 1.37 is, sends just those; an older one
        ignores them and sends everything). Needs the ClusterRole rule
        ``nonResourceURLs: ["/metrics"], verbs: ["get"]``.

        None when the server answers 403 (the role lacks that rule) or 404. Raises
        IOFailureError (5) for any other failure.
        """
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        what = "get the API server's /metrics"
        client = self._client
        try:
            method, url, headers, body, post = client.param_serialize(
                method="GET",
                resource_path="/metrics",
                query_params=[("name[]", f) for f in families],
                header_params={"Accept": "text/plain"},
                auth_settings=["BearerToken"],
            )
            resp = client.call_api(
                method, url, header_params=headers, body=body, post_params=post, _request_timeout=_TIMEOUT_S
            )
            resp.read()
            data = client.response_deserialize(resp, {"200": "bytearray"}).data
        except ApiException as exc:
            if exc.status in (403, 404):
                return None
            raise IOFailureError(
                f"failed to {what}: HTTP {exc.status} {exc.reason or ''}".rstrip(), _message(exc.body)
            ) from exc
        except (HTTPError, OSError) as exc:
            raise IOFailureError(f"failed to {what}: {exc}") from exc
        return bytes(data).decode("utf-8", "replace")

    # -- core/v1 ---------------------------------------------------------------------------
    def get_node(self, name: str) -> dict[str, Any] | None:
        """The Node ``name`` (GET /api/v1/nodes/NAME), or None. Raises IOFailureError (5)."""
        return self._call(f"get node {name}", self._core.read_node, name, missing_ok=True)

    # -- resource.k8s.io/v1 ResourceSlices ----------------------------------------------------
    def get_resource_slice(self, name: str) -> dict[str, Any] | None:
        """ResourceSlice ``name`` or None. Raises IOFailureError (5)."""
        return self._call(
            f"get resourceslice {name}", self._resource.read_resource_slice, name, missing_ok=True
        )

    def list_resource_slices(self, *, driver: str, node_name: str) -> list[dict[str, Any]]:
        """The slices of ``driver`` on ``node_name`` (fieldSelector spec.driver, spec.nodeName)."""
        out = self._call(
            f"list resourceslices of {driver} on {node_name}",
            self._resource.list_resource_slice,
            field_selector=f"spec.nodeName={node_name},spec.driver={driver}",
        )
        return list(out.get("items") or [])

    def create_resource_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST a ResourceSlice; returns what the server stored. 409 → TryAgainLaterError (11)."""
        name = body.get("metadata", {}).get("name", "")
        return self._call(f"create resourceslice {name}", self._resource.create_resource_slice, body)

    def replace_resource_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT a ResourceSlice (body carries metadata.resourceVersion; stale → TryAgainLaterError (11))."""
        return self._call(f"update resourceslice {name}", self._resource.replace_resource_slice, name, body)

    def delete_resource_slice(self, name: str) -> bool:
        """DELETE a ResourceSlice; False when it was already gone."""
        out = self._call(
            f"delete resourceslice {name}", self._resource.delete_resource_slice, name, missing_ok=True
        )
        return out is not None

    # -- resource.k8s.io/v1 ResourceClaims ----------------------------------------------------
    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """ResourceClaim ``namespace/name`` or None. Raises IOFailureError (5)."""
        return self._call(
            f"get resourceclaim {namespace}/{name}",
            self._resource.read_namespaced_resource_claim,
            name,
            namespace,
            missing_ok=True,
        )

    def list_resource_claims(self) -> tuple[list[dict[str, Any]], str]:
        """Every ResourceClaim (all namespaces) and the list's resourceVersion, to watch from.
        Raises IOFailureError (5)."""
        out = self._call("list resourceclaims", self._resource.list_resource_claim_for_all_namespaces)
        return list(out.get("items") or []), str((out.get("metadata") or {}).get("resourceVersion") or "")

    def watch_resource_claims(
        self, resource_version: str, *, timeout_s: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """ResourceClaim events of all namespaces after ``resource_version``, as (type, claim)
        with type ADDED, MODIFIED, DELETED or BOOKMARK (only its resourceVersion); the server ends the
        watch after ``timeout_s``. A resourceVersion too old to watch from (HTTP 410 Gone) →
        TryAgainLaterError (11): list again. Other failures → IOFailureError (5)."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        # The item type is named explicitly: the client derives "V1ResourceClaim" from the
        # list's type name, a model it does not have (the objects are not decoded anyway).
        w = watch.Watch(return_type="ResourceV1ResourceClaim")
        events = w.stream(
            self._resource.list_resource_claim_for_all_namespaces,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            allow_watch_bookmarks=True,
            deserialize=False,
            _request_timeout=timeout_s + _TIMEOUT_S,
        )
        try:
            for event in events:
                kind, obj = event.get("type"), event.get("object")
                if kind in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK") and isinstance(obj, dict):
                    yield kind, obj
        except ApiException as exc:
            msg = f"failed to watch resourceclaims: HTTP {exc.status} {exc.reason or ''}".rstrip()
            if exc.status == 410:
                raise TryAgainLaterError(msg) from exc
            raise IOFailureError(msg, _message(exc.body)) from exc
        except (HTTPError, OSError, ValueError) as exc:
            raise IOFailureError(f"failed to watch resourceclaims: {exc}") from exc
        finally:
            w.stop()

    def apply_resource_claim_status(
        self, namespace: str, name: str, body: dict[str, Any], *, field_manager: str
    ) -> dict[str, Any] | None:
        """Server-side apply of ``body`` (apiVersion, kind, metadata, status) to the claim's
        status subresource, as ``field_manager``, forcing ownership of the fields it sets.

        None when the claim is gone (404). A UID in ``body.metadata`` that no longer matches
        → TryAgainLaterError (11) (HTTP 409). Other failures → IOFailureError (5).
        """
        return self._call(
            f"apply status of resourceclaim {namespace}/{name}",
            self._resource.patch_namespaced_resource_claim_status,
            name,
            namespace,
            body,
            field_manager=field_manager,
            force=True,
            _content_type="application/apply-patch+yaml",
            missing_ok=True,
        )


def _message(body: Any) -> str:
    """The ``message`` of a metav1.Status body, else the body text (shortened)."""
    import json

    if not body:
        return ""
    try:
        doc = json.loads(body)
    except (TypeError, ValueError):
        return str(body)[:500]
    return str(doc.get("message", "")) if isinstance(doc, dict) else str(body)[:500]
