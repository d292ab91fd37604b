"""The kubelet's gRPC APIs, from the ``.proto`` files in ``cni_dra/k8s/proto/`` (written
from the published APIs; no generated code is committed).

An installed cni-dra carries modules generated at build time (``setup.py`` runs
grpcio-tools' protoc in ``build_py``: ``cni_dra/k8s/proto/<name>_pb2.py`` and
``<name>_pb2_grpc.py``). A source tree without them (unit tests run from a checkout)
compiles the same files in memory with ``grpc.protos_and_services`` on first use.
Both the agent (servers) and the tests (client stubs, as the kubelet uses them) load the
same modules through :func:`load`.

Protos: ``pluginregistration_v1`` (plugin registration API v1), ``dra_v1`` and
``dra_v1beta1`` (DRA kubelet plugin API, KEP-4381), ``dra_health_v1`` and
``dra_health_v1alpha1`` (DRA resource health, KEP-4680: the ``DRAResourceHealth`` service),
``health_v1`` (grpc.health.v1).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["PROTOS", "load", "DRA_SERVICES", "RESOURCE_HEALTH_SERVICES"]

PROTOS = (
    "pluginregistration_v1",
    "dra_v1",
    "dra_v1beta1",
    "dra_health_v1",
    "dra_health_v1alpha1",
    "health_v1",
)
# What the registration's supported_versions announces for each DRA proto (the kubelet's
# service names, "<proto package>.<service>"), newest first.
DRA_SERVICES = {"dra_v1": "v1.DRAPlugin", "dra_v1beta1": "v1beta1.DRAPlugin"}
# The same for the optional resource health service: a 1.37 kubelet watches the first of
# these it finds in supported_versions (v1 before v1alpha1) and none when none is listed.
RESOURCE_HEALTH_SERVICES = {
    "dra_health_v1": "v1.DRAResourceHealth",
    "dra_health_v1alpha1": "v1alpha1.DRAResourceHealth",
}

_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the cni_dra package


@functools.cache
def load(name: str) -> tuple[ModuleType, ModuleType]:
    """(messages module, services module) for proto ``name`` (one of :data:`PROTOS`).

    Raises KeyError for an unknown name; ImportError when grpcio-tools is missing.
    """
    if name not in PROTOS:
        raise KeyError(name)
    import importlib

    try:
        return (
            importlib.import_module(f"cni_dra.k8s.proto.{name}_pb2"),
            importlib.import_module(f"cni_dra.k8s.proto.{name}_pb2_grpc"),
        )
    except ImportError:
        pass  # a source checkout: compile in memory
    import grpc

    if str(_ROOT) not in sys.path:  # the proto path is resolved against sys.path
        sys.path.append(str(_ROOT))
    modules: tuple[ModuleType, ModuleType] = grpc.protos_and_services(f"cni_dra/k8s/proto/{name}.proto")
    return modules
