"""The fast path: a thin plugin executable talking to a resident agent over a unix socket.

* :mod:`cni_dra.fastpath.client` — what ``/opt/cni/bin/cni-dra`` runs first. Standard
  library only (it loads in a few milliseconds): it sends the invocation (environment and
  stdin) to the agent and prints the agent's answer; when the agent is absent, refuses or
  does not answer, it runs the very same :func:`cni_dra.cni.run` in-process.
* :mod:`cni_dra.fastpath.server` — the agent side (:func:`start_fastpath`), hosted by
  ``cni-dra agent``: warm imports, a few worker threads running
  :func:`cni_dra.cni.run` (network namespace switches are per thread; the state file lock
  serialises agent threads with in-process invocations).

This package ``__init__`` imports nothing: the client must stay cheap.
"""

__all__: list[str] = []
