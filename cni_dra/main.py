"""The ``cni-dra`` executable: a CNI plugin when CNI_COMMAND is set, else the operator CLI."""

from __future__ import annotations

import os
import sys

__all__ = ["main"]


def main() -> None:
    """Dispatch on CNI_COMMAND: plugin (no click, no kubernetes imported) or click CLI."""
    if os.environ.get("CNI_COMMAND"):
        from cni_dra.cni import main as cni_main

        sys.exit(cni_main())
    from cni_dra.cli import cli

    cli()
