"""The kubelet gRPC modules are generated at build time (setup.py build_py runs protoc)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from cni_dra.k8s.protos import PROTOS

ROOT = Path(__file__).resolve().parents[1]


def test_build_py_generates_every_proto_module(tmp_path):
    # Built from a copy: setuptools writes cni_dra.egg-info beside setup.py, and tests write
    # only under temporary directories.
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "cni_dra", src / "cni_dra", ignore=shutil.ignore_patterns("__pycache__", "*_pb2*.py")
    )
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    build = tmp_path / "lib"
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(build)],
        cwd=src,
        capture_output=True,
        text=True,
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
