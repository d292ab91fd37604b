"""Build step: compile the kubelet gRPC ``.proto`` files (cni_dra/k8s/proto/) into Python
modules at build time with grpcio-tools' protoc, next to the protos in the built package.

Everything else about the package is declared in pyproject.toml.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROTO_DIR = Path("cni_dra/k8s/proto")


class BuildPyWithProtos(build_py):
    """``build_py`` that also writes ``<name>_pb2.py`` and ``<name>_pb2_grpc.py`` per proto."""

    def run(self) -> None:
        super().run()
        from grpc_tools import protoc  # build requirement (also a runtime dependency)

        out = Path(self.build_lib)
        for proto in sorted(PROTO_DIR.glob("*.proto")):
            args = ["protoc", "-I.", f"--python_out={out}", f"--grpc_python_out={out}", str(proto)]
            if protoc.main(args) != 0:
                raise RuntimeError(f"protoc failed for {proto}")


setup(cmdclass={"build_py": BuildPyWithProtos})
