"""The CNI entry point: a function of (environment, stdin bytes, stdout), as pkg/skel does it.

Source: CNI spec 1.1.0 "Section 2: Execution Protocol" and "Section 5: Result Types / Error".
It reads CNI_COMMAND and friends, gates the spec version before any handler, runs the
verb and prints the result in the config's ``cniVersion``. Every :class:`CniError` becomes
the error JSON on stdout and exit code 1; any other exception is a bug, reported as code 999.
Logs go to stderr (level ``CNI_DRA_LOG_LEVEL``, default WARNING) or to ``CNI_DRA_LOG_FILE``;
never to stdout. Imports neither click nor kubernetes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING, TextIO

from cni_dra.errors import CniError

if TYPE_CHECKING:
    from cni_dra.attach.invocation import Invocation
    from cni_dra.host.port import Host

__all__ = ["run", "main"]

log = logging.getLogger("cni_dra")


def _setup_logging(environ: Mapping[str, str]) -> None:
    if log.handlers:
        return
    path = environ.get("CNI_DRA_LOG_FILE")
    handler: logging.Handler = logging.FileHandler(path) if path else logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s cni-dra[%(process)d] %(levelname)s %(name)s: %(message)s")
    )
    log.addHandler(handler)
    log.setLevel(environ.get("CNI_DRA_LOG_LEVEL", "WARNING").upper())
    log.propagate = False


def run(environ: Mapping[str, str], stdin: bytes, stdout: TextIO, host: Host | None = None) -> int:
    """Serve one plugin invocation. Returns the process exit code (0 success, 1 error).

    ``host``: the machine the verb works on (:class:`cni_dra.host.port.Host`); None: the
    kernel's, made here for this invocation (:class:`cni_dra.host.kernel.KernelHost`, which
    opens CNI_NETNS once) and closed when the verb ends."""
    from cni_dra.protocol.config import load_conf, peek_cni_version
    from cni_dra.protocol.env import parse_env
    from cni_dra.protocol.versions import require_verb_version, version_request, version_result

    version = peek_cni_version(stdin)
    try:
        env = parse_env(environ)
        if env.command == "VERSION":
            json.dump(version_result(version_request(stdin)), stdout)
            return 0
        conf = load_conf(stdin, env)
        version = conf.cniVersion
        require_verb_version(env.command, version)
        from cni_dra.attach.invocation import Invocation

        with ExitStack() as scope:
            if host is None:
                from cni_dra.host.kernel import KernelHost

                host = scope.enter_context(KernelHost(env.netns))
            _serve(Invocation(env=env, conf=conf, raw=stdin, environ=dict(environ), port=host), stdout)
        return 0
    except CniError as exc:
        log.error("%s: %s%s", type(exc).__name__, exc.msg, f" ({exc.details})" if exc.details else "")
        json.dump(exc.to_dict(version), stdout)
        return 1
    except Exception as exc:  # the one boundary that turns bugs into code 999
        log.exception("internal error")
        json.dump(
            {"cniVersion": version, "code": 999, "msg": f"internal error: {type(exc).__name__}: {exc}"},
            stdout,
        )
        return 1


def main(stdin: bytes) -> int:
    """Process entry: :func:`run` on the real environment and stdout, with ``stdin`` as read
    by the executable (:func:`cni_dra.main.read_stdin`); returns the exit code."""
    _setup_logging(os.environ)
    code = run(os.environ, stdin, sys.stdout)
    sys.stdout.flush()
    return code


def _serve(inv: Invocation, stdout: TextIO) -> None:
    """Run the verb CNI_COMMAND names (VERSION is answered before any config)."""
    if inv.env.command == "ADD":
        from cni_dra.protocol.results import result_to_dict
        from cni_dra.verbs.add import cmd_add

        json.dump(result_to_dict(cmd_add(inv), inv.conf.cniVersion), stdout)
    elif inv.env.command == "DEL":
        from cni_dra.verbs.delete import cmd_del

        cmd_del(inv)
    elif inv.env.command == "CHECK":
        from cni_dra.verbs.check import cmd_check

        cmd_check(inv)
    elif inv.env.command == "STATUS":
        from cni_dra.verbs.status import cmd_status

        cmd_status(inv)
    elif inv.env.command == "GC":
        from cni_dra.verbs.gc import cmd_gc

        cmd_gc(inv)
