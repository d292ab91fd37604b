"""An ordered mapping whose copy costs what was changed since its base, not its size.

The state's index of attachments (:class:`cni_dra.state.schema.Attachments`) is copied by
every transaction that changes it (copy on write: the state other threads read is never
changed). A ``dict`` copy is O(entries): at 10,000 attachments it was the largest part of a
transaction that grows with the node (about 0.4 ms per copy, several per ADD+DEL).

A :class:`CowMap` is a base ``dict`` that no one changes once it is a base, shared by every
copy, plus what changed since: the base keys replaced in place, the base keys removed, and
the keys added after the base (in their order). A copy copies those three, which stay small:
when they grow past an eighth of the base (at least :data:`FOLD_MIN` entries) the next copy
folds them into a new base (O(entries) once per that many changes, so O(1) amortised;
the map copied is folded, so the copies made from it after share the new base).

It keeps ``dict``'s order exactly: a replaced key keeps its place, a new key goes last, a
removed key put again goes last.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

__all__ = ["CowMap", "FOLD_MIN"]

_K = TypeVar("_K")
_V = TypeVar("_V")

FOLD_MIN = 64
"""Changes a :class:`CowMap` holds apart from its base before a copy folds them in, at least."""


class CowMap(Generic[_K, _V]):
    """An ordered mapping (module docstring); its values are never None. A map that other
    threads may read is never changed (the state's rule) but may be folded by a copy: the
    fold replaces its parts with equal ones in one assignment, and every reader reads the
    parts once, so a reader sees them all before or all after."""

    __slots__ = ("_parts",)

    def __init__(self, items: Iterable[tuple[_K, _V]] = ()) -> None:
        # (base, never changed once made; base keys replaced in place; base keys removed;
        # keys after the base's, in their order)
        self._parts: tuple[dict[_K, _V], dict[_K, _V], set[_K], dict[_K, _V]] = (dict(items), {}, set(), {})

    def copy(self) -> CowMap[_K, _V]:
        """A map equal to this one, changed independently of it: O(changes since the base).
        Folds this map's changes into a new base first when they are many (module docstring)."""
        if self.changes() > max(FOLD_MIN, len(self._parts[0]) >> 3):
            self._parts = (dict(self.items()), {}, set(), {})
        base, repl, gone, added = self._parts
        new: CowMap[_K, _V] = CowMap.__new__(CowMap)
        new._parts = (base, dict(repl), set(gone), dict(added))
        return new

    def changes(self) -> int:
        """How many entries this map holds apart from its base (what a copy copies)."""
        _base, repl, gone, added = self._parts
        return len(repl) + len(gone) + len(added)

    def get(self, key: _K, default: _V | None = None) -> _V | None:
        base, repl, gone, added = self._parts
        got = added.get(key)
        if got is not None:
            return got
        if key in gone:
            return default
        got = repl.get(key)
        if got is not None:
            return got
        return base.get(key, default)

    def __contains__(self, key: object) -> bool:
        base, _repl, gone, added = self._parts
        return key in added or (key in base and key not in gone)

    def __getitem__(self, key: _K) -> _V:
        got = self.get(key)
        if got is None:
            raise KeyError(key)
        return got

    def __len__(self) -> int:
        base, _repl, gone, added = self._parts
        return len(base) - len(gone) + len(added)

    def items(self) -> Iterator[tuple[_K, _V]]:
        """(key, value) in order."""
        base, repl, gone, added = self._parts
        if not repl and not gone:
            yield from base.items()
        else:
            for k, v in base.items():
                if k not in gone:
                    yield k, repl.get(k, v)
        yield from added.items()

    def values(self) -> Iterator[_V]:
        """The values in order."""
        for _k, v in self.items():
            yield v

    def __iter__(self) -> Iterator[_K]:
        for k, _v in self.items():
            yield k

    def set(self, key: _K, value: _V) -> None:
        """``map[key] = value`` as a ``dict`` orders it: in place if present, else last."""
        base, repl, gone, added = self._parts
        if key in added or key not in base or key in gone:
            added[key] = value
        else:
            repl[key] = value

    def pop(self, key: _K) -> _V | None:
        """Remove ``key``; returns its value, or None when absent."""
        base, repl, gone, added = self._parts
        if key in added:
            return added.pop(key)
        if key in base and key not in gone:
            gone.add(key)
            old = repl.pop(key, None)
            return base[key] if old is None else old
        return None
