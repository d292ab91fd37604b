"""The node's NIC inventory: one resource.k8s.io/v1 ResourceSlice in a YAML or JSON file.

:func:`load_inventory` reads and validates it; :func:`validate_slice` applies the
rules the API server applies to a ResourceSlice (k8s.io/kubernetes
pkg/apis/resource/validation, KEP-5075 for capacities) plus, unless
``plugin_rules=False``, cni-dra's own: every device names its host interface in the
``ifName`` attribute, once per node (``cni-dra allocate`` checks slices of any driver
with the API server's rules only).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from cni_dra.dra.objects import API_VERSION, Device, DeviceCapacity, ResourceSlice, device_attribute, to_api
from cni_dra.errors import InventoryError, IOFailureError

__all__ = [
    "IFNAME_ATTRIBUTE",
    "INVENTORY_CACHE_FILE",
    "load_inventory",
    "parse_inventory",
    "read_parsed_cache",
    "write_parsed_cache",
    "validate_slice",
    "slice_to_dict",
    "device_problems",
]

#: The attribute holding a device's host interface name (short or ``<driver>/ifName``).
IFNAME_ATTRIBUTE = "ifName"

#: The name of the parsed-YAML cache in the state directory (``parsed_cache`` of :func:`load_inventory`).
INVENTORY_CACHE_FILE = "inventory-parsed.json"

_MAX_ATTRIBUTES_AND_CAPACITIES = 32
_MAX_DEVICES = 128
_MAX_DOMAIN_LENGTH = 63
_MAX_ID_LENGTH = 32
_MAX_ATTRIBUTE_VALUE_LENGTH = 64
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?",
    re.ASCII,
)
# DNS-1123 label (device and pool names), C identifier (qualified name identifier),
# DNS-1123 subdomain (qualified name domain, driver).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)


def load_inventory(path: str, *, plugin_rules: bool = True, parsed_cache: str | None = None) -> ResourceSlice:
    """Read, parse and validate the ResourceSlice at ``path`` (JSON, or YAML otherwise).

    JSON is recognised by a ``.json`` suffix or a leading ``{``; anything else is
    parsed as YAML (PyYAML is imported only then). ``plugin_rules``: as for
    :func:`validate_slice`.

    ``parsed_cache``: a file (in a private directory: the state directory) keeping what a
    YAML inventory parsed to, as JSON (:func:`read_parsed_cache`, :func:`write_parsed_cache`).
    A new process reads it instead of importing PyYAML (≈ 8% of the instructions of an
    in-process ADD) when it was made from the same text (its SHA-256); it is written after a
    YAML parse whose result JSON holds exactly. The result is validated as it would be
    after a parse, so the cache only ever skips PyYAML.

    A long-lived process (the agent's fast path) reads the same file on every ADD,
    so the validated slice is kept per process, keyed by ``path``, ``plugin_rules``
    and the file's identity and version as ``fstat(2)`` of the opened file reports
    them (device, inode, size, mtime and ctime in ns): a file that was rewritten
    (in place or replaced by a rename) is read again. A slice is cached only when
    the file did not change while it was read; failures are never cached. The
    slice is a frozen model, shared by callers.

    Raises :class:`~cni_dra.errors.IOFailureError` (code 5) when the file cannot be
    read, :class:`~cni_dra.errors.InventoryError` (code 7) when it is not a valid
    ResourceSlice; the message names the device and the field.
    """
    try:
        with open(path, "rb") as fh:
            before = _file_version(os.fstat(fh.fileno()))
            cached = _CACHE.get((path, plugin_rules))
            if cached is not None and cached[0] == before:
                return cached[1]
            raw = fh.read()
            after = _file_version(os.fstat(fh.fileno()))
    except OSError as exc:
        raise IOFailureError(f"failed to read inventory {path}: {exc.strerror or exc}", str(exc)) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InventoryError(f"failed to load inventory {path}: not UTF-8 text", str(exc)) from exc
    slice_ = parse_inventory(text, source=path, plugin_rules=plugin_rules, parsed_cache=parsed_cache)
    if before == after:
        if len(_CACHE) >= _CACHE_ENTRIES:
            _CACHE.clear()
        _CACHE[(path, plugin_rules)] = (before, slice_)
    return slice_


_CACHE_ENTRIES = 16
_CACHE: dict[tuple[str, bool], tuple[tuple[int, ...], ResourceSlice]] = {}


def _file_version(st: os.stat_result) -> tuple[int, ...]:
    """What changes when a file is replaced or rewritten: (dev, inode, size, mtime ns, ctime ns)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def parse_inventory(
    text: str, source: str = "<inventory>", *, plugin_rules: bool = True, parsed_cache: str | None = None
) -> ResourceSlice:
    """Parse and validate a ResourceSlice from JSON or YAML ``text``.

    ``apiVersion`` must be ``resource.k8s.io/v1`` (absent counts as that); another version is
    refused, not converted. ``plugin_rules``: as for :func:`validate_slice`;
    ``parsed_cache``: as for :func:`load_inventory` (YAML only).

    Raises :class:`~cni_dra.errors.InventoryError` (code 7).
    """
    data: Any
    if source.endswith(".json") or text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InventoryError(f"failed to load inventory {source}: invalid JSON: {exc}", str(exc)) from exc
    else:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest() if parsed_cache else ""
        data = read_parsed_cache(parsed_cache, digest) if parsed_cache else _NOT_CACHED
        if data is _NOT_CACHED:
            import yaml  # lazy: only YAML inventories pay for it

            try:
                data = yaml.load(
                    text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
                )  # libyaml: ~10x less CPU
            except yaml.YAMLError as exc:
                raise InventoryError(
                    f"failed to load inventory {source}: invalid YAML: {exc}", str(exc)
                ) from exc
            if parsed_cache:
                write_parsed_cache(parsed_cache, digest, data)
    if not isinstance(data, dict):
        raise InventoryError(f"failed to load inventory {source}: expected a ResourceSlice object")
    kind = data.get("kind", "ResourceSlice")
    if kind != "ResourceSlice":
        raise InventoryError(f"failed to load inventory {source}: kind is {kind!r}, expected 'ResourceSlice'")
    api_version = data.get("apiVersion", API_VERSION)
    if api_version != API_VERSION:
        # v1beta1 keeps attributes and capacity under devices[].basic: read as v1, its devices
        # would have neither. Other versions are not converted either: only v1 is read.
        raise InventoryError(
            f"failed to load inventory {source}: apiVersion is {api_version!r}, expected {API_VERSION!r}",
            "write the ResourceSlice in resource.k8s.io/v1 (`cni-dra inventory discover` does)",
        )
    try:
        slice_ = ResourceSlice.model_validate(data)
    except ValidationError as exc:
        raise InventoryError(
            f"failed to load inventory {source}: {_describe_validation_error(exc, data)}", str(exc)
        ) from exc
    try:
        validate_slice(slice_, plugin_rules=plugin_rules)
    except InventoryError as exc:
        raise InventoryError(f"failed to load inventory {source}: {exc.msg}", exc.details) from exc
    return slice_


_NOT_CACHED: Any = object()


def read_parsed_cache(path: str, digest: str) -> Any:
    """What the YAML text whose SHA-256 is ``digest`` parsed to, as :func:`write_parsed_cache`
    kept it in ``path``; ``_NOT_CACHED`` when the file is missing, unreadable, not such a
    record, or made from another text (never an error: the text is parsed then)."""
    try:
        # As the state's own files: a symlink there is refused, never followed; and only a
        # regular file is read (a FIFO would block, a device never end).
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return _NOT_CACHED
            doc = json.loads(fh.read())
    except (OSError, ValueError):
        return _NOT_CACHED
    if not isinstance(doc, dict) or doc.get("sha256") != digest or "data" not in doc:
        return _NOT_CACHED
    return doc["data"]


def write_parsed_cache(path: str, digest: str, data: Any) -> None:
    """Keep ``data``, what the YAML text whose SHA-256 is ``digest`` parsed to, in ``path``
    (0600, a temporary file renamed over it) when JSON holds it exactly (not a YAML
    timestamp, binary, set or non-string key), in the parse's own key order (the order of a
    device's attributes and capacities is the document's). Best effort: a failure leaves no file
    behind and is not an error (the next process parses the text again); what a write killed
    before its rename leaves, the next write removes (:func:`_remove_leftovers`)."""
    try:
        encoded = json.dumps({"sha256": digest, "data": data}, allow_nan=False)
    except (TypeError, ValueError):
        return
    if json.loads(encoded)["data"] != data:  # e.g. a key that is not a string
        return
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(encoded.encode())
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return
    _remove_leftovers(path)


#: A temporary cache file older than this is a leftover: no write takes that long.
_LEFTOVER_AGE_S = 60.0


def _remove_leftovers(path: str) -> None:
    """Remove the temporary files of :func:`write_parsed_cache` calls that were killed between
    creating and renaming them (``<path>.<pid>.<thread>.tmp``) once they are older than
    :data:`_LEFTOVER_AGE_S`, by age and not by whether their process lives: the agent and the
    plugin's in-process runs may see different PID namespaces. A live write whose file is
    taken loses only its rename (the cache is best effort)."""
    directory, name = os.path.split(path)
    prefix, now = name + ".", time.time()
    with contextlib.suppress(OSError), os.scandir(directory or ".") as entries:
        for entry in entries:
            if entry.name.startswith(prefix) and entry.name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    if now - entry.stat(follow_symlinks=False).st_mtime > _LEFTOVER_AGE_S:
                        os.unlink(entry.path)


def _describe_validation_error(exc: ValidationError, data: dict[str, Any]) -> str:
    """'device eth-a: capacity.bandwidth.value: invalid quantity ...' for the first error."""
    err = exc.errors(include_url=False)[0]
    loc = list(err["loc"])
    where = ".".join(str(p) for p in loc)
    if len(loc) >= 3 and loc[0] == "spec" and loc[1] == "devices" and isinstance(loc[2], int):
        devices = data.get("spec", {}).get("devices", [])
        name: Any = None
        if loc[2] < len(devices) and isinstance(devices[loc[2]], dict):
            name = devices[loc[2]].get("name")
        field = ".".join(str(p) for p in loc[3:]) or "(device)"
        who = f"device {name}" if name else f"device #{loc[2]}"
        return f"{who}: {field}: {_clean(err['msg'])}"
    return f"{where}: {_clean(err['msg'])}"


def _clean(msg: str) -> str:
    return msg.removeprefix("Value error, ")


def slice_to_dict(slice_: ResourceSlice) -> dict[str, Any]:
    """API-shaped JSON dict of ``slice_`` (camelCase, no nulls, canonical quantities)."""
    return to_api(slice_)


def validate_slice(slice_: ResourceSlice, *, plugin_rules: bool = True) -> None:
    """Apply the inventory rules; raise :class:`~cni_dra.errors.InventoryError` (code 7).

    ``plugin_rules`` (default True): also apply cni-dra's plugin rule (every device has
    a non-empty string ``ifName`` attribute, unique on the node), as the plugin and
    ``cni-dra status`` need; False applies only the API server's rules, so a slice of
    another driver validates (``cni-dra allocate``).

    The message lists every problem found, each naming device, field and rule.
    """
    problems = list(_slice_problems(slice_, plugin_rules))
    if problems:
        raise InventoryError("invalid ResourceSlice: " + "; ".join(problems))


def _slice_problems(slice_: ResourceSlice, plugin_rules: bool) -> Iterable[str]:
    spec = slice_.spec
    driver = spec.driver
    if len(driver) > 63 or not _DNS_SUBDOMAIN.fullmatch(driver):
        yield f"spec.driver: {driver!r} must be a DNS subdomain of at most 63 characters"
    pool = spec.pool
    if (
        not pool.name
        or len(pool.name) > 253
        or not all(_DNS_SUBDOMAIN.fullmatch(p) for p in pool.name.split("/"))
    ):
        yield f"spec.pool.name: {pool.name!r} must be '/'-separated DNS subdomains, at most 253 characters"
    if pool.resource_slice_count <= 0:
        yield "spec.pool.resourceSliceCount: must be greater than zero"
    if pool.generation < 0:
        yield "spec.pool.generation: must be greater than or equal to zero"
    if spec.node_name is not None and not spec.node_name:
        yield "spec.nodeName: must be either unset or a non-empty string"
    if len(spec.devices) > _MAX_DEVICES:
        yield f"spec.devices: {len(spec.devices)} devices, at most {_MAX_DEVICES} allowed"
    seen_names: set[str] = set()
    seen_ifnames: dict[str, str] = {}
    for device in spec.devices:
        if device.name in seen_names:
            yield f"device {device.name}: name: duplicate device name"
        seen_names.add(device.name)
        yield from (f"device {device.name}: {p}" for p in device_problems(device, driver))
        if not plugin_rules:
            continue
        ifname = device_attribute(device, IFNAME_ATTRIBUTE, driver)
        if ifname is None:
            yield f"device {device.name}: attributes.{IFNAME_ATTRIBUTE}: required attribute missing"
        elif not isinstance(ifname, str) or not ifname:
            yield f"device {device.name}: attributes.{IFNAME_ATTRIBUTE}: must be a non-empty string"
        elif ifname in seen_ifnames:
            yield (
                f"device {device.name}: attributes.{IFNAME_ATTRIBUTE}: interface {ifname} "
                f"already used by device {seen_ifnames[ifname]}"
            )
        else:
            seen_ifnames[ifname] = device.name


def _qualified_name_problem(name: str) -> str | None:
    if len(name) > _MAX_DOMAIN_LENGTH + 1 + _MAX_ID_LENGTH:
        return f"name longer than {_MAX_DOMAIN_LENGTH + 1 + _MAX_ID_LENGTH} characters"
    domain, sep, ident = name.rpartition("/")
    if sep:
        if not domain:
            return "the domain must not be empty"
        if "/" in domain or len(domain) > _MAX_DOMAIN_LENGTH or not _DNS_SUBDOMAIN.fullmatch(domain):
            return f"domain {domain!r} must be a DNS subdomain of at most {_MAX_DOMAIN_LENGTH} characters"
    if not ident:
        return "the name must not be empty"
    if len(ident) > _MAX_ID_LENGTH or not _C_IDENTIFIER.fullmatch(ident):
        return f"{ident!r} must be a C identifier of at most {_MAX_ID_LENGTH} characters"
    return None


def device_problems(device: Device, driver: str) -> list[str]:
    """The API-server rules one device breaks, each as ``"<field>: <rule>"``.

    Rules (k8s.io/kubernetes pkg/apis/resource/validation, resource.k8s.io/v1):
    device name a DNS label; at most 32 attributes and capacities together;
    attribute and capacity names qualified names (``[<DNS subdomain>/]<C identifier>``,
    identifier ≤ 32, domain ≤ 63 characters); string and version values ≤ 64
    characters, versions semver 2.0.0; capacity values non-negative; and the
    KEP-5075 requestPolicy rules of :func:`_capacity_problems`.
    """
    problems: list[str] = []
    if len(device.name) > 63 or not _DNS_LABEL.fullmatch(device.name):
        problems.append(f"name: {device.name!r} must be a DNS label (lowercase alphanumerics and '-', ≤ 63)")
    total = len(device.attributes) + len(device.capacity)
    if total > _MAX_ATTRIBUTES_AND_CAPACITIES:
        problems.append(
            f"attributes+capacity: {total} entries, at most {_MAX_ATTRIBUTES_AND_CAPACITIES} allowed"
        )
    for name, attr in device.attributes.items():
        why = _qualified_name_problem(name)
        if why is not None:
            problems.append(f"attributes.{name}: invalid name: {why}")
        for kind, text in (("string", attr.string_value), ("version", attr.version_value)):
            if text is not None and len(text) > _MAX_ATTRIBUTE_VALUE_LENGTH:
                problems.append(
                    f"attributes.{name}.{kind}: longer than {_MAX_ATTRIBUTE_VALUE_LENGTH} characters"
                )
        if attr.version_value is not None and not _SEMVER.fullmatch(attr.version_value):
            problems.append(f"attributes.{name}.version: {attr.version_value!r} is not semver 2.0.0")
    for name, cap in device.capacity.items():
        why = _qualified_name_problem(name)
        if why is not None:
            problems.append(f"capacity.{name}: invalid name: {why}")
        problems.extend(f"capacity.{name}: {p}" for p in _capacity_problems(device, cap))
    return problems


def _capacity_problems(device: Device, cap: DeviceCapacity) -> list[str]:
    """KEP-5075 requestPolicy rules: the API server's (``validateRequestPolicy``, refused when
    it refuses them with its ``DRAFractionalCapacityRange`` gate off and on alike:
    :func:`cni_dra.dra.request_policy.inventory_policy_problems`), and cni-dra's own, which
    the API server does not check: no negative value, default, min or validValues entry, and
    no default above the capacity's value (a request left unnamed could never fit)."""
    from cni_dra.dra.request_policy import inventory_policy_problems

    out: list[str] = []
    value = cap.value
    if value.sign() < 0:
        out.append(f"value: {value} must not be negative")
    policy = cap.request_policy
    if policy is None:
        return out
    if not device.shared:
        out.append("requestPolicy: allowed only when allowMultipleAllocations is true")
    default = policy.default
    if default is not None and default.sign() < 0:
        out.append(f"requestPolicy.default: {default} must not be negative")
    for v in policy.valid_values or []:
        if v.sign() < 0:
            out.append(f"requestPolicy.validValues: {v} must not be negative")
    if policy.valid_range is not None and policy.valid_range.min.sign() < 0:
        out.append(f"requestPolicy.validRange.min: {policy.valid_range.min} must not be negative")
    if default is not None and default > value and not policy.valid_values:
        out.append(f"requestPolicy.default: {default} is larger than the capacity value {value}")
    out.extend(inventory_policy_problems(value, policy))
    return out
