"""Tests for cni_dra.ipam: IPAM delegation (CNI spec 1.1.0 "Delegated plugins (IPAM)").

Fake IPAM plugins are small Python scripts written to a tmp dir; their behaviour is
chosen by FAKE_* variables, which also prove that the environment is passed through.
The last tests run Debian's real host-local (no root needed with a tmp dataDir).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from cni_dra.errors import DecodeError, InvalidConfigError, IpamError, TryAgainLaterError
from cni_dra.ipam import (
    find_plugin,
    ipam_add,
    ipam_check,
    ipam_del,
    ipam_exec,
    ipam_gc,
    ipam_status,
    plugin_versions,
)
from cni_dra.protocol.results import IPConfig, Result, Route

FAKE = r"""#!{python}
import json, os, sys, time
cmd = os.environ.get("CNI_COMMAND")
data = sys.stdin.read()
log = os.environ.get("FAKE_LOG")
if log:
    with open(log, "a") as f:
        f.write(json.dumps({{"cmd": cmd, "stdin": data, "env": {{k: v for k, v in os.environ.items() if k.startswith(("CNI_", "FAKE_"))}}}}) + "\n")
mode = os.environ.get("FAKE_MODE", "ok")
versions = os.environ.get("FAKE_VERSIONS", "0.1.0,0.2.0,0.3.0,0.3.1,0.4.0,1.0.0,1.1.0").split(",")
if cmd == "VERSION":
    print(json.dumps({{"cniVersion": "1.0.0", "supportedVersions": versions}}))
    sys.exit(0)
conf = json.loads(data)
if conf.get("cniVersion") not in versions:
    print(json.dumps({{"code": 1, "msg": "incompatible CNI versions", "details": "config is " + str(conf.get("cniVersion"))}}))
    sys.exit(1)
if mode == "fail-json":
    print(json.dumps({{"code": 11, "msg": "no addresses left", "details": "range 10.0.0.0/30 full"}}))
    sys.exit(1)
if mode == "fail-plain":
    sys.stderr.write("panic: something broke\n")
    sys.exit(2)
if mode == "sleep":
    import subprocess
    child = subprocess.Popen(["sleep", "30"])  # a grandchild holding stdout open
    with open(os.environ["FAKE_PIDFILE"], "w") as f:
        f.write(str(child.pid))
    time.sleep(30)
if mode == "garbage" and cmd == "ADD":
    print("this is not json")
    sys.exit(0)
if cmd == "ADD":
    print(os.environ.get("FAKE_RESULT", json.dumps({{"cniVersion": conf["cniVersion"], "ips": [{{"address": "10.0.0.2/24", "gateway": "10.0.0.1"}}]}})))
"""


def write_plugin(
    directory: Path, name: str = "fake-ipam", body: str | None = None, mode: int = 0o755
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(body if body is not None else FAKE.format(python=sys.executable))
    path.chmod(mode)
    return path


def conf(version: str = "1.1.0", **extra: object) -> bytes:
    return json.dumps(
        {"cniVersion": version, "name": "net", "type": "cni-dra", "ipam": {"type": "fake-ipam"}, **extra}
    ).encode()


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    write_plugin(tmp_path / "bin")
    return tmp_path / "bin"


@pytest.fixture
def env(plugin_dir: Path, tmp_path: Path) -> dict[str, str]:
    return {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/var/run/netns/c1",
        "CNI_IFNAME": "net1",
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=p",
        "CNI_PATH": f"/nonexistent:{plugin_dir}",
        "FAKE_LOG": str(tmp_path / "log.jsonl"),
    }


def calls(env: dict[str, str]) -> list[dict[str, object]]:
    path = Path(env["FAKE_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --- find_plugin ---------------------------------------------------------------


def test_find_plugin_first_in_path_order(tmp_path: Path) -> None:
    a = write_plugin(tmp_path / "a", "p", "#!/bin/sh\n")
    write_plugin(tmp_path / "b", "p", "#!/bin/sh\n")
    assert find_plugin("p", [str(tmp_path / "missing"), str(tmp_path / "a"), str(tmp_path / "b")]) == str(a)


def test_find_plugin_skips_non_executable_and_directories(tmp_path: Path) -> None:
    write_plugin(tmp_path / "a", "p", "#!/bin/sh\n", mode=0o644)
    (tmp_path / "b" / "p").mkdir(parents=True)
    c = write_plugin(tmp_path / "c", "p", "#!/bin/sh\n")
    assert find_plugin("p", [str(tmp_path / d) for d in "abc"]) == str(c)


def test_find_plugin_makes_relative_dirs_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_plugin(tmp_path / "rel", "p", "#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    assert find_plugin("p", ["rel"]) == str(tmp_path / "rel" / "p")


@pytest.mark.parametrize("name", ["", ".", "..", "../host-local", "/usr/lib/cni/host-local", "a/b", "a\0b"])
def test_find_plugin_rejects_names_that_are_not_file_names(name: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError) as info:
        find_plugin(name, [str(tmp_path)])
    assert info.value.code == 7


def test_find_plugin_not_found_names_name_and_path(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError) as info:
        find_plugin("nope", ["/d1", "/d2"])
    assert info.value.code == 7
    assert "nope" in info.value.msg and "/d1" in info.value.msg and "/d2" in info.value.msg


# --- ipam_exec -----------------------------------------------------------------


def test_add_passes_env_command_and_whole_config(env: dict[str, str]) -> None:
    netconf = conf(extra_field={"x": [1, 2]}, runtimeConfig={"mac": "02:00:00:00:00:01"})
    obj = ipam_exec("ADD", "fake-ipam", netconf, {**env, "CNI_COMMAND": "DEL"})
    assert obj == {"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1"}]}
    (call,) = calls(env)
    assert call["cmd"] == "ADD"
    assert call["stdin"] == netconf.decode()
    child_env = call["env"]
    assert isinstance(child_env, dict)
    for key in ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH", "FAKE_LOG"):
        assert child_env[key] == env[key]


@pytest.mark.parametrize("command", ["DEL", "CHECK", "STATUS", "GC"])
def test_other_verbs_return_none(command: str, env: dict[str, str]) -> None:
    assert ipam_exec(command, "fake-ipam", conf(), env) is None
    assert [c["cmd"] for c in calls(env)] == [command]


def test_plugin_error_json_keeps_code_msg_details(env: dict[str, str]) -> None:
    with pytest.raises(IpamError) as info:
        ipam_exec("ADD", "fake-ipam", conf(), {**env, "FAKE_MODE": "fail-json"})
    assert info.value.code == 11
    assert info.value.msg == "failed to add IPAM fake-ipam: no addresses left"
    assert info.value.details == "range 10.0.0.0/30 full"


def test_plugin_error_without_json_puts_stderr_in_details(env: dict[str, str]) -> None:
    with pytest.raises(IpamError) as info:
        ipam_exec("DEL", "fake-ipam", conf(), {**env, "FAKE_MODE": "fail-plain"})
    assert info.value.code == 103
    assert info.value.msg.startswith("failed to delete IPAM fake-ipam")
    assert "exit status 2" in info.value.msg
    assert "panic: something broke" in info.value.details


def test_add_with_non_json_output_is_code_6(env: dict[str, str]) -> None:
    with pytest.raises(DecodeError):
        ipam_exec("ADD", "fake-ipam", conf(), {**env, "FAKE_MODE": "garbage"})


@pytest.mark.parametrize("starter", ["posix_spawn", "subprocess"])
def test_timeout_is_try_again_later_and_kills_the_group(
    starter: str, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Either way of starting the plugin (``subprocess``'s own timeout included) ends in
    code 11 and the plugin's process group killed."""
    from cni_dra.ipam import spawn

    if starter == "subprocess":
        monkeypatch.setattr(spawn, "_SPAWN_CHECKED", True)
        monkeypatch.setattr(spawn, "_SPAWN", None)
    pidfile = tmp_path / "grandchild.pid"
    start = time.monotonic()
    with pytest.raises(TryAgainLaterError) as info:
        ipam_exec(
            "ADD",
            "fake-ipam",
            conf(),
            {**env, "FAKE_MODE": "sleep", "FAKE_PIDFILE": str(pidfile)},
            timeout_s=1.0,
        )
    assert info.value.code == 11
    assert "timed out after 1 s" in info.value.msg
    assert time.monotonic() - start < 10
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{grandchild}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{grandchild}").exists(), "the plugin's child survived the timeout"


def test_nul_in_env_is_ipam_error_not_crash(env: dict[str, str]) -> None:
    with pytest.raises(IpamError):
        ipam_exec("DEL", "fake-ipam", conf(), {**env, "CNI_ARGS": "a\0b"})


def test_netconf_may_be_str(env: dict[str, str]) -> None:
    ipam_exec("DEL", "fake-ipam", conf().decode(), env)
    assert calls(env)[0]["stdin"] == conf().decode()


def test_missing_plugin_is_code_7(env: dict[str, str]) -> None:
    with pytest.raises(InvalidConfigError):
        ipam_exec("ADD", "absent-ipam", conf(), env)


def test_unexecutable_binary_is_ipam_error(env: dict[str, str], plugin_dir: Path) -> None:
    write_plugin(plugin_dir, "broken", "\x7fELF not really")
    with pytest.raises(IpamError) as info:
        ipam_exec("ADD", "broken", conf(), env)
    assert "cannot execute" in info.value.msg


def test_no_shell_involved(
    env: dict[str, str], plugin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a type with shell metacharacters is just a file name, never interpreted
    monkeypatch.chdir(tmp_path)
    name = "fake;touch pwned;$(touch pwned2)"
    write_plugin(plugin_dir, name)
    ipam_exec("DEL", name, conf(), env)
    assert [c["cmd"] for c in calls(env)] == ["DEL"]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_version_negotiation_retries_with_older_version(env: dict[str, str]) -> None:
    prev = {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "net1", "mtu": 1500}],
        "ips": [{"address": "10.0.0.2/24", "interface": 0}],
    }
    netconf = conf("1.1.0", prevResult=prev)
    ipam_exec("CHECK", "fake-ipam", netconf, {**env, "FAKE_VERSIONS": "0.3.1,0.4.0,1.0.0"})
    seen = calls(env)
    assert [c["cmd"] for c in seen] == ["CHECK", "VERSION", "CHECK"]
    retried = json.loads(str(seen[2]["stdin"]))
    assert retried["cniVersion"] == "1.0.0"
    # prevResult converted to 1.0.0: no interface mtu
    assert retried["prevResult"] == {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "net1"}],
        "ips": [{"address": "10.0.0.2/24", "interface": 0}],
    }
    assert retried["ipam"] == {"type": "fake-ipam"}


def _versions_sent(env: dict[str, str]) -> list[tuple[object, object]]:
    return [
        (c["cmd"], json.loads(str(c["stdin"])).get("cniVersion") if c["stdin"] else None) for c in calls(env)
    ]


def test_a_negotiated_version_is_sent_at_once_to_the_same_binary(env: dict[str, str]) -> None:
    """Debian's host-local refuses a 1.1.0 config: the first call negotiates (three runs),
    every later one of any negotiated verb runs the plugin once, with the version it took."""
    old = {**env, "FAKE_VERSIONS": "0.3.1,0.4.0,1.0.0"}
    assert ipam_exec("ADD", "fake-ipam", conf("1.1.0"), old) is not None
    ipam_exec("CHECK", "fake-ipam", conf("1.1.0"), old)
    ipam_exec("DEL", "fake-ipam", conf("1.1.0"), old)
    assert _versions_sent(env) == [
        ("ADD", "1.1.0"),
        ("VERSION", "1.1.0"),
        ("ADD", "1.0.0"),
        ("CHECK", "1.0.0"),
        ("DEL", "1.0.0"),
    ]


def test_a_replaced_binary_is_asked_again(env: dict[str, str], plugin_dir: Path) -> None:
    ipam_exec("ADD", "fake-ipam", conf("1.1.0"), {**env, "FAKE_VERSIONS": "1.0.0"})
    path = plugin_dir / "fake-ipam"
    new = plugin_dir / "fake-ipam.new"
    shutil.copy(path, new)
    os.replace(new, path)  # an upgrade: another inode under the same name
    ipam_exec("ADD", "fake-ipam", conf("1.1.0"), {**env, "FAKE_VERSIONS": "1.0.0,1.1.0"})
    assert _versions_sent(env)[3:] == [("ADD", "1.1.0")]


def test_a_binary_that_refuses_the_version_it_took_is_asked_again(env: dict[str, str]) -> None:
    ipam_exec("ADD", "fake-ipam", conf("1.1.0"), {**env, "FAKE_VERSIONS": "0.4.0,1.0.0"})
    ipam_exec("ADD", "fake-ipam", conf("1.1.0"), {**env, "FAKE_VERSIONS": "0.4.0"})
    assert _versions_sent(env)[3:] == [
        ("ADD", "1.0.0"),
        ("ADD", "1.1.0"),
        ("VERSION", "1.1.0"),
        ("ADD", "0.4.0"),
    ]
    ipam_exec("ADD", "fake-ipam", conf("1.1.0"), {**env, "FAKE_VERSIONS": "0.4.0"})
    assert _versions_sent(env)[7:] == [("ADD", "0.4.0")]


def test_a_config_of_a_version_the_binary_takes_is_sent_as_it_is(env: dict[str, str]) -> None:
    ipam_exec("ADD", "fake-ipam", conf("1.1.0"), {**env, "FAKE_VERSIONS": "1.0.0"})
    ipam_exec("ADD", "fake-ipam", conf("1.0.0"), {**env, "FAKE_VERSIONS": "1.0.0"})
    assert _versions_sent(env)[3:] == [("ADD", "1.0.0")]
    assert json.loads(str(calls(env)[3]["stdin"])) == json.loads(conf("1.0.0"))


def test_version_negotiation_down_to_040_adds_ip_version(env: dict[str, str]) -> None:
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]}
    ipam_exec("DEL", "fake-ipam", conf("1.0.0", prevResult=prev), {**env, "FAKE_VERSIONS": "0.3.1,0.4.0"})
    retried = json.loads(str(calls(env)[2]["stdin"]))
    assert retried["cniVersion"] == "0.4.0"
    assert retried["prevResult"]["ips"] == [{"version": "4", "address": "10.0.0.2/24"}]


def test_no_negotiation_when_plugin_only_knows_newer(env: dict[str, str]) -> None:
    with pytest.raises(IpamError) as info:
        ipam_exec("ADD", "fake-ipam", conf("0.3.1"), {**env, "FAKE_VERSIONS": "1.0.0,1.1.0"})
    assert info.value.code == 1
    assert [c["cmd"] for c in calls(env)] == ["ADD", "VERSION"]


def test_plugin_versions(env: dict[str, str]) -> None:
    assert plugin_versions("fake-ipam", {**env, "FAKE_VERSIONS": "0.4.0,1.0.0"}) == ("0.4.0", "1.0.0")


# --- wrappers ------------------------------------------------------------------


def test_ipam_add_returns_latest_schema_result(env: dict[str, str]) -> None:
    old = json.dumps(
        {
            "cniVersion": "0.2.0",
            "ip4": {"ip": "10.1.0.7/16", "gateway": "10.1.0.1", "routes": [{"dst": "0.0.0.0/0"}]},
        }
    )
    r = ipam_add("fake-ipam", conf("0.2.0"), {**env, "FAKE_RESULT": old})
    assert r == Result(ips=[IPConfig("10.1.0.7/16", "10.1.0.1")], routes=[Route("0.0.0.0/0")])


def test_ipam_add_uses_config_version_when_output_has_none(env: dict[str, str]) -> None:
    out = json.dumps({"ips": [{"address": "10.1.0.7/16"}]})  # no cniVersion, no per-IP version
    with pytest.raises(DecodeError):
        ipam_add("fake-ipam", conf("0.4.0"), {**env, "FAKE_RESULT": out})


def test_ipam_add_requires_an_ip_by_default(env: dict[str, str]) -> None:
    e = {**env, "FAKE_RESULT": json.dumps({"cniVersion": "1.1.0"})}
    with pytest.raises(IpamError) as info:
        ipam_add("fake-ipam", conf(), e)
    assert "no IP address" in info.value.msg
    assert ipam_add("fake-ipam", conf(), e, require_ips=False) == Result()


def test_del_and_check_wrappers(env: dict[str, str]) -> None:
    assert ipam_del("fake-ipam", conf(), env) is None
    assert ipam_check("fake-ipam", conf(), env) is None
    assert [c["cmd"] for c in calls(env)] == ["DEL", "CHECK"]


@pytest.mark.parametrize(("func", "cmd"), [(ipam_status, "STATUS"), (ipam_gc, "GC")])
def test_status_gc_forwarded_to_11_plugins(func, cmd: str, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    assert func("fake-ipam", conf(), env) is True
    assert [c["cmd"] for c in calls(env)] == ["VERSION", cmd]


@pytest.mark.parametrize("func", [ipam_status, ipam_gc])
def test_status_gc_skipped_for_pre_11_plugins(func, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    assert func("fake-ipam", conf(), {**env, "FAKE_VERSIONS": "0.4.0,1.0.0"}) is False
    assert [c["cmd"] for c in calls(env)] == ["VERSION"]


def test_status_error_keeps_plugin_code(env: dict[str, str], plugin_dir: Path) -> None:
    body = (
        f"#!{sys.executable}\nimport os, json\n"
        "if os.environ['CNI_COMMAND'] == 'VERSION':\n"
        "    print(json.dumps({'cniVersion': '1.1.0', 'supportedVersions': ['1.1.0']}))\n"
        "else:\n"
        "    print(json.dumps({'code': 50, 'msg': 'daemon down'})); raise SystemExit(1)\n"
    )
    write_plugin(plugin_dir, "status-ipam", body)
    with pytest.raises(IpamError) as info:
        ipam_status("status-ipam", conf(), env)
    assert info.value.code == 50
    assert info.value.msg == "failed to get status of IPAM status-ipam: daemon down"


# --- the real host-local -------------------------------------------------------

HOST_LOCAL_DIR = "/usr/lib/cni"
needs_host_local = pytest.mark.skipif(
    not os.access(os.path.join(HOST_LOCAL_DIR, "host-local"), os.X_OK), reason="host-local not installed"
)


@needs_host_local
@pytest.mark.parametrize("version", ["0.2.0", "0.4.0", "1.0.0", "1.1.0"])
def test_host_local_add_del_roundtrip(version: str, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    netconf = json.dumps(
        {
            "cniVersion": version,
            "name": "hlnet",
            "type": "cni-dra",
            "ipam": {
                "type": "host-local",
                "subnet": "10.77.0.0/24",
                "dataDir": str(data_dir),
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }
    ).encode()
    env = {
        "CNI_CONTAINERID": "ctr1",
        "CNI_NETNS": "/var/run/netns/none",
        "CNI_IFNAME": "net1",
        "CNI_PATH": HOST_LOCAL_DIR,
    }
    result = ipam_add("host-local", netconf, env)
    assert result == Result(ips=[IPConfig("10.77.0.2/24", "10.77.0.1")], routes=[Route("0.0.0.0/0")])
    reservation = data_dir / "hlnet" / "10.77.0.2"
    assert reservation.exists()
    assert "ctr1" in reservation.read_text()

    ipam_del("host-local", netconf, {k: v for k, v in env.items() if k != "CNI_NETNS"})
    assert not reservation.exists()
    # DEL again is fine (idempotent)
    ipam_del("host-local", netconf, env)


@needs_host_local
def test_host_local_exhausted_range_keeps_its_error(tmp_path: Path) -> None:
    netconf = json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "tiny",
            "type": "cni-dra",
            "ipam": {"type": "host-local", "subnet": "10.78.0.0/30", "dataDir": str(tmp_path)},
        }
    ).encode()
    env = {"CNI_NETNS": "/x", "CNI_IFNAME": "net1", "CNI_PATH": HOST_LOCAL_DIR}
    ipam_add("host-local", netconf, {**env, "CNI_CONTAINERID": "a"})
    with pytest.raises(IpamError) as info:
        ipam_add("host-local", netconf, {**env, "CNI_CONTAINERID": "b"})
    assert info.value.msg.startswith("failed to add IPAM host-local: ")
    assert "10.78.0.0/30" in info.value.msg or "no IP addresses available" in info.value.msg


@needs_host_local
def test_host_local_status_skipped_as_pre_11(tmp_path: Path) -> None:
    netconf = json.dumps(
        {
            "cniVersion": "1.1.0",
            "name": "n",
            "type": "cni-dra",
            "ipam": {"type": "host-local", "subnet": "10.79.0.0/24", "dataDir": str(tmp_path)},
        }
    ).encode()
    assert ipam_status("host-local", netconf, {"CNI_PATH": HOST_LOCAL_DIR}) is False


def test_protocol_and_ipam_imports_stay_lean() -> None:
    import subprocess

    code = (
        "import sys, cni_dra.ipam, cni_dra.protocol.env, cni_dra.protocol.versions, cni_dra.protocol.results\n"
        "heavy = [m for m in ('pyroute2', 'pydantic', 'kubernetes', 'click', 'filelock', 'yaml') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[1],
    )
    assert out.stdout.strip() == ""


def test_cni_path_argument_overrides_env(env: dict[str, str], plugin_dir: Path, tmp_path: Path) -> None:
    # the verbs pass CniEnv.path; the environment's CNI_PATH is then not searched
    no_path_env = {**env, "CNI_PATH": str(tmp_path / "elsewhere")}
    result = ipam_add("fake-ipam", conf(), no_path_env, (str(plugin_dir),))
    assert result.ips == (IPConfig("10.0.0.2/24", "10.0.0.1"),)
    with pytest.raises(InvalidConfigError):
        ipam_del("fake-ipam", conf(), env, [str(tmp_path / "elsewhere")])
    # the child still sees the environment's CNI_PATH unchanged
    assert calls(env)[0]["env"]["CNI_PATH"] == str(tmp_path / "elsewhere")  # type: ignore[index]


def test_timeout_is_keyword_only(env: dict[str, str]) -> None:
    with pytest.raises(TypeError):
        ipam_del("fake-ipam", conf(), env, None, 5.0)  # type: ignore[misc]


# --- how the plugin process is started ------------------------------------------------

PROBE = """#!/bin/sh
cat >/dev/null
grep -E '^(SigIgn|SigBlk):' /proc/self/status
echo "env: $PROBE_VALUE"
for fd in /proc/$$/fd/*; do echo "fd: ${fd##*/}"; done
"""


# SigIgn bits of glibc's internal signals SIGCANCEL (32) and SIGSETXID (33): bit s - 1.
GLIBC_INTERNAL_SIGNAL_BITS = (1 << 31) | (1 << 32)


def _probe_result(out: bytes) -> dict[str, object]:
    seen: dict[str, object] = {"fds": []}
    for line in out.decode().splitlines():
        key, _, value = line.replace("\t", " ").partition(" ")
        if key == "fd:":
            seen["fds"].append(int(value))  # type: ignore[attr-defined]
        else:
            seen[key.rstrip(":")] = value.strip()
    return seen


@pytest.mark.parametrize("starter", ["posix_spawn", "subprocess"])
def test_the_plugin_starts_alone_in_its_session_with_default_signals_and_only_its_pipes(
    starter: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ways of starting it (glibc's posix_spawn, which lets the other threads of the
    agent run while the child starts, and subprocess where that is missing) give the plugin
    the same process: a new session (its group is killed on timeout), no signal ignored
    (Python ignores SIGPIPE; the plugin must not inherit that) or blocked, its environment,
    and stdin/stdout/stderr but no other descriptor of the caller."""
    from cni_dra import ipam
    from cni_dra.ipam import spawn

    if starter == "subprocess":
        monkeypatch.setattr(spawn, "_SPAWN_CHECKED", True)
        monkeypatch.setattr(spawn, "_SPAWN", None)
    else:
        assert spawn._spawner() is not None, "glibc without posix_spawn_file_actions_addclosefrom_np"
    probe = write_plugin(tmp_path / "bin", "probe", PROBE)
    opened = os.open(tmp_path, os.O_RDONLY)
    leaked = os.dup2(opened, 77, inheritable=True)  # a descriptor the caller would pass on by mistake
    os.close(opened)
    try:
        rc, out, err = ipam._run(
            str(probe), b"{}", {"PROBE_VALUE": "v=1", "PATH": "/usr/bin:/bin"}, 10.0, "probe"
        )
    finally:
        os.close(leaked)
    assert rc == 0, err
    seen = _probe_result(out)
    ignored = int(str(seen["SigIgn"]), 16)
    if starter == "subprocess":
        # glibc's own signals (32, 33) cannot be reset through sigaction: subprocess passes on
        # what the caller has, and GNU make starts its recipes (this suite under `make test`)
        # with them ignored (its posix_spawn leaves them so). Every other signal is default.
        ignored &= ~GLIBC_INTERNAL_SIGNAL_BITS
    assert ignored == 0, seen["SigIgn"]
    assert seen["SigBlk"] == "0000000000000000"
    assert seen["env"] == "v=1"
    fds = seen["fds"]
    assert isinstance(fds, list) and {0, 1, 2} <= set(fds) and leaked not in fds, fds
