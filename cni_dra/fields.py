"""Default factories shared by the pydantic models' fields.

pydantic asks :func:`inspect.signature` of every ``default_factory`` when it builds a
model's schema (does the factory take the validated data?). For the builtin ``list`` and
its subclasses that parses their text signature, ``(iterable=(), /)``, with
:mod:`tokenize`, whose first use compiles a large regular expression: a cost paid by every
process that builds such a model, an in-process invocation among them (docs/performance.md,
"Without the agent"). A Python function's signature is read from its code object, so list
fields take :func:`empty_list` instead of ``list``. ``dict`` has no text signature (its
signature is refused at once): ``default_factory=dict`` costs nothing to keep.
"""

from __future__ import annotations

from typing import Any

__all__ = ["empty_list"]


def empty_list() -> list[Any]:
    """A new empty list, one per instance: ``Field(default_factory=empty_list)``."""
    return []
