"""Read-only JSON values: what the state hands out cannot be changed behind the journal's back.

The state is changed only by a transaction's explicit operations
(:class:`cni_dra.state.txn.Txn`); every value it holds is read-only, so a change made in
place (``claim["status"]["x"] = 1``, ``records.append(r)``) raises :class:`TypeError`
instead of reaching the process's cached state but not the files.

:class:`FrozenDict` and :class:`FrozenList` are ``dict`` and ``list`` subclasses whose
mutators raise: they compare equal to, serialise like (``json``, pydantic) and read like
plain ones. :func:`deep_freeze` makes a JSON value read-only all the way down; a deep copy
(:func:`copy.deepcopy`) or :func:`thaw` gives back plain, mutable ``dict``/``list`` values.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn, TypeVar

__all__ = ["FrozenDict", "FrozenList", "deep_freeze", "empty_frozen_list", "frozen_list", "thaw"]

_T = TypeVar("_T")
_K = TypeVar("_K")
_V = TypeVar("_V")


def _refuse(obj: object, *_args: object, **_kwargs: object) -> NoReturn:
    raise TypeError(
        f"the state's {type(obj).__name__} is read-only: change the state through a transaction's "
        "operations (cni_dra.state.txn.Txn)"
    )


class FrozenDict(dict[_K, _V]):
    """A ``dict`` whose mutators raise TypeError (module docstring)."""

    __slots__ = ()
    __setitem__ = __delitem__ = _refuse
    pop = popitem = setdefault = update = clear = _refuse
    __ior__ = _refuse

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[_K, _V]:
        return thaw(self)  # type: ignore[no-any-return]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))


class FrozenList(list[_T]):
    """A ``list`` whose mutators raise TypeError (module docstring)."""

    __slots__ = ()
    __setitem__ = __delitem__ = _refuse
    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __iadd__ = __imul__ = _refuse

    def __deepcopy__(self, memo: dict[int, Any]) -> list[_T]:
        return thaw(self)  # type: ignore[no-any-return]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))


def empty_frozen_list() -> FrozenList[Any]:
    """A new empty read-only list: a pydantic field's ``default_factory`` (``FrozenList``
    itself would have pydantic parse ``list``'s text signature, see :mod:`cni_dra.fields`)."""
    return FrozenList()


def deep_freeze(value: Any) -> Any:
    """``value`` (a JSON value) with every dict and list replaced by a read-only one."""
    t = type(value)
    if t is FrozenDict or t is FrozenList:  # made here: frozen all the way down
        return value
    if isinstance(value, dict):
        return FrozenDict({k: v if type(v) in _SCALARS else deep_freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return FrozenList([v if type(v) in _SCALARS else deep_freeze(v) for v in value])
    return value


_SCALARS = frozenset({str, int, float, bool, type(None)})


def frozen_list(items: Iterable[Any]) -> FrozenList[Any]:
    """A read-only list of the read-only form of each of ``items``."""
    return FrozenList(deep_freeze(v) for v in items)


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy of a JSON value (read-only or not)."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    return value
