"""Fault injection for crash-safety tests: kill this process with SIGKILL at a named step.

A fault point fires only when both are true:

* the environment variable :data:`FAULT_ENV` (``CNI_DRA_FAULT``) lists its name
  (comma-separated), and
* the test switch :data:`SWITCH_FILE` exists as a regular file owned by root (or by the
  user running the plugin), not a symlink. Only the node's root can create it; a runtime or
  a pod that controls the plugin's environment alone cannot make a plugin kill itself.

Named points (ADD, DEL, state writes): see :data:`FAULT_POINTS`. Stdlib only; costs one
dictionary lookup when ``CNI_DRA_FAULT`` is unset.
"""

from __future__ import annotations

import os
import signal
import stat

__all__ = ["FAULT_ENV", "SWITCH_FILE", "FAULT_POINTS", "fault_point", "switch_on"]

FAULT_ENV = "CNI_DRA_FAULT"
SWITCH_FILE = "/run/cni-dra/test-faults-enabled"

FAULT_POINTS: tuple[str, ...] = (
    "add:reserved",  # attachment recorded as "adding" (capacity charged, IPAM step), nothing else done
    "add:link-temp",  # link made in the pod netns under its temporary name (cdra...), not renamed yet
    "add:link-renamed",  # link renamed to CNI_IFNAME and up; neighbour notification not set, not shaped
    "add:link-created",  # link exists in the pod netns, IPAM may be running
    "add:shaped",  # traffic control (and the ifb device) installed on the link, IPAM may be running
    "add:ipam-done",  # IPAM ADD returned, addresses not configured yet
    "add:ready",  # attachment "ready" with its result, result not printed yet
    "del:intent",  # attachment marked "deleting", nothing removed yet
    "del:link-deleted",  # link gone, IPAM still reserved
    "del:ipam-released",  # IPAM released, attachment still in state
    "state:tmp-written",  # new state not committed yet: a temp snapshot not renamed, or half a journal record
    "state:renamed",  # new state committed, not yet synced: snapshot renamed (dir not fsync'ed), or record whole
)
"""Every fault point, in the order an ADD then a DEL passes them."""


def switch_on() -> bool:
    """Whether the test switch :data:`SWITCH_FILE` is on (a regular file owned by root or by us)."""
    try:
        st = os.lstat(SWITCH_FILE)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid in (0, os.geteuid())


def fault_point(name: str) -> None:
    """Kill this process with SIGKILL here if fault ``name`` is armed (see module docstring)."""
    wanted = os.environ.get(FAULT_ENV)
    if not wanted or name not in wanted.split(","):
        return
    if switch_on():
        os.kill(os.getpid(), signal.SIGKILL)
