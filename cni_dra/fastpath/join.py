"""Join the node's mount namespace: how a fast-path process in a container serves the node.

A runtime runs the plugin in the node's mount namespace, and the paths of an invocation
(``CNI_NETNS``, the conflist's ``stateDir``, ``inventory`` and IPAM ``dataDir``,
``CNI_PATH``) name objects there. An agent in a container has a mount namespace and a
root of its own, where the same names mean other objects or nothing, so the fast path
declines every caller (:mod:`cni_dra.fastpath.server`). :func:`join_mount_namespace`
moves the calling process into the mount namespace of ``target`` (``/proc/1/ns/mnt`` in a
pod with ``hostPID``): ``setns(2)`` with ``CLONE_NEWNS``, which also sets the process's
root and working directory to that namespace's root. The working directory is then set
back to the same path, now in the node's view (``/`` for a container started in ``/``;
it stays ``/`` when the node has no such directory). Its identity (mount namespace, root,
working directory) is then the caller's, and the server's unchanged check serves the
node's callers and still declines any other.

The code keeps coming from the process's own image, whatever the node has at the same
path (another version, or nothing):

* before the switch the process opens each directory it imports from (``O_PATH``: the
  ``sys.path`` entries, and any imported package's ``__path__`` outside them) and keeps
  them; after it, every import path is rewritten under ``/proc/self/fd/<descriptor>``,
  which still names the image's files, so a module imported later is the image's. (A
  descriptor per directory, not one of the root: once the process has left it, the kernel
  no longer crosses the mounts of its former namespace below such a descriptor, e.g. the
  bind mount of a volume, or all of them when no process is left there);
* the dynamic loader's ``--library-path`` cannot be rewritten, so when the process runs
  through the plugin tree's loader (README "The plugin tree") every library in the tree's
  ``lib`` directory is loaded before the switch: an extension module imported later finds
  the libraries it needs already loaded, by soname.

The kernel's conditions: the process must be single-threaded (threads share one
``fs_struct``, and ``setns`` refuses to change it under them: ``EINVAL``), hold
CAP_SYS_ADMIN and CAP_SYS_CHROOT (``EPERM`` otherwise), and may open ``target`` only with
ptrace access to the process it belongs to (CAP_SYS_PTRACE when that process holds
capabilities this one lacks, as the node's init does: ``EACCES`` otherwise).

Standard library only (``ctypes`` for ``setns`` before Python 3.12).
"""

from __future__ import annotations

import importlib
import os
import stat
import sys
from dataclasses import dataclass, field

__all__ = ["CLONE_NEWNS", "Joined", "join_mount_namespace", "reroot_paths"]

CLONE_NEWNS = 0x00020000
_NS_GET_NSTYPE = 0xB703  # ioctl on an nsfs descriptor: the namespace's CLONE_NEW* type


@dataclass(frozen=True)
class Joined:
    """What :func:`join_mount_namespace` did: ``moved`` False when the process was already in
    the target namespace; ``pinned`` the kept descriptor of each import directory (empty
    when not moved); ``libraries`` how many of the tree's libraries it loaded first; ``cwd``
    its working directory now."""

    moved: bool
    pinned: dict[str, int] = field(default_factory=dict)
    libraries: int = 0
    cwd: str = "/"


def _ident(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _setns(fd: int, nstype: int) -> None:
    if hasattr(os, "setns"):  # Python >= 3.12
        os.setns(fd, nstype)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _preload_tree_libraries() -> int:
    """Load every library beside the dynamic loader this process runs through (the plugin
    tree's ``lib``); 0 when it runs through the system's loader (no ``--library-path``)."""
    import ctypes

    try:
        exe = os.readlink("/proc/self/exe")
    except OSError:
        return 0
    if not os.path.basename(exe).startswith("ld-linux"):
        return 0
    libdir = os.path.dirname(exe)
    loaded = 0
    for name in sorted(os.listdir(libdir)):
        path = os.path.join(libdir, name)
        if ".so" not in name or path == exe or not stat.S_ISREG(os.lstat(path).st_mode):
            continue
        ctypes.CDLL(path)
        loaded += 1
    return loaded


def reroot_paths(paths: list[str], pinned: dict[str, int]) -> list[str]:
    """``paths`` rewritten under the pinned directories: an entry at or below a key of
    ``pinned`` (the longest that fits) becomes ``/proc/self/fd/<its descriptor>`` and the
    rest of the entry; an entry below none (relative ones such as ``""``, the working
    directory, or a directory that did not exist) is left out."""
    out = []
    for path in paths:
        for top in sorted(pinned, key=len, reverse=True):
            if path == top or path.startswith(top.rstrip("/") + "/"):
                out.append(f"/proc/self/fd/{pinned[top]}{path[len(top.rstrip('/')) :]}")
                break
    return out


def _package_paths() -> list[list[str]]:
    """The ``__path__`` list of every imported package (a namespace package's recomputes
    itself from its parent's and is left alone)."""
    return [p for m in list(sys.modules.values()) if isinstance(p := getattr(m, "__path__", None), list)]


def _pin_import_dirs() -> dict[str, int]:
    """An ``O_PATH`` descriptor of each ``sys.path`` directory, and of each package directory
    outside them: path -> descriptor."""
    pinned: dict[str, int] = {}
    for path in [*sys.path, *(p for paths in _package_paths() for p in paths)]:
        if (
            not os.path.isabs(path)
            or path in pinned
            or reroot_paths([path], pinned)
            or not os.path.isdir(path)
        ):
            continue
        pinned[path] = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return pinned


def _reroot_imports(pinned: dict[str, int]) -> None:
    sys.path[:] = reroot_paths(sys.path, pinned)
    for paths in _package_paths():
        paths[:] = reroot_paths(paths, pinned)
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()


def join_mount_namespace(target: str) -> Joined:
    """Move this process into the mount namespace ``target`` names (an nsfs path such as
    ``/proc/1/ns/mnt``, or ``/proc/self/fd/N``), keeping its code its own (module docstring).

    Nothing happens when the process is already there. Raises ``OSError`` when it cannot
    move (``EINVAL``: more than one thread, or ``target`` is not a mount namespace;
    ``EPERM``/``EACCES``: missing capabilities, see the module docstring); the process is
    then unchanged except for libraries it loaded.
    """
    ns_fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
    try:
        import fcntl

        if fcntl.ioctl(ns_fd, _NS_GET_NSTYPE) != CLONE_NEWNS:
            raise OSError(22, f"{target} is not a mount namespace")
        st = os.fstat(ns_fd)
        cwd = os.getcwd()
        if (st.st_dev, st.st_ino) == _ident("/proc/self/ns/mnt"):
            return Joined(moved=False, cwd=cwd)
        threads = len(os.listdir("/proc/self/task"))
        if threads != 1:
            raise OSError(22, f"cannot join a mount namespace with {threads} threads running")
        libraries = _preload_tree_libraries()
        pinned = _pin_import_dirs()
        try:
            _setns(ns_fd, CLONE_NEWNS)
        except OSError:
            for fd in pinned.values():
                os.close(fd)
            raise
    finally:
        os.close(ns_fd)
    _reroot_imports(pinned)
    try:
        os.chdir(cwd)
    except OSError:
        cwd = os.getcwd()  # the namespace's root
    return Joined(moved=True, pinned=pinned, libraries=libraries, cwd=cwd)
