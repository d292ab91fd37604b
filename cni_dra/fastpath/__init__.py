"""The fast path: the plugin executable hands its invocation to the resident agent over a unix socket.

* :mod:`cni_dra.fastpath.wire` — the wire format and the client's environment, defined
  once; the compiled client (``scripts/cni-dra-client.c``, what ``/opt/cni/bin/cni-dra``
  is) repeats its constants and a test checks them against it.
* :mod:`cni_dra.fastpath.client` — the Python client (:func:`~cni_dra.fastpath.client.ask_agent`),
  standard library only; :func:`cni_dra.main.main` uses it when the Python executable is
  the plugin itself (no C compiler) and the compiled client has not already asked.
* :mod:`cni_dra.fastpath.server` — the agent side (:func:`start_fastpath`), run by
  ``cni-dra agent`` as one of its services (:mod:`cni_dra.agent.fastpath`): warm imports,
  a few worker threads running :func:`cni_dra.cni.run` (network namespace switches are per
  thread; the state file lock serialises agent threads with in-process invocations).
* :mod:`cni_dra.fastpath.activation` — the listening socket: bound by the agent, or taken
  from systemd (socket activation, ``conf/systemd/cni-dra-agent.socket``).

When the agent does not serve, the invocation runs in-process (:func:`cni_dra.main.plugin`),
the same :func:`cni_dra.cni.run` on the same input.

This package ``__init__`` imports nothing: the client must stay cheap.
"""

__all__: list[str] = []
