"""The kubelet gRPC modules are generated at build time (setup.py build_py runs protoc)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cni_dra.k8s.protos import PROTOS

ROOT = Path(__file__).resolve().parents[1]


def test_build_py_generates_every_proto_module(tmp_path):
    build = tmp_path / "lib"
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(build)],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    for name in PROTOS:
        for suffix in ("_pb2.py", "_pb2_grpc.py"):
            assert (build / "cni_dra/k8s/proto" / f"{name}{suffix}").is_file(), (name, suffix)
    # the generated modules are what load() returns from an installed package
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from cni_dra.k8s import protos;"
        "pb, svc = protos.load('dra_v1');"
        "print(pb.__file__.startswith(sys.argv[1]), hasattr(svc, 'DRAPluginServicer'))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(build)], capture_output=True, text=True, cwd="/")
    assert out.stdout.split() == ["True", "True"], out.stderr
