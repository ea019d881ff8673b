"""A read-only mapping whose updates return a new mapping.

Projections keep their state frozen: applying an event returns new state and
leaves the old state as it was. Copying a dict on every event makes a fold
quadratic in the size of that dict; :meth:`PersistentMap.set` costs O(1),
amortised, however large the map grows.

A small map is a private dict, copied on every update: below a hundred or
so entries one C-level copy is cheaper than any bookkeeping done in Python.
Past :data:`_COPY_LIMIT` entries a map switches to a shared journal: every
version made from another by :meth:`~PersistentMap.set` shares one
append-only journal of writes, and a version is a prefix of it, reading a
key's latest write inside its prefix. Setting on the newest version appends
to the journal. Setting on an older version (a branch, as when a fold
resumes from a saved state) first copies that version's contents into a
fresh journal, once; so does the newest version when the journal has grown
to several times the number of keys, which bounds the memory that
superseded writes hold.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar, overload

__all__ = ["PersistentMap"]

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")

#: Maps with fewer entries are copied on update.
_COPY_LIMIT = 128
#: A journal is rewritten when it holds more writes than this many times its
#: keys.
_REWRITE_FACTOR = 4


class _Journal(Generic[K, V]):
    """The writes shared by a family of versions, in order; only ever
    appended to. Readers need no lock: a version reads only below its own
    length, and a write is appended to every list before ``latest`` points
    at it."""

    __slots__ = ("latest", "order", "previous", "tickets", "values")

    def __init__(self, contents: dict[K, V]) -> None:
        self.values: list[V] = list(contents.values())
        #: For each write, the index of the same key's previous write, or -1.
        self.previous: list[int] = [-1] * len(contents)
        #: Each key's latest write.
        self.latest: dict[K, int] = dict(zip(contents, range(len(contents)), strict=True))
        #: The keys, by first write.
        self.order: list[K] = list(contents)
        #: Hands out the right to write number n: whoever draws ticket n from
        #: a journal of n writes appends; anyone else copies. ``next`` on a
        #: counter is atomic, so two threads extending the same version
        #: cannot both append.
        self.tickets = itertools.count(len(contents))


class PersistentMap(Mapping[K, V]):
    """An immutable mapping; :meth:`set` returns an updated copy in O(1)
    amortised time and leaves this one as it is.

    Iteration follows first insertion, like a dict's. Equal to any mapping
    with the same items.
    """

    __slots__ = ("_items", "_journal", "_length", "_size")

    #: A small map's entries (a dict no one changes), or ``None``.
    _items: dict[K, V] | None
    #: A large map's journal, or ``None``.
    _journal: _Journal[K, V] | None
    #: How many writes of the journal this version sees.
    _length: int
    #: How many keys it holds.
    _size: int

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        """A map of ``items`` (a mapping or ``(key, value)`` pairs)."""
        contents = dict(items)
        self._size = len(contents)
        if len(contents) < _COPY_LIMIT:
            self._items, self._journal, self._length = contents, None, 0
        else:
            self._items, self._journal, self._length = None, _Journal(contents), len(contents)

    def set(self, key: K, value: V) -> PersistentMap[K, V]:
        """This map with ``key`` mapped to ``value`` (a key already present
        keeps its place in the iteration order)."""
        items = self._items
        updated: PersistentMap[K, V] = object.__new__(PersistentMap)
        if items is not None and len(items) < _COPY_LIMIT:
            copy = items.copy()
            copy[key] = value
            updated._items, updated._journal, updated._length = copy, None, 0
            updated._size = len(copy)
            return updated
        journal, length, size = self._journal, self._length, self._size
        if (
            journal is None  # a small map growing past the limit
            or len(journal.values) != length  # not the newest version
            or length > _REWRITE_FACTOR * size  # mostly superseded writes
            or next(journal.tickets) != length  # lost a race for this write
        ):
            journal = _Journal(dict(self.items()))
            length = len(journal.values)
            next(journal.tickets)
        previous = journal.latest.get(key, -1)
        journal.values.append(value)
        journal.previous.append(previous)
        if previous < 0:
            journal.order.append(key)
            size += 1
        journal.latest[key] = length
        updated._items, updated._journal = None, journal
        updated._length, updated._size = length + 1, size
        return updated

    def __getitem__(self, key: K) -> V:
        items = self._items
        if items is not None:
            return items[key]
        index = self._index(key)
        if index < 0:
            raise KeyError(key)
        return self._journal.values[index]  # type: ignore[union-attr]

    @overload
    def get(self, key: K, /) -> V | None: ...

    @overload
    def get(self, key: K, default: V | D, /) -> V | D: ...

    def get(self, key: K, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        items = self._items
        if items is not None:
            return items.get(key, default)
        index = self._index(key)
        return default if index < 0 else self._journal.values[index]  # type: ignore[union-attr]

    def _index(self, key: K) -> int:
        """Where this version's value of ``key`` is in the journal, or -1."""
        journal, length = self._journal, self._length
        assert journal is not None
        index = journal.latest.get(key, -1)
        while index >= length:
            index = journal.previous[index]
        return index

    def __contains__(self, key: object) -> bool:
        items = self._items
        if items is not None:
            return key in items
        return self._index(key) >= 0  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[K]:
        items = self._items
        if items is not None:
            return iter(items)
        # The first _size keys by first write are exactly this version's.
        return iter(self._journal.order[: self._size])  # type: ignore[union-attr]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle and copy the contents, not a shared journal.
        return (type(self), (dict(self.items()),))
