"""A local stand-in for the kube-apiserver paths cni-dra uses (no cluster can run here).

Serves over HTTP on 127.0.0.1 (random port):

* ``GET /api/v1/nodes/NAME``
* ``GET|POST /apis/resource.k8s.io/v1/resourceslices`` (list honours ``fieldSelector``
  ``spec.nodeName=..,spec.driver=..``), ``GET|PUT|DELETE .../resourceslices/NAME``
  (PUT checks ``metadata.resourceVersion``: stale → 409)
* ``GET /apis/resource.k8s.io/v1/namespaces/NS/resourceclaims/NAME``
* ``GET /apis/resource.k8s.io/v1/resourceclaims`` (list, and ``watch=true`` from a
  ``resourceVersion``: one JSON event per line, ADDED/MODIFIED of every claim change
  after it, until ``timeoutSeconds``; an injected ``fail("WATCH", ...)`` status is sent as
  the watch's ERROR event, as the API server reports an expired resourceVersion (410))
* ``GET /metrics`` (text): :attr:`FakeApiServer.metrics` when set (only the families named
  by ``name[]`` query parameters, when there are any), else 403 as for a role without
  ``nonResourceURLs /metrics``
* ``PATCH .../resourceclaims/NAME/status`` with ``application/apply-patch+yaml``
  (server-side apply: ``status.devices[]`` merged by (driver, pool, device, shareID), a
  manager's entries missing from its next apply removed;
  ``metadata.uid`` must match, else 409; ``fieldManager`` is required)

Every request body is decoded by the official client's pydantic models (which forbid
unknown fields) and must survive a round trip through them unchanged, so field names and
shapes are checked by the Kubernetes client, not by cni-dra's own code. Bodies that do not
pass are answered 422 and kept in :attr:`FakeApiServer.invalid`; every request is kept in
:attr:`FakeApiServer.requests`. ``fail`` injects HTTP errors for the next matching calls.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["FakeApiServer", "Recorded", "write_kubeconfig", "inventory_doc", "allocated_claim", "DRIVER"]

_V1 = "/apis/resource.k8s.io/v1"


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any


@dataclass
class FakeApiServer:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    invalid: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, why)
    failures: list[list[Any]] = field(default_factory=list)  # [method, path regex, status, count]
    owned: dict[tuple[str, str, str], set[tuple[Any, ...]]] = field(default_factory=dict)  # SSA ownership
    lock: threading.RLock = field(default_factory=threading.RLock)
    events: list[tuple[int, str, dict[str, Any]]] = field(
        default_factory=list
    )  # claim changes (rv, type, obj)
    metrics: str | None = None  # the /metrics text; None: 403
    closing: threading.Event = field(default_factory=threading.Event)
    _rv: itertools.count = field(default_factory=lambda: itertools.count(1))

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> FakeApiServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _do(self) -> None:
                parts = urlsplit(self.path)
                if (
                    self.command == "GET"
                    and parts.path == f"{_V1}/resourceclaims"
                    and parse_qs(parts.query).get("watch") == ["true"]
                ):
                    server.watch(self, parse_qs(parts.query))
                    return
                if self.command == "GET" and parts.path == "/metrics":
                    server.serve_metrics(self, parse_qs(parts.query))
                    return
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, doc = server.handle(
                    self.command, self.path, self.headers.get("Content-Type", ""), raw
                )
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _do

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    # -- test helpers ----------------------------------------------------------------------
    def add_node(self, name: str) -> dict[str, Any]:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": str(next(self._rv))},
        }
        with self.lock:
            self.nodes[name] = node
        return node

    def add_claim(self, claim: dict[str, Any]) -> dict[str, Any]:
        from kubernetes.client.models import ResourceV1ResourceClaim

        claim = copy.deepcopy(claim)
        claim.setdefault("apiVersion", "resource.k8s.io/v1")
        claim.setdefault("kind", "ResourceClaim")
        meta = claim.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        ResourceV1ResourceClaim.model_validate(claim)  # the test's own claim must be valid too
        with self.lock:
            key = (meta["namespace"], meta["name"])
            kind = "MODIFIED" if key in self.claims else "ADDED"
            self.claims[key] = claim
            self._changed(kind, claim)
        return claim

    def _changed(self, kind: str, claim: dict[str, Any]) -> None:
        """A new resourceVersion for ``claim`` and its watch event (under the lock)."""
        rv = next(self._rv)
        claim["metadata"]["resourceVersion"] = str(rv)
        self.events.append((rv, kind, copy.deepcopy(claim)))

    def watch(self, handler: BaseHTTPRequestHandler, query: dict[str, list[str]]) -> None:
        """Stream claim events after ``resourceVersion`` until ``timeoutSeconds`` (or close)."""
        import time

        rv = int((query.get("resourceVersion") or ["0"])[0] or 0)
        timeout_s = float((query.get("timeoutSeconds") or ["30"])[0])
        path = f"{_V1}/resourceclaims"
        with self.lock:
            self.requests.append(Recorded("WATCH", path, query, "", None))
            failed = None
            for f in self.failures:
                if f[3] > 0 and f[0] == "WATCH" and re.fullmatch(f[1], path):
                    f[3] -= 1
                    failed = f[2]
                    break
        # as the API server does: HTTP/1.1, one chunk per event (a client reads each at once)
        handler.protocol_version = "HTTP/1.1"
        handler.close_connection = True
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("Connection", "close")
        handler.end_headers()

        def send(data: bytes) -> None:
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            handler.wfile.flush()

        try:
            if failed is not None:
                send(
                    json.dumps(
                        {"type": "ERROR", "object": _status(failed, "too old resource version")}
                    ).encode()
                    + b"\n"
                )
            else:
                end = time.monotonic() + timeout_s
                while time.monotonic() < end and not self.closing.is_set():
                    with self.lock:
                        new = [e for e in self.events if e[0] > rv]
                    for r, kind, obj in new:
                        send(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                        rv = r
                    time.sleep(0.02)
            send(b"")
        except OSError:  # the client went away
            pass

    def serve_metrics(self, handler: BaseHTTPRequestHandler, query: dict[str, list[str]]) -> None:
        with self.lock:
            self.requests.append(Recorded("GET", "/metrics", query, "", None))
            text = self.metrics
        status, ctype = (200, "text/plain; version=0.0.4") if text is not None else (403, "application/json")
        if text is None:
            data = json.dumps(_status(403, 'forbidden: User cannot get path "/metrics"')).encode()
        else:
            names = set(query.get("name[]") or [])
            lines = [
                ln
                for ln in text.splitlines(keepends=True)
                if not names
                or (
                    ln.split()[2]
                    if ln.startswith("#") and len(ln.split()) > 2
                    else ln.split("{")[0].split()[0]
                )
                in names
            ]
            data = "".join(lines).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def fail(self, method: str, path_regex: str, status: int, count: int = 1) -> None:
        """Answer the next ``count`` requests matching (method, path regex) with ``status``."""
        with self.lock:
            self.failures.append([method, path_regex, status, count])

    def requests_for(self, method: str, path_regex: str) -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.method == method and re.fullmatch(path_regex, r.path)]

    # -- the API ---------------------------------------------------------------------------
    def handle(self, method: str, target: str, content_type: str, raw: bytes) -> tuple[int, Any]:
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query)
        body = json.loads(raw) if raw else None
        with self.lock:
            self.requests.append(Recorded(method, path, query, content_type, copy.deepcopy(body)))
            for f in self.failures:
                if f[3] > 0 and f[0] == method and re.fullmatch(f[1], path):
                    f[3] -= 1
                    return f[2], _status(f[2], "injected failure")
            try:
                return self._route(method, path, query, content_type, body)
            except _Invalid as exc:
                self.invalid.append((method, path, str(exc)))
                return 422, _status(422, str(exc))

    def _route(
        self, method: str, path: str, query: dict[str, list[str]], ctype: str, body: Any
    ) -> tuple[int, Any]:
        if path == f"{_V1}/resourceclaims" and method == "GET":
            return 200, {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimList",
                "metadata": {"resourceVersion": str(next(self._rv))},
                "items": list(self.claims.values()),
            }
        if m := re.fullmatch(r"/api/v1/nodes/([^/]+)", path):
            node = self.nodes.get(m[1])
            return (200, node) if node and method == "GET" else (404, _status(404, "node not found"))
        if path == f"{_V1}/resourceslices":
            if method == "GET":
                items = list(self.slices.values())
                for sel in (query.get("fieldSelector") or [""])[0].split(","):
                    if sel:
                        k, _, v = sel.partition("=")
                        key = {"spec.nodeName": "nodeName", "spec.driver": "driver"}[k]
                        items = [s for s in items if s["spec"].get(key) == v]
                return 200, {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSliceList",
                    "metadata": {"resourceVersion": str(next(self._rv))},
                    "items": items,
                }
            if method == "POST":
                _validate_slice(body)
                name = body["metadata"]["name"]
                if name in self.slices:
                    return 409, _status(409, f"resourceslices {name} already exists")
                obj = copy.deepcopy(body)
                obj["metadata"].update(
                    uid=str(uuid.uuid4()), resourceVersion=str(next(self._rv)), generation=1
                )
                self.slices[name] = obj
                return 201, obj
        if m := re.fullmatch(rf"{_V1}/resourceslices/([^/]+)", path):
            name, cur = m[1], self.slices.get(m[1])
            if cur is None:
                return 404, _status(404, f"resourceslices {name} not found")
            if method == "GET":
                return 200, cur
            if method == "DELETE":
                return 200, self.slices.pop(name)
            if method == "PUT":
                _validate_slice(body)
                if body["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
                    return 409, _status(409, "the object has been modified")
                obj = copy.deepcopy(body)
                obj["metadata"].update(
                    uid=cur["metadata"]["uid"],
                    resourceVersion=str(next(self._rv)),
                    generation=cur["metadata"].get("generation", 1) + 1,
                )
                self.slices[name] = obj
                return 200, obj
        if m := re.fullmatch(rf"{_V1}/namespaces/([^/]+)/resourceclaims/([^/]+)(/status)?", path):
            key, cur = (m[1], m[2]), self.claims.get((m[1], m[2]))
            if cur is None:
                return 404, _status(404, f"resourceclaims {m[2]} not found")
            if method == "GET" and not m[3]:
                return 200, cur
            if method == "PATCH" and m[3]:
                if ctype != "application/apply-patch+yaml":
                    raise _Invalid(f"status patch must be a server-side apply, got {ctype!r}")
                if not query.get("fieldManager"):
                    raise _Invalid("server-side apply needs fieldManager")
                _validate_claim_apply(body)
                uid = body["metadata"].get("uid")
                if uid and uid != cur["metadata"]["uid"]:
                    return 409, _status(409, "Precondition failed: UID in precondition does not match")
                # status.devices is a list-map keyed by (driver, pool, device, shareID): the
                # manager's entries are replaced, and entries it applied before but left out
                # now are removed (server-side apply ownership, simplified to whole entries).
                devices = cur.setdefault("status", {}).setdefault("devices", [])
                manager = query["fieldManager"][0]
                applied = {_key(e): e for e in body["status"].get("devices") or []}
                before = self.owned.get((m[1], m[2], manager), set())
                devices[:] = [d for d in devices if _key(d) not in applied and _key(d) not in before]
                devices.extend(copy.deepcopy(e) for e in applied.values())
                self.owned[(m[1], m[2], manager)] = set(applied)
                self._changed("MODIFIED", cur)
                return 200, cur
        return 404, _status(404, f"no route for {method} {path}")


def _key(entry: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(entry.get(x) for x in ("driver", "pool", "device", "shareID"))


class _Invalid(Exception):
    pass


def _status(code: int, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "code": code}


def _round_trip(model: Any, body: dict[str, Any], what: str) -> None:
    from kubernetes.client import ApiClient
    from pydantic import ValidationError

    try:
        obj = model.model_validate(body)
    except ValidationError as exc:
        raise _Invalid(f"{what} does not decode with {model.__name__}: {exc}") from exc
    back = ApiClient().sanitize_for_serialization(obj)
    if _times(back) != _times(body):
        raise _Invalid(f"{what} changes in a round trip through {model.__name__}: {body} != {back}")


_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")


def _times(doc: Any) -> Any:
    """``doc`` with RFC 3339 timestamps in one spelling (the models print +00:00 for Z)."""
    import datetime

    if isinstance(doc, dict):
        return {k: _times(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_times(v) for v in doc]
    if isinstance(doc, str) and _TIME.fullmatch(doc):
        return datetime.datetime.fromisoformat(doc.replace("Z", "+00:00")).isoformat()
    return doc


def _validate_slice(body: Any) -> None:
    from kubernetes.client.models import V1ResourceSlice

    if not isinstance(body, dict):
        raise _Invalid("body is not an object")
    _round_trip(V1ResourceSlice, body, "ResourceSlice")
    if body.get("apiVersion") != "resource.k8s.io/v1" or body.get("kind") != "ResourceSlice":
        raise _Invalid(f"wrong apiVersion/kind {body.get('apiVersion')}/{body.get('kind')}")


def _validate_claim_apply(body: Any) -> None:
    from kubernetes.client.models import V1ObjectMeta, V1ResourceClaimStatus

    if not isinstance(body, dict) or set(body) - {"apiVersion", "kind", "metadata", "status"}:
        raise _Invalid(f"apply body has fields other than apiVersion/kind/metadata/status: {body}")
    if body.get("apiVersion") != "resource.k8s.io/v1" or body.get("kind") != "ResourceClaim":
        raise _Invalid(f"wrong apiVersion/kind {body.get('apiVersion')}/{body.get('kind')}")
    _round_trip(V1ObjectMeta, body.get("metadata") or {}, "metadata")
    _round_trip(V1ResourceClaimStatus, body.get("status") or {}, "ResourceClaim status")


def write_kubeconfig(path: str, url: str) -> str:
    """A kubeconfig file pointing at ``url`` with a dummy bearer token; returns ``path``."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": "test-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    return path


DRIVER = "net.cni-dra.dev"


def inventory_doc(
    node: str, nics: dict[str, str], *, driver: str = DRIVER, bandwidth: str = "10G"
) -> dict[str, Any]:
    """An inventory (ResourceSlice dict) with one shared device per ``{device: ifName}``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-inventory"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": dev,
                    "allowMultipleAllocations": True,
                    "attributes": {"ifName": {"string": ifname}},
                    "capacity": {
                        "bandwidth": {
                            "value": bandwidth,
                            "requestPolicy": {"default": "1G", "validRange": {"min": "100M", "step": "100M"}},
                        }
                    },
                }
                for dev, ifname in nics.items()
            ],
        },
    }


def allocated_claim(
    name: str,
    *,
    namespace: str = "default",
    pool: str,
    device: str,
    bandwidth: str,
    share_id: str,
    pod_uids: list[str],
    request: str = "net1",
    driver: str = DRIVER,
) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaim as the scheduler leaves it: allocated on
    ``pool/device`` with consumedCapacity bandwidth and a shareID, reserved for the pods."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": request,
                        "exactly": {
                            "deviceClassName": "cni-dra-shared-nic",
                            "capacity": {"requests": {"bandwidth": bandwidth}},
                        },
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": request,
                            "driver": driver,
                            "pool": pool,
                            "device": device,
                            "consumedCapacity": {"bandwidth": bandwidth},
                            "shareID": share_id,
                        }
                    ]
                }
            },
            "reservedFor": [
                {"resource": "pods", "name": f"pod-{i}", "uid": uid} for i, uid in enumerate(pod_uids)
            ],
        },
    }
