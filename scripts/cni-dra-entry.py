# cni-dra: CNI plugin (when CNI_COMMAND is set) and operator CLI (otherwise), both decided
# by cni_dra.main:main. Installed as <tree>/libexec/cni-dra (the file name is the CLI's
# program name) in the plugin tree (README "Install layout"), whose packages are in
# <tree>/lib/python3/dist-packages. /opt/cni/bin/cni-dra is the compiled client
# (scripts/cni-dra-client.c): it relays the agent's answer, and otherwise runs
#   <tree>/lib/ld-linux-x86-64.so.2 --library-path <tree>/lib <tree>/bin/python3 -IS <this file> ARGS...
# with the same environment and stdin, plus CNI_DRA_AGENT_ASKED when it already asked the
# agent (this script then works in-process at once).
# -I (isolated): ignore PYTHON* variables and the user site, and keep this script's
# directory off sys.path, so a runtime's environment cannot change which code runs.
# -S: no site at start-up; cni_dra.main loads it only when the work is done in-process.
# No bytecode is written: the tree ships its own (.pyc, unchecked hashes) and stays as built.
#
# This is the one place that answers a runtime when cni-dra cannot be loaded (a broken
# install): CNI error JSON, code 999, on stdout, exit 1. It is the only code certain to
# run then; the compiled client says only that it could not run this script at all.
import os
import sys

sys.dont_write_bytecode = True
SITE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib", "python3", "dist-packages"
)
sys.path.append(SITE)


def cannot_load(exc, stdin):
    import json

    try:
        version = json.loads(stdin).get("cniVersion", "1.1.0")
    except Exception:  # noqa: BLE001 - any undecodable input: answer in the newest version
        version = "1.1.0"
    print(
        json.dumps(
            {
                "cniVersion": version,
                "code": 999,
                "msg": "failed to load cni-dra from " + SITE + ": " + type(exc).__name__,
                "details": str(exc),
            }
        )
    )
    sys.exit(1)


try:
    from cni_dra.main import CannotLoad, main
except Exception as exc:
    if not os.environ.get("CNI_COMMAND"):  # the operator CLI: the traceback says it
        raise
    cannot_load(exc, sys.stdin.buffer.read((1 << 20) + 1))
try:
    code = main()
except CannotLoad as exc:
    cannot_load(exc.__cause__, exc.stdin)
sys.exit(code)
