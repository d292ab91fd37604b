"""The node agent (``cni-dra agent``): ResourceSlice publisher, DRA kubelet plugin, claim
status writer and metrics, run by one DaemonSet pod per node. See :mod:`cni_dra.agent.service`.

Talks to the API server only through :mod:`cni_dra.k8s` and to the node state only
through :mod:`cni_dra.state`.
"""

__all__: list[str] = []
