"""The agent's fast-path service: plugin invocations served from the agent's warm imports.

``cni-dra agent`` always runs it (:class:`cni_dra.agent.service.Agent`): it listens on the
socket the plugin's clients look for (``--fastpath-socket``, ``CNI_DRA_AGENT_SOCKET``,
default ``/run/cni-dra/agent.sock``) with one accepting process per CPU
(:data:`cni_dra.fastpath.server.DEFAULT_PROCESSES`). The server itself, and the wire format
it speaks, are :mod:`cni_dra.fastpath`. The processes that serve must be in the node's mount
and network namespaces with working directory ``/``, else requests are declined and the
plugin works in-process (correct, slower). An agent in a container (the DaemonSet: the
node's network and PID namespaces, a mount namespace of its own) names the node's mount
namespace in ``--fastpath-mount-ns`` (``/proc/1/ns/mnt``); its worker processes join it
and serve, and the agent process itself serves nothing
(:mod:`cni_dra.fastpath.join`).

Started by systemd (``conf/systemd/cni-dra-agent.socket``), the agent serves on the socket
systemd passed (:mod:`cni_dra.fastpath.activation`) instead of binding its own; the socket
outlives the agent, and the next plugin invocation starts it again.
"""

from __future__ import annotations

import logging

from cni_dra.fastpath.activation import take_listener
from cni_dra.fastpath.server import DEFAULT_PROCESSES, FastpathServer, start_fastpath

__all__ = ["FastpathService"]

log = logging.getLogger("cni_dra.agent.fastpath")


class FastpathService:
    """The fast-path listener as a service of the agent (``start()``/``stop()``).

    ``socket_path``: where it listens; ``processes``: processes accepting on it (None: one
    per CPU, at most 4); ``mount_ns``: the mount namespace they join first (module docstring).
    """

    def __init__(
        self, socket_path: str, *, processes: int | None = None, mount_ns: str | None = None
    ) -> None:
        self.socket_path = socket_path
        self.processes = DEFAULT_PROCESSES if processes is None else processes
        self.mount_ns = mount_ns or None
        self._server: FastpathServer | None = None

    def start(self) -> None:
        """Listen (or take the socket systemd passed) and serve. Raises OSError (or
        PermissionError for an unsafe directory or socket file), ValueError for a malformed
        socket-activation environment."""
        listener = take_listener(self.socket_path)
        if listener is not None:
            log.info("fastpath: serving on the socket systemd passed, %s", self.socket_path)
        self._server = start_fastpath(
            self.socket_path, processes=self.processes, join_mount_ns=self.mount_ns, listener=listener
        )

    def stop(self) -> None:
        """Stop serving and remove the socket file (in-flight requests finish)."""
        if self._server is not None:
            self._server.stop()
            self._server = None
