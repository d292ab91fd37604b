"""The CRI-O check of scripts/e2e/smoke-runtimes: CRI-O standalone under a temporary
directory, crictl driving one pod through it, and every CNI call it makes recorded."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from smoke_host import (
    CACHE,
    HERE,
    SUBNET,
    TAG,
    SmokeError,
    kill_mentioning,
    last_line,
    last_lines,
    log,
    make_cgroup_parent,
    netns_ipv4,
    ping,
    read_calls,
    remove_cgroup_parent,
    remove_cni_cache,
    run,
    unmount_under,
    wait_for,
    write_shim,
)

# CRI-O gives the infra (pause) container oom_score_adj -998; lowering it needs
# CAP_SYS_RESOURCE, which this host does not give, so runc fails ("failed to update
# /proc/self/oom_score_adj: Permission denied"). CRI-O has no option like containerd's
# restrict_oom_score_adj; this wrapper does what that option does: on `create` it raises
# process.oomScoreAdj in the bundle's config.json to runc's own value, then runs runc.
RUNC_WRAPPER = """#!/bin/sh
# runc {real}, with a create's oomScoreAdj raised to this process's own (see smoke-runtimes)
for a; do
    if [ "$a" = create ]; then
        /usr/bin/python3 -I -c '
import json, sys
args = sys.argv[1:]
bundle = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--bundle", "-b")), ".")
path = bundle + "/config.json"
spec = json.load(open(path))
own = int(open("/proc/self/oom_score_adj").read())
proc = spec.get("process") or {{}}
if proc.get("oomScoreAdj", own) < own:
    proc["oomScoreAdj"] = own
    json.dump(spec, open(path, "w"))
' "$@" || exit 1
        break
    fi
done
exec {real} "$@"
"""


@dataclasses.dataclass(frozen=True)
class CrioPass:
    """One run of CRI-O: the network's cniVersion, where the reference plugins come from,
    CRI-O's cni_status_grace_period, whether an infra (pause) container runs, and the
    Multus thin plugin to put in front of ptp (None: ptp alone)."""

    cni_version: str
    plugin_dir: Path
    grace: str = "0s"
    infra: bool = False
    multus: Path | None = None


def unstable_cni_plugins() -> Path:
    """Debian unstable's containernetworking-plugins (CNI 1.1.0: STATUS, GC), unpacked under
    the cache with fetch-runtime's private apt config for unstable (needs glibc 2.34)."""
    d = CACHE / "cni-plugins-unstable"
    if (d / "stamp").exists():
        return d / "usr/lib/cni"
    tmp = Path(f"{d}.tmp")
    run("rm", "-rf", str(tmp))
    (tmp / "dl").mkdir(parents=True)
    env = {**os.environ, "APT_CONFIG": str(CACHE / "apt/apt.conf")}
    run(
        "apt-get",
        "-qq",
        "-o",
        "APT::Sandbox::User=root",
        "download",
        "containernetworking-plugins",
        cwd=tmp / "dl",
        env=env,
        timeout=300,
    )
    (deb,) = (tmp / "dl").glob("*.deb")
    run("dpkg-deb", "-x", str(deb), str(tmp))
    (tmp / "stamp").write_text(deb.name + "\n")
    run("rm", "-rf", str(tmp / "dl"), str(d))
    tmp.rename(d)
    return d / "usr/lib/cni"


def crio_config(tmp: Path, bins: Path, plugin_dirs: list[Path], grace: str, infra: bool) -> str:
    q = json.dumps  # TOML basic strings are JSON strings
    return f"""
[crio]
root = {q(str(tmp / "root"))}
runroot = {q(str(tmp / "runroot"))}
storage_driver = "overlay"
log_dir = {q(str(tmp / "pod-logs"))}
version_file = {q(str(tmp / "version"))}
version_file_persist = {q(str(tmp / "version-persist"))}
clean_shutdown_file = {q(str(tmp / "clean.shutdown"))}

[crio.api]
listen = {q(str(tmp / "crio.sock"))}
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
namespaces_dir = {q(str(tmp / "ns"))}
pinns_path = {q(str(bins / "pinns"))}
container_exits_dir = {q(str(tmp / "exits"))}
container_attach_socket_dir = {q(str(tmp / "attach"))}
decryption_keys_path = {q(str(tmp / "keys"))}
cdi_spec_dirs = [{q(str(tmp / "cdi"))}]
hooks_dir = [{q(str(tmp / "hooks"))}]
irqbalance_config_file = {q(str(tmp / "irqbalance"))}
irqbalance_config_restore_file = "disable"
drop_infra_ctr = {"false" if infra else "true"}
enable_criu_support = false
log_level = "info"

[crio.runtime.runtimes.runc]
runtime_path = {q(str(tmp / "runc-wrapper" if infra else bins / "runc"))}
runtime_type = "oci"
runtime_root = {q(str(tmp / "runc"))}
monitor_path = {q(str(bins / "conmon"))}
monitor_cgroup = "pod"
monitor_env = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]

[crio.image]
pause_image = "registry.k8s.io/pause:3.10"
pause_command = ""
signature_policy = {q(str(tmp / "policy.json"))}
signature_policy_dir = {q(str(tmp / "policies"))}
namespaced_auth_dir = {q(str(tmp / "auth"))}

[crio.network]
network_dir = {q(str(tmp / "net.d"))}
plugin_dirs = {q([str(d) for d in plugin_dirs])}
cni_status_grace_period = {q(grace)}

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
"""


class Crio:
    """One standalone CRI-O under a temporary directory, and crictl talking to it."""

    def __init__(self, tmp: Path, bins: Path) -> None:
        self.tmp, self.bins = tmp, bins
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock = tmp / "crio.sock"
        self.log = tmp / "crio.log"

    def start(self) -> None:
        self.sock.unlink(missing_ok=True)
        with open(self.log, "a") as out:
            proc = self.proc = subprocess.Popen(
                [
                    str(self.bins / "crio"),
                    "--config",
                    str(self.tmp / "crio.conf"),
                    "--config-dir",
                    str(self.tmp / "crio.conf.d"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={"PATH": f"{self.bins}:/usr/sbin:/usr/bin:/sbin:/bin"},
            )
        try:
            wait_for(
                lambda: (
                    proc.poll() is None
                    and self.sock.exists()
                    and self.crictl("version", check=False).returncode == 0
                ),
                "CRI-O's socket",
                60,
            )
        except SmokeError:
            raise SmokeError(f"CRI-O did not come up (exit {proc.poll()}):\n{self.tail()}") from None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def crictl(self, *args: str, check: bool = True, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        ep = f"unix://{self.sock}"
        return run(
            str(self.bins / "crictl"),
            "--runtime-endpoint",
            ep,
            "--image-endpoint",
            ep,
            "--timeout",
            "60s",
            *args,
            check=check,
            timeout=timeout,
        )

    def tail(self, n: int = 30) -> str:
        if not self.log.exists():
            return ""
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if len(ln) < 2000]
        return "\n".join(lines[-n:])  # without the one-line dump of the whole configuration


def crio_setup(tmp: Path, bins: Path, images: Path, cp: CrioPass) -> Path:
    """Config, policy, CNI network (ptp, or Multus delegating to ptp, behind the shim),
    images and, with an infra container, the runc wrapper; returns the calls log."""
    for d in (
        "crio.conf.d",
        "net.d",
        "ns",
        "pod-logs",
        "exits",
        "attach",
        "keys",
        "cdi",
        "hooks",
        "policies",
    ):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    shim_dir, calls = tmp / "cni-shim", tmp / "cni-calls.jsonl"
    write_shim(shim_dir, cp.plugin_dir / "ptp", calls)
    (tmp / "crio.conf").write_text(crio_config(tmp, bins, [shim_dir, cp.plugin_dir], cp.grace, cp.infra))
    if cp.infra:
        (tmp / "runc-wrapper").write_text(RUNC_WRAPPER.format(real=bins / "runc"))
        (tmp / "runc-wrapper").chmod(0o755)
    (tmp / "policy.json").write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    ptp = {
        "type": "ptp",
        "ipMasq": False,
        "mtu": 1500,
        "ipam": {
            "type": "host-local",
            "dataDir": str(tmp / "ipam"),
            "ranges": [[{"subnet": f"{SUBNET}.0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    }
    network = {"cniVersion": cp.cni_version, "name": TAG, "plugins": [ptp]}
    if cp.multus is not None:
        write_shim(shim_dir, cp.multus, calls)
        network = {
            "cniVersion": cp.cni_version,
            "name": TAG,
            "plugins": [
                {
                    "type": "multus",
                    "binDir": str(shim_dir),
                    "cniDir": str(tmp / "multus"),
                    "logFile": str(tmp / "multus.log"),
                    "logLevel": "verbose",
                    "delegates": [{**network, "name": f"{TAG}-ptp"}],
                }
            ],
        }
    (tmp / "net.d" / "10-smoke.conflist").write_text(json.dumps(network, indent=1))
    for archive, name in (
        ("pause.tar", "registry.k8s.io/pause:3.10"),
        ("sleeper.tar", "localhost/cni-dra-e2e/sleeper:1"),
    ):
        run(
            str(bins / "copyimg"),
            "--root",
            str(tmp / "root"),
            "--runroot",
            str(tmp / "runroot"),
            "--storage-driver",
            "overlay",
            "--signature-policy",
            str(tmp / "policy.json"),
            "--import-from",
            f"oci-archive:{images / archive}",
            "--image-name",
            name,
        )
    return calls


def pod_configs(tmp: Path) -> tuple[Path, Path]:
    pod, ctr = tmp / "pod.json", tmp / "ctr.json"
    pod.write_text(
        json.dumps(
            {
                "metadata": {
                    "name": "smoke",
                    "namespace": "cni-dra-smoke",
                    "uid": str(uuid.uuid4()),
                    "attempt": 0,
                },
                "log_directory": str(tmp / "pod-logs" / "smoke"),
                # as the kubelet sends it: the pod's containers do not share a PID namespace
                # (CRI's default, POD, would make CRI-O run an infra container regardless of
                # drop_infra_ctr)
                "linux": {
                    "cgroup_parent": f"/{TAG}",
                    "security_context": {"namespace_options": {"pid": 1}},
                },  # CONTAINER
            }
        )
    )
    ctr.write_text(
        json.dumps(
            {
                "metadata": {"name": "sleeper"},
                "image": {"image": "localhost/cni-dra-e2e/sleeper:1"},
                "log_path": "sleeper.log",
                "linux": {
                    "security_context": {
                        "seccomp": {"profile_type": 0},  # RuntimeDefault
                        "namespace_options": {"pid": 1},
                    }
                },
            }
        )
    )
    return pod, ctr


def check_pod(crio: Crio, pod_id: str, ctr_id: str, calls: Path, cp: CrioPass) -> str:
    """The container runs under seccomp; with an infra container, that runs the pause
    image's /ENTRY; the pod's IP is ADD's result and eth0's address."""
    st = json.loads(crio.crictl("inspect", ctr_id).stdout)
    if st["status"]["state"] != "CONTAINER_RUNNING":
        raise SmokeError(f"container state {st['status']['state']}")
    pid = st["info"]["pid"]
    seccomp = [ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Seccomp:")]
    if seccomp != ["Seccomp:\t2"]:
        raise SmokeError(f"container process {pid} is not under a seccomp filter: {seccomp}")
    sp = json.loads(crio.crictl("inspectp", pod_id).stdout)
    ip: str = sp["status"]["network"]["ip"]
    infra_pid = sp["info"].get("pid", 0)
    if cp.infra:
        cmd = Path(f"/proc/{infra_pid}/cmdline").read_bytes() if infra_pid else b""
        adj = Path(f"/proc/{infra_pid}/oom_score_adj").read_text().strip() if infra_pid else "?"
        if cmd != b"/ENTRY\0":
            raise SmokeError(
                f"the infra container (pid {infra_pid}) runs {cmd!r}, not the pause image's /ENTRY"
            )
        log(f"  infra container pid {infra_pid} runs the pause image's /ENTRY, oom_score_adj {adj}")
    elif infra_pid:
        raise SmokeError(f"an infra container runs (pid {infra_pid}) with drop_infra_ctr = true")
    netns = next(
        n["path"] for n in sp["info"]["runtimeSpec"]["linux"]["namespaces"] if n["type"] == "network"
    )
    top = "multus" if cp.multus else "ptp"  # the plugin CRI-O runs
    adds = [c for c in read_calls(calls) if c["env"].get("CNI_COMMAND") == "ADD" and c["plugin"] == top]
    if len(adds) != 1:
        raise SmokeError(f"expected one ADD, saw {len(adds)}")
    result = json.loads(adds[0]["out"])
    result_ips = [i["address"] for i in result.get("ips", [])]
    if [f"{ip}/24"] != result_ips or netns_ipv4(netns, "eth0") != result_ips:
        raise SmokeError(f"pod IP {ip}, ADD result {result_ips}, eth0 {netns_ipv4(netns, 'eth0')}")
    if not ping(ip):
        raise SmokeError(f"no echo reply from the pod at {ip}")
    log(
        f"  pod {pod_id[:12]} ip {ip} (= ADD result = eth0 in {netns}), answers ping; "
        f"container {ctr_id[:12]} pid {pid} running, Seccomp 2 (filter)"
    )
    return ip


def show_calls(calls: Path, marks: list[tuple[float, str]]) -> dict[str, list[str]]:
    """Log every CNI call and every step of ours in time order (seconds from the first);
    return the calls made during each step: "ptp ADD", "ptp GC[<container ids>]", ..."""
    rows: list[tuple[float, str, str | None]] = [(t, f"-- {what}", None) for t, what in marks]
    for c in read_calls(calls):
        e, conf = c["env"], c["conf"] if isinstance(c["conf"], dict) else {}
        verb, extra = e.get("CNI_COMMAND", "?"), ""
        if verb == "GC":
            ids = ",".join(a.get("containerID", "")[:12] for a in conf.get("cni.dev/valid-attachments") or [])
            extra, verb = f" {sorted(k for k in conf if k.startswith('cni.dev/'))}", f"GC[{ids}]"
        if verb in ("ADD", "DEL", "CHECK"):
            extra = f" id={e.get('CNI_CONTAINERID', '')[:12]} if={e.get('CNI_IFNAME')}"
            extra += " netns=" + (
                "none" if not e.get("CNI_NETNS") else "present" if c["netns_exists"] else "gone"
            )
            extra += " prevResult" if "prevResult" in conf else ""
        verb = f"{c['plugin']} {verb}"
        said = f": {' '.join(c['out'].split())}" if c["rc"] else ""  # the error JSON on one line
        rows.append(
            (c["t"], f"{verb} cniVersion={conf.get('cniVersion')}{extra} -> exit {c['rc']}{said}", verb)
        )
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0] if rows else 0.0
    steps: dict[str, list[str]] = {}
    step = "before"
    for t, line, verb in rows:
        log(f"  {t - t0:7.2f}s {line}")
        if verb is None:
            step = line[3:]
            steps[step] = []
        else:
            steps.setdefault(step, []).append(verb)
    return steps


def check_calls(steps: dict[str, list[str]], cp: CrioPass, pod_id: str) -> None:
    """What CRI-O called, step by step (STATUS apart: its polling is timed, not stepped).
    libcni sends STATUS and GC only for a cniVersion of 1.1.0 or more; ocicni follows ADD
    with CHECK (from 0.4.0 on) and takes the pod's IPs from it, and CHECKs the pods it
    restores after a restart."""
    v11 = cp.cni_version == "1.1.0"
    pod = pod_id[:12]
    want = {
        "crio start": ["VERSION", "GC[]"] if v11 else ["VERSION"],
        "crictl runp": ["ADD", "CHECK"],
        "crio restart (pod running)": ["VERSION", f"GC[{pod}]", "CHECK"] if v11 else ["VERSION", "CHECK"],
        "crictl stop + rm container, stopp + rmp pod": ["DEL"],
        "crio stop": [],
    }
    top, all_steps = ("multus" if cp.multus else "ptp"), steps
    steps = {k: [v.split(" ", 1)[1] for v in verbs if v.startswith(f"{top} ")] for k, verbs in steps.items()}
    got = {k: [v for v in verbs if v != "STATUS"] for k, verbs in steps.items()}
    for step, verbs in want.items():
        if got.get(step) != verbs:
            raise SmokeError(f"during '{step}' CRI-O called {got.get(step)}, expected {verbs}")
    for step in ("crio start", "crio restart (pod running)"):
        first = steps[step][: steps[step].index(want[step][1])] if v11 else steps[step]
        if ("STATUS" in first) != v11:
            raise SmokeError(f"during '{step}': {steps[step]} (STATUS before GC only with 1.1.0)")
    if cp.multus is not None:
        # Multus forwards CHECK, GC (with the attachments its cache knows), STATUS and DEL
        delegate = [v.split(" ", 1)[1] for k in want for v in all_steps.get(k, []) if v.startswith("ptp ")]
        want_delegate = ["ADD", "CHECK", f"GC[{pod}]", "CHECK", "DEL"]
        if "STATUS" not in delegate or [v for v in delegate if v != "STATUS"] != want_delegate:
            raise SmokeError(f"Multus's delegate ptp was called {delegate}, expected {want_delegate}")
    polled = steps.get("waiting 12 s (STATUS polling)", [])
    if v11 and cp.grace != "0s" and polled.count("STATUS") < 2:
        raise SmokeError(f"no STATUS polling every 5 s with cni_status_grace_period set: {polled}")


def crio_pass(bins: Path, images: Path, cp: CrioPass) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f"{TAG}-crio.", dir="/var/tmp"))
    crio, marks = Crio(tmp, bins), []

    def mark(what: str) -> None:
        marks.append((time.time(), what))

    log(
        f"crio pass: cniVersion {cp.cni_version}, plugins {cp.plugin_dir}, cni_status_grace_period {cp.grace}, "
        f"drop_infra_ctr {not cp.infra}, {'Multus delegating to ptp' if cp.multus else 'ptp'}, dir {tmp}"
    )
    try:
        calls = crio_setup(tmp, bins, images, cp)
        make_cgroup_parent()
        pod_json, ctr_json = pod_configs(tmp)
        mark("crio start")
        crio.start()
        images_seen = crio.crictl("images", "-o", "json").stdout
        for name in ("registry.k8s.io/pause:3.10", "localhost/cni-dra-e2e/sleeper:1"):
            if name not in images_seen:
                raise SmokeError(f"CRI-O does not list {name}")
        mark("crictl runp")
        pod_id = crio.crictl("runp", str(pod_json)).stdout.strip()
        ctr_id = crio.crictl("create", pod_id, str(ctr_json), str(pod_json)).stdout.strip()
        crio.crictl("start", ctr_id)
        ip = check_pod(crio, pod_id, ctr_id, calls, cp)
        if cp.grace != "0s":
            mark("waiting 12 s (STATUS polling)")
            time.sleep(12)
        mark("crio restart (pod running)")
        crio.stop()
        crio.start()
        time.sleep(3)  # GC comes once the plugin is ready, after start-up
        if json.loads(crio.crictl("inspectp", pod_id).stdout)["status"]["network"]["ip"] != ip:
            raise SmokeError("the pod's IP changed across the restart")
        mark("crictl stop + rm container, stopp + rmp pod")
        crio.crictl("stop", ctr_id)
        crio.crictl("rm", ctr_id)
        crio.crictl("stopp", pod_id)
        crio.crictl("rmp", pod_id)
        mark("crio stop")
        crio.stop()
        check_calls(show_calls(calls, marks), cp, pod_id)
    except BaseException:
        log(f"crio log (last lines):\n{crio.tail()}")
        raise
    finally:
        if crio.proc is not None and crio.proc.poll() is None:
            crio.crictl("rmp", "-af", check=False)
        crio.stop()
        kill_mentioning(str(tmp))
        remove_cgroup_parent()
        unmount_under(tmp)
        remove_cni_cache(TAG)
        run("rm", "-rf", str(tmp))


def check_crio() -> None:
    bins = Path(last_line(str(HERE / "build-crio")))
    env = dict(line.split("=", 1) for line in last_lines(str(HERE / "fetch-runtime")))
    versions = [
        run(str(bins / b), "--version").stdout.splitlines()[0] for b in ("crio", "conmon", "runc", "crictl")
    ]
    log(f"crio: {'; '.join(versions)}")
    images, unstable = Path(env["IMAGES"]), unstable_cni_plugins()
    crio_pass(bins, images, CrioPass("1.0.0", Path("/usr/lib/cni")))
    crio_pass(bins, images, CrioPass("1.1.0", unstable, grace="1m", infra=True))
    multus = Path(last_line(str(HERE / "build-multus"))) / "multus"
    crio_pass(bins, images, CrioPass("1.1.0", unstable, multus=multus))
