"""Processes, files and waiting for scripts/e2e/cluster.py: where the cluster lives
(``CNI_DRA_E2E_DIR``), starting a component with its log and pid file, finding it again
from another process, stopping it, and the cgroup tree every node's processes live under."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

DIR = Path(os.environ.get("CNI_DRA_E2E_DIR", "/run/cni-dra-e2e"))
CGROUP_ROOT = "cni-dra-e2e"
"""Under every cgroup hierarchy: each node's tree (``<CGROUP_ROOT>/<node>``) is under it."""
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ClusterError(Exception):
    pass


def log(msg: str) -> None:
    print(f"cluster: {msg}", file=sys.stderr, flush=True)


def run(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(list(args), capture_output=True, text=True, **kw)
    if check and res.returncode != 0:
        raise ClusterError(
            f"failed to run {' '.join(args)}: exit {res.returncode}: {res.stderr.strip() or res.stdout.strip()}"
        )
    return res


def p(*parts: str) -> Path:
    return DIR.joinpath(*parts)


def pidfile(name: str) -> Path:
    """``name`` is a control-plane component (``etcd``) or ``<node>/<component>``."""
    return p("pids", f"{name}.pid")


def logfile(name: str) -> Path:
    return p("logs", f"{name}.log")


def wait(cond: Callable[[], object], what: str, timeout_s: float, *, proc: str | None = None) -> None:
    end = time.monotonic() + timeout_s
    last_exc = None
    while time.monotonic() < end:
        try:
            if cond():
                return
        except Exception as exc:  # noqa: BLE001 - the condition probes a starting component
            last_exc = exc
        if proc and not running(proc):
            raise ClusterError(f"{proc} exited while waiting for {what}; see {logfile(proc)}")
        time.sleep(0.3)
    raise ClusterError(f"{what} not reached in {timeout_s:.0f}s (last error: {last_exc})")


# -- cgroups -------------------------------------------------------------------------------


def cgroup_hierarchies() -> list[Path]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] in ("cgroup", "cgroup2"):
            mp = Path(fields[4])
            if mp not in out:
                out.append(mp)
    return out


def make_cgroup(rel: str) -> None:
    """``rel`` (and every parent) in each hierarchy; cpuset's cpus and mems copied down
    (a v1 cpuset cgroup without them takes no task)."""
    for h in cgroup_hierarchies():
        d = h
        for part in Path(rel).parts:
            parent, d = d, d / part
            d.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (parent / knob).exists() and not (d / knob).read_text().strip():
                    (d / knob).write_text((parent / knob).read_text().strip())


def cgroup_joiner(rel: str) -> Callable[[], None]:
    """A ``preexec_fn`` that moves the child into ``rel`` in every hierarchy before its exec
    (what it starts is born there). The paths are found here, in the parent: between fork
    and exec the child only opens and writes (no Python lock another thread might hold)."""
    paths = [str(h / rel / "cgroup.procs") for h in cgroup_hierarchies()]

    def join() -> None:
        me = str(os.getpid()).encode()
        for path in paths:
            try:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.write(fd, me)
                finally:
                    os.close(fd)
            except OSError:
                pass  # a hierarchy that takes no process in an inner cgroup (cgroup2 with controllers)

    return join


def remove_cgroups() -> None:
    """Kill whatever still runs in the cluster's cgroups (the nodes' daemons, shims and
    containers), then remove them, deepest first. Only the tree under CGROUP_ROOT."""
    left: list[Path] = []
    for _ in range(5):
        for h in cgroup_hierarchies():
            root = h / CGROUP_ROOT
            if not root.is_dir():
                continue
            for procs in root.rglob("cgroup.procs"):
                try:
                    for pid in procs.read_text().split():
                        try:
                            os.kill(int(pid), signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                except OSError:
                    pass
        time.sleep(0.3)
        left = []
        for h in cgroup_hierarchies():
            root = h / CGROUP_ROOT
            if not root.is_dir():
                continue
            dirs = sorted(
                (d for d in root.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True
            )
            for d in [*dirs, root]:
                try:
                    d.rmdir()
                except OSError:
                    left.append(d)
        if not left:
            return
    raise ClusterError(f"cgroups left: {', '.join(map(str, left[:5]))}")


# -- processes -----------------------------------------------------------------------------

# Popen objects of the processes this process started (kept so that they are reaped, not
# garbage-collected while running); other processes are found through the pid files.
_PROCS: dict[str, subprocess.Popen] = {}


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22): with the
    pid, what tells the process started here from a later one that got the same pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def start(name: str, args: list[str], env: dict[str, str] | None = None, *, cgroup: str | None = None) -> int:
    """Start ``args`` as ``name`` (logging to logs/<name>.log), in cgroup ``cgroup`` of
    every hierarchy when given. The command line and env are saved for :func:`restart`."""
    pidfile(name).parent.mkdir(parents=True, exist_ok=True)
    logfile(name).parent.mkdir(parents=True, exist_ok=True)
    full_env = {"PATH": PATH, "HOME": "/root"}
    full_env.update(env or {})
    with open(logfile(name), "ab") as out:
        out.write(f"=== {time.strftime('%H:%M:%S')} start: {' '.join(args)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
            cwd="/",
            preexec_fn=cgroup_joiner(cgroup) if cgroup else None,
        )
    pidfile(name).write_text(f"{proc.pid} {_start_time(proc.pid)}")
    pidfile(name).with_suffix(".cmd").write_text(
        json.dumps({"args": args, "env": env or {}, "cgroup": cgroup})
    )
    _PROCS[name] = proc
    return proc.pid


def pid_of(name: str) -> int | None:
    try:
        pid_s, started = pidfile(name).read_text().split()
        pid = int(pid_s)
    except (OSError, ValueError):
        return None
    proc = _PROCS.get(name)
    if proc is not None and proc.pid == pid:
        return pid if proc.poll() is None else None  # our own child: its Popen object knows
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # a zombie (our child, exited, not yet reaped) counts as gone; so does a pid that now
    # belongs to a process started later (pid reuse): never signal a process we did not start
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        _reap(pid)
        return None
    return pid if _start_time(pid) == started else None


def restart(name: str) -> int:
    """Stop ``name`` (SIGTERM) and start it again with the same command line."""
    saved = json.loads(pidfile(name).with_suffix(".cmd").read_text())
    stop(name)
    return start(name, saved["args"], saved["env"], cgroup=saved.get("cgroup"))


def running(name: str) -> bool:
    return pid_of(name) is not None


def _group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (/proc/PID/stat field 5)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(d.name))
    return out


def _signal_group(pid: int, sig: int) -> None:
    """``sig`` to the process group ``start`` made (a session of its own): the component and,
    when it was started through ``nsenter --pid`` (which forks), the component nsenter runs."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop(name: str, *, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
    """Signal ``name``'s process group and wait until every process of it is gone (SIGKILL
    after ``timeout_s``)."""
    pid = pid_of(name)
    if pid is None:
        pidfile(name).unlink(missing_ok=True)
        return
    _signal_group(pid, sig)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and (pid_of(name) is not None or _group(pid)):
        _reap(pid)
        time.sleep(0.1)
    if pid_of(name) is not None or _group(pid):
        _signal_group(pid, signal.SIGKILL)
        time.sleep(0.3)
        _reap(pid)
    proc = _PROCS.pop(name, None)
    if proc is not None and proc.pid == pid:
        proc.wait(5)
    pidfile(name).unlink(missing_ok=True)


def stop_all(names: list[str], *, timeout_s: float = 15.0) -> None:
    """Stop ``names`` together: SIGTERM to each, then wait for all (SIGKILL after the timeout)."""
    pids = {name: pid for name in names if (pid := pid_of(name)) is not None}
    for pid in pids.values():
        _signal_group(pid, signal.SIGTERM)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and any(
        pid_of(name) is not None or _group(pid) for name, pid in pids.items()
    ):
        for pid in pids.values():
            _reap(pid)
        time.sleep(0.1)
    for name in names:
        stop(name, sig=signal.SIGKILL, timeout_s=2)


def _reap(pid: int) -> None:
    for proc in _PROCS.values():
        if proc.pid == pid:
            proc.poll()
            return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def kill_in_namespaces(inodes: set[tuple[int, int]]) -> list[int]:
    """SIGKILL every process that is in one of the namespaces ``inodes`` ((st_dev, st_ino)
    of a namespace file: a node's mount, UTS, network or PID namespace): the node's daemons and
    what they left (containerd's shims run in sessions of their own). Returns the pids."""
    me, killed = os.getpid(), []
    if not inodes:
        return killed
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        for ns in ("mnt", "uts", "net", "pid"):
            try:
                st = os.stat(d / "ns" / ns)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in inodes:
                try:
                    os.kill(int(d.name), signal.SIGKILL)
                    killed.append(int(d.name))
                except ProcessLookupError:
                    pass
                break
    return killed


# -- mounts --------------------------------------------------------------------------------


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or under ``prefix`` in this process's mount namespace."""
    mps = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if mp == str(prefix) or mp.startswith(str(prefix) + "/"):
            mps.append(mp)
    return mps


def unmount_under(prefix: Path) -> None:
    for _ in range(10):
        mps = mounts_under(prefix)
        if not mps:
            return
        for mp in sorted(set(mps), key=lambda m: m.count("/"), reverse=True):
            if run("umount", mp, check=False).returncode != 0:
                run("umount", "-l", mp, check=False)
    if mounts_under(prefix):
        raise ClusterError(f"mounts left: {mounts_under(prefix)[:5]}")
