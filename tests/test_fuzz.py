"""Hostile input: 10,000 examples each for the stdin config, CNI_ARGS and
the CNI_* variables, and the inventory parser. Nothing may escape but a CNI error.

The plugin entry (:func:`cni_dra.cni.run`) is driven in-process. Every generated config that
is a JSON object gets ``stateDir`` and ``inventory`` pointed into a temp dir and CNI_PATH is
an empty directory, so no example touches the node: the run stops at the first error.
The invariant: exit 0, or exit 1 with one JSON error object on stdout whose ``code`` is a
CNI code other than 999 (999 is what the entry point prints for a bug).
"""

from __future__ import annotations

import atexit
import io
import json
import os
import shutil
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_dra.cni import run
from cni_dra.dra.inventory import parse_inventory
from cni_dra.errors import CniError
from cni_dra.protocol.env import parse_cni_args, parse_env
from tests.builders import device, resource_slice

EXAMPLES = int(os.environ.get("CNI_DRA_FUZZ_EXAMPLES", "10000"))  # lower it for a quick local run
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

_TMP = tempfile.mkdtemp(prefix="cni-dra-fuzz-")
atexit.register(shutil.rmtree, _TMP, True)  # the directory goes with the test run
_STATE = os.path.join(_TMP, "state")
_INVENTORY = os.path.join(_TMP, "no-inventory.yaml")
_EMPTY_PATH = os.path.join(_TMP, "bin")
os.makedirs(_EMPTY_PATH, exist_ok=True)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
KEYS = [
    "cniVersion",
    "name",
    "type",
    "driver",
    "linkType",
    "mode",
    "mtu",
    "mac",
    "capacity",
    "selectionPolicy",
    "lockTimeoutSeconds",
    "ipam",
    "dns",
    "capabilities",
    "runtimeConfig",
    "prevResult",
    "args",
    "cni.dev/valid-attachments",
    "stateDir",
    "inventory",
]
BASE = {
    "cniVersion": "1.0.0",
    "name": "net",
    "type": "cni-dra",
    "capacity": {"requests": {"bandwidth": "1G"}},
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.51.100.0/24"}]]},
}


@st.composite
def configs(draw) -> bytes:
    """Raw bytes, arbitrary JSON, or the valid base config with keys replaced by arbitrary values."""
    kind = draw(st.sampled_from(["bytes", "json", "mutated", "mutated", "mutated"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "json":
        obj = draw(json_values)
    else:
        obj = dict(BASE)
        for key in draw(st.lists(st.sampled_from(KEYS) | st.text(max_size=8), max_size=4)):
            obj[key] = draw(
                json_values | st.sampled_from(["1.1.0", "0.4.0", "10G", "-1", "macvlan", "host-local"])
            )
    if isinstance(obj, dict):
        obj["stateDir"], obj["inventory"] = _STATE, _INVENTORY
    return json.dumps(obj).encode()


env_text = st.text(max_size=40).filter(lambda s: "\0" not in s)
cni_args = (
    st.lists(
        st.tuples(
            st.sampled_from(["IgnoreUnknown", "K8S_POD_UID", "K8S_POD_NAME", "MAC", "X"]) | env_text,
            env_text | st.sampled_from(["1", "true", "aa:bb:cc:dd:ee:ff"]),
        ),
        max_size=5,
    ).map(lambda kv: ";".join(f"{k}={v}" for k, v in kv))
    | env_text
)


def _check(code: int, out: str) -> None:
    assert code in (0, 1)
    if code == 1:
        doc = json.loads(out)
        assert isinstance(doc, dict) and isinstance(doc["code"], int) and isinstance(doc["msg"], str)
        assert doc["code"] != 999, doc


@FUZZ
@given(
    command=st.sampled_from(["ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION", "add", ""]),
    stdin=configs(),
    args=cni_args,
    container_id=st.sampled_from(["c1", "abc-1.x_2"]) | env_text,
    ifname=st.sampled_from(["eth0", "net1", "a" * 15]) | env_text,
)
def test_plugin_entry_answers_only_in_cni_errors(command, stdin, args, container_id, ifname):
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container_id,
        "CNI_NETNS": os.path.join(_TMP, "no-netns"),
        "CNI_IFNAME": ifname,
        "CNI_PATH": _EMPTY_PATH,
        "CNI_ARGS": args,
    }
    out = io.StringIO()
    code = run(env, stdin, out)
    _check(code, out.getvalue())


@FUZZ
@given(args=cni_args, container_id=env_text, ifname=env_text)
def test_env_and_cni_args_raise_only_cni_errors(args, container_id, ifname):
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": container_id,
        "CNI_NETNS": "/x",
        "CNI_IFNAME": ifname,
        "CNI_PATH": "/x",
        "CNI_ARGS": args,
    }
    for call in (lambda: parse_cni_args(args), lambda: parse_env(env)):
        try:
            call()
        except CniError as exc:
            assert exc.code in (2, 4), exc


def test_container_id_and_ifname_rules_hold():
    """The spec's rules, spelled out (CNI spec 1.1.0 "Parameters")."""
    base = {"CNI_COMMAND": "ADD", "CNI_NETNS": "/x", "CNI_PATH": "/x"}
    for cid, ifname in [
        ("-lead", "eth0"),
        ("c1", "a" * 16),
        ("c1", "."),
        ("c1", ".."),
        ("c1", "a/b"),
        ("c1", "a:b"),
        ("c1", "a b"),
        ("c 1", "eth0"),
        ("c1", ""),
    ]:
        try:
            parse_env(base | {"CNI_CONTAINERID": cid, "CNI_IFNAME": ifname})
        except CniError as exc:
            assert exc.code == 4
        else:
            raise AssertionError(f"accepted {cid!r} {ifname!r}")
    assert parse_env(base | {"CNI_CONTAINERID": "a1_b.c-d", "CNI_IFNAME": "a" * 15}).ifname == "a" * 15


SLICE = resource_slice(
    [device("nic-a", "eth1", request_policy={"default": "1G", "validRange": {"min": "100M", "step": "100M"}})]
)


@st.composite
def inventories(draw) -> str:
    kind = draw(st.sampled_from(["text", "mutated-json", "mutated-json", "mutated-yaml"]))
    if kind == "text":
        return draw(st.text(max_size=200))
    doc = json.loads(json.dumps(SLICE))
    dev = doc["spec"]["devices"][0]
    targets = [
        (doc, "kind"),
        (doc["spec"], "driver"),
        (doc["spec"], "pool"),
        (doc["spec"], "devices"),
        (dev, "name"),
        (dev, "allowMultipleAllocations"),
        (dev, "attributes"),
        (dev, "capacity"),
        (dev["capacity"]["bandwidth"], "value"),
        (dev["capacity"]["bandwidth"], "requestPolicy"),
        (dev["capacity"]["bandwidth"]["requestPolicy"], "validRange"),
        (dev["capacity"]["bandwidth"]["requestPolicy"], "default"),
    ]
    for i in draw(st.lists(st.integers(0, len(targets) - 1), min_size=1, max_size=3)):
        parent, key = targets[i]
        parent[key] = draw(json_values | st.sampled_from(["1G", "0", "-5G", "1e3", "", "10Gi", "nic-a"]))
    if kind == "mutated-json":
        return json.dumps(doc)
    import yaml

    return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))


@FUZZ
@given(inventories())
def test_inventory_parser_raises_only_cni_errors(text):
    try:
        parse_inventory(text, "fuzz.yaml")
    except CniError as exc:
        assert exc.code == 7, exc


def test_oversize_stdin_is_refused_without_reading_it_all():
    """A process given 64 MiB on stdin answers code 6 after reading just over 1 MiB."""
    import subprocess
    import sys

    from cni_dra.fastpath.wire import STDIN_LIMIT_BYTES
    from cni_dra.protocol.config import MAX_CONFIG_BYTES

    assert STDIN_LIMIT_BYTES == MAX_CONFIG_BYTES + 1  # cni_dra.main.read_stdin reads at most this
    entry = "from cni_dra.main import main"  # what the executable runs (agent off: in-process)
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/nonexistent",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/nonexistent",
        "PATH": "/usr/bin:/bin",
        "CNI_DRA_AGENT": "off",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import sys; {entry}; sys.exit(main())"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    import contextlib

    chunk = b" " * (1 << 20)
    stopped_reading = False
    try:
        for _ in range(64):
            proc.stdin.write(chunk)
    except BrokenPipeError:
        stopped_reading = True  # the plugin stopped after 1 MiB + 1 and exited
    finally:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
    out = proc.stdout.read()
    proc.stdout.close()
    assert proc.wait(30) == 1
    doc = json.loads(out)
    assert doc["code"] == 6 and "larger than" in doc["msg"]
    assert stopped_reading


def test_no_shell_is_ever_invoked():
    """No module runs a shell: no shell=True, os.system, os.popen, or /bin/sh in an argv."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent / "cni_dra"
    bad = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    if kw.arg == "shell" and not (
                        isinstance(kw.value, ast.Constant) and kw.value.value is False
                    ):
                        bad.append(f"{path}:{node.lineno} shell=")
                fn = node.func
                if (
                    isinstance(fn, ast.Attribute)
                    and isinstance(fn.value, ast.Name)
                    and fn.value.id == "os"
                    and fn.attr in ("system", "popen", "execl", "execlp", "spawnl", "spawnlp")
                ):
                    bad.append(f"{path}:{node.lineno} os.{fn.attr}")
            if isinstance(node, ast.Constant) and node.value in ("/bin/sh", "/bin/bash", "sh -c"):
                bad.append(f"{path}:{node.lineno} {node.value}")
    assert bad == []
