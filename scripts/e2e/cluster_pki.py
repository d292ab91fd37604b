"""Certificates (openssl) and kubeconfigs for scripts/e2e/cluster.py: one CA signs the API
server's serving certificate, every client's certificate and each kubelet's serving
certificate. Kubeconfigs carry their credentials inline, so that one file works from the
host and from inside a node's mount namespace alike."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from cluster_procs import p, run


def pki() -> Path:
    return p("pki")


def cert(
    name: str, subj: str, *, ca: bool = False, sans: list[str] | None = None, server: bool = False
) -> None:
    """``pki/<name>.key`` and ``.crt`` (signed by pki/ca unless ``ca``)."""
    d = pki()
    d.mkdir(parents=True, exist_ok=True)
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    run("openssl", "genrsa", "-out", str(key), "2048")
    if ca:
        run(
            "openssl",
            "req",
            "-x509",
            "-new",
            "-key",
            str(key),
            "-subj",
            subj,
            "-days",
            "3",
            "-out",
            str(crt),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        )
        return
    csr = d / f"{name}.csr"
    run("openssl", "req", "-new", "-key", str(key), "-subj", subj, "-out", str(csr))
    ext = d / f"{name}.ext"
    lines = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={'serverAuth,clientAuth' if server else 'clientAuth'}",
    ]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    run(
        "openssl",
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(d / "ca.crt"),
        "-CAkey",
        str(d / "ca.key"),
        "-CAcreateserial",
        "-days",
        "3",
        "-extfile",
        str(ext),
        "-out",
        str(crt),
    )


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig(
    path: Path, server: str, *, user: str, cert_name: str | None = None, token: str | None = None
) -> None:
    """A kubeconfig for ``server`` authenticating with pki/<cert_name> or ``token``."""
    creds = (
        {"token": token}
        if token
        else {
            "client-certificate-data": _b64(pki() / f"{cert_name}.crt"),
            "client-key-data": _b64(pki() / f"{cert_name}.key"),
        }
    )
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "e2e",
                "cluster": {"server": server, "certificate-authority-data": _b64(pki() / "ca.crt")},
            }
        ],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=1))
    path.chmod(0o600)
