"""The ``cni-dra`` executable: the CNI plugin when ``CNI_COMMAND`` is set, else the operator CLI.

:func:`main` is the one place that decides between the two, for every way the executable
is started: the plugin tree's Python executable ``<tree>/libexec/cni-dra``
(``scripts/cni-dra-entry.py``, ``python -IS``: no ``site`` at start-up) that the compiled
client runs, and the ``cni-dra`` console script of the venv.

A plugin invocation (:func:`plugin`):

1. reads stdin whole (at most :data:`~cni_dra.fastpath.wire.STDIN_LIMIT_BYTES`; nothing
   for ``VERSION`` on a terminal);
2. asks the agent once (:func:`cni_dra.fastpath.client.ask_agent`), unless
   ``CNI_DRA_AGENT=off`` or the compiled client already asked (it then sets
   ``CNI_DRA_AGENT_ASKED``, see :mod:`cni_dra.fastpath.wire`, which is removed from the
   environment here before anything else sees it); when the agent answers, prints its
   answer and returns its exit code;
3. with ``CNI_DRA_AGENT=require``, fails with code 11 naming why the agent did not serve;
4. otherwise runs :func:`cni_dra.cni.main` in-process, after loading ``site`` (with the
   cyclic garbage collector off, :func:`_without_garbage_collection`, and pydantic's plugin
   discovery turned off, :func:`_without_pydantic_plugins`).

Importing this module costs nothing beyond ``os`` and ``sys``: everything else is imported
when needed. When the in-process plugin cannot be imported, :class:`CannotLoad` carries the
cause and the stdin read so far to the executable's script, the one place that answers a
runtime with the "failed to load cni-dra" error (code 999).
"""

from __future__ import annotations

import os
import sys

__all__ = ["CannotLoad", "main", "plugin", "read_stdin"]


class CannotLoad(Exception):
    """The in-process plugin cannot be imported (a broken install); ``__cause__`` says why.

    ``stdin``: the invocation's stdin, already read (its ``cniVersion`` shapes the error).
    """

    def __init__(self, stdin: bytes) -> None:
        super().__init__("failed to load cni-dra")
        self.stdin = stdin


def main() -> int:
    """Entry of the ``cni-dra`` executable; returns the exit code.

    Raises :class:`CannotLoad` when a plugin invocation must run in-process and cni-dra's
    plugin code cannot be imported. The CLI exits through click (``SystemExit``).
    """
    if os.environ.get("CNI_COMMAND"):
        return plugin()
    _load_site()
    from cni_dra.cli import cli

    cli()
    return 0


def read_stdin(command: str) -> bytes:
    """The invocation's stdin, at most :data:`~cni_dra.fastpath.wire.STDIN_LIMIT_BYTES`
    (a larger config is refused, code 6, without reading it all); nothing for ``VERSION``
    when stdin is a terminal (someone typing ``cni-dra`` by hand). Raises OSError."""
    from cni_dra.fastpath.wire import STDIN_LIMIT_BYTES

    if command == "VERSION" and os.isatty(0):
        return b""
    chunks, size = [], 0
    while size < STDIN_LIMIT_BYTES:
        chunk = os.read(0, min(1 << 16, STDIN_LIMIT_BYTES - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def plugin() -> int:
    """Serve one CNI invocation of this process (module docstring); returns the exit code.

    Raises :class:`CannotLoad` (see :func:`main`).
    """
    from cni_dra.fastpath import wire

    asked = os.environb.pop(os.fsencode(wire.ENV_ASKED), None)  # the compiled client asked already
    stdin = read_stdin(os.environ.get("CNI_COMMAND", ""))
    mode = os.environ.get(wire.ENV_MODE, "")
    path = os.environ.get(wire.ENV_SOCKET, "") or wire.DEFAULT_SOCKET
    if asked is None and mode != "off":
        from cni_dra.fastpath import client

        try:
            timeout_s = float(os.environ.get(wire.ENV_TIMEOUT, "") or wire.DEFAULT_TIMEOUT_S)
        except ValueError:
            timeout_s = wire.DEFAULT_TIMEOUT_S
        answer = client.ask_agent(dict(os.environb), stdin, path, timeout_s)
        if answer is not None:
            code, stdout = answer
            _write_fd(1, stdout)
            return code
        asked = os.fsencode(client.last_refusal)
    if mode == "require":
        return _agent_required_error(stdin, path, os.fsdecode(asked or b""))
    _without_garbage_collection()
    _load_site()
    _without_pydantic_plugins()
    try:
        from cni_dra.cni import main as cni_main
    except Exception as exc:  # a broken install: the executable's script answers (CannotLoad)
        raise CannotLoad(stdin) from exc
    return cni_main(stdin)


def _load_site() -> None:
    """Load ``site`` (third-party packages) when the interpreter started without it (``-S``)."""
    if "site" not in sys.modules:
        import site

        site.main()


def _without_garbage_collection() -> None:
    """Turn the cyclic garbage collector off for the rest of this one-invocation process.

    The in-process work is mostly imports: a few hundred modules and the classes, models and
    validators they make, none of it garbage, which the collector would walk again and again
    as they are made (≈ 3% of the instructions of an ADD). The few reference cycles an
    invocation leaves are freed with the process when it exits, a few hundred ms later; every
    resource cni-dra holds (the state lock, sockets, namespaces) is released explicitly, not
    by the collector. Only here: a long-lived process (the agent, the tests) keeps it.
    """
    import gc

    gc.disable()


def _without_pydantic_plugins() -> None:
    """Run pydantic without its plugins, as ``PYDANTIC_DISABLE_PLUGINS=__all__`` does, and
    without importing ``importlib.metadata`` (≈ 14 ms of CPU per in-process invocation).

    pydantic looks its plugins up (entry points of the installed distributions) through
    ``pydantic.plugin._loader.get_plugins`` when it builds a model's validator, and imports
    ``importlib.metadata`` (and ``email``, ``zipfile``, ``csv`` with it) to do so. cni-dra
    uses no pydantic plugin, so an in-process invocation gets a loader that has none.
    Nothing when pydantic is imported already (the agent, the tests).
    """
    name = "pydantic.plugin._loader"
    if "pydantic" in sys.modules or name in sys.modules:
        return
    import types

    loader = types.ModuleType(name, "pydantic plugins: none (cni_dra.main)")
    loader.get_plugins = tuple  # type: ignore[attr-defined]  # get_plugins() -> ()
    sys.modules[name] = loader


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _agent_required_error(stdin: bytes, path: str, why: str) -> int:
    """``CNI_DRA_AGENT=require`` and the agent did not serve: CNI error code 11, exit 1."""
    import json

    try:
        version = json.loads(stdin).get("cniVersion", "1.1.0")
    except Exception:  # noqa: BLE001 - any undecodable input
        version = "1.1.0"
    _write_fd(
        1,
        json.dumps(
            {
                "cniVersion": version,
                "code": 11,
                "msg": f"failed to reach cni-dra agent at {path}: {why or 'absent, declined or no answer'} "
                "(CNI_DRA_AGENT=require forbids running in-process)",
            }
        ).encode(),
    )
    return 1
