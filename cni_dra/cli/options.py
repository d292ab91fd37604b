"""Options shared by the CLI's commands, defined once.

Each has its environment twin. ``--state-dir`` is every command's name for the node
state directory; ``allocate`` also still accepts ``--state`` (hidden, deprecated: its
name before the commands agreed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from cni_dra.protocol.config import DEFAULT_INVENTORY, DEFAULT_STATE_DIR

__all__ = ["CONFLIST_OPT", "INVENTORY_OPT", "STATE_DIR_HELP", "STATE_DIR_OPT", "state_dir_option"]

F = TypeVar("F", bound=Callable[..., Any])

STATE_DIR_HELP = "Directory of the node state (the plugin config's stateDir)."
_ALIAS_KEY = "cni_dra.state_dir_alias"


def _remember_alias(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta[_ALIAS_KEY] = (param.opts[0], value)


def _resolve_alias(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    alias: tuple[str, str] | None = ctx.meta.get(_ALIAS_KEY)
    if alias is None:
        return value
    name, alias_value = alias
    if ctx.get_parameter_source(param.name or "") is ParameterSource.COMMANDLINE and value != alias_value:
        raise click.UsageError(f"{param.opts[0]} and {name} name the same directory: give one of them")
    return alias_value  # the command line beats CNI_DRA_STATE_DIR and the default


def state_dir_option(
    *,
    default: str | None = DEFAULT_STATE_DIR,
    help: str = STATE_DIR_HELP,  # noqa: A002 - click.option's name for it
    deprecated_alias: str | None = None,
) -> Callable[[F], F]:
    """``--state-dir`` (env ``CNI_DRA_STATE_DIR``) as the parameter ``state_dir``.

    ``deprecated_alias`` (e.g. ``"--state"``) adds a hidden option that sets the same
    parameter and says it is deprecated when used; giving both with different values is
    a usage error (exit 2).
    """
    main = click.option(
        "--state-dir",
        "state_dir",
        envvar="CNI_DRA_STATE_DIR",
        default=default,
        show_default=default is not None,
        help=help,
        callback=_resolve_alias if deprecated_alias else None,
    )
    if deprecated_alias is None:
        return main
    # Eager, so it is read before --state-dir whatever the order on the command line.
    alias = click.option(
        deprecated_alias,
        default=None,
        hidden=True,
        expose_value=False,
        is_eager=True,
        deprecated="Use --state-dir.",
        callback=_remember_alias,
    )

    def decorate(f: F) -> F:
        return main(alias(f))

    return decorate


STATE_DIR_OPT = state_dir_option()
INVENTORY_OPT = click.option(
    "--inventory",
    envvar="CNI_DRA_INVENTORY",
    default=DEFAULT_INVENTORY,
    show_default=True,
    help="The node's ResourceSlice file (the plugin config's inventory).",
)
CONFLIST_OPT = click.option(
    "--conflist",
    "conflists",
    multiple=True,
    envvar="CNI_DRA_CONFLIST",
    type=click.Path(dir_okay=False),
    help="A conflist whose cni-dra entries' 'profiles' limit the device profiles claims may ask "
    "(repeatable; the strictest wins; none: the defaults). CNI_DRA_CONFLIST: paths separated by spaces.",
)
