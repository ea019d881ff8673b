"""A package's public surface: declared once, loaded on first use (PEP 562).

Each package of the distribution (``events``, ``exporters``,
``orchestrator``, ``orchestrator.engine``, ``orchestrator.recording``)
declares every public name exactly once, in its ``if TYPE_CHECKING:``
block::

    if typing.TYPE_CHECKING:
        from ._log import JsonlLog as JsonlLog

Type checkers read that block as the package's re-exports, so
``from events import JsonlLog`` is typed. At run time :class:`Surface`
reads the same lines from the package's own source to build the name table
(name -> submodule), ``__all__`` and ``dir()``; a name is imported from its
submodule the first time it is used, so importing a package for one thing
(the command line's ``--help``) does not import everything.

The source is read with a regular expression, not :mod:`ast`: the table is
needed on a package's first lookup, on every start, and the pattern costs
well under a millisecond where parsing costs several. It recognises only
``from .module import Name as Name`` (parenthesised or not), one name a
statement, indented in the block; ``tests/test_exports.py`` checks that it
finds exactly what the block declares, so the two readings cannot drift.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import MutableMapping

__all__ = ["Surface"]

_DECLARATION = re.compile(
    r"^[ \t]+from[ \t]+(\.[\w.]*)[ \t]+import[ \t]+\(?\s*(\w+)[ \t]+as[ \t]+(\w+)", re.MULTILINE
)


def _sort_key(name: str) -> tuple[int, list[int | str]]:
    # The order ruff keeps a literal ``__all__`` in (RUF022, isort style):
    # CONSTANTS, then Classes, then functions, each in natural order.
    if name.isupper() and len(name) > 1:
        category = 0
    elif name[:1].isupper():
        category = 1
    else:
        category = 2
    return category, [int(part) if part.isdecimal() else part for part in re.split(r"(\d+)", name)]


class Surface:
    """The lazily loaded public names of the package whose namespace is
    ``namespace`` (its ``globals()``).

    Made, it is the package's module ``__getattr__`` (:meth:`attribute`)
    and ``__dir__`` (:meth:`names`).
    """

    def __init__(self, namespace: MutableMapping[str, object]) -> None:
        self._namespace = namespace
        self._package = str(namespace["__name__"])
        namespace["__getattr__"] = self.attribute
        namespace["__dir__"] = self.names

    @functools.cached_property
    def table(self) -> dict[str, str]:
        """Every public name and the submodule (``".module"``) defining it."""
        spec = self._namespace["__spec__"]
        source = spec.loader.get_source(self._package)  # type: ignore[attr-defined]
        if source is None:  # pragma: no cover - installs always ship sources
            raise ImportError(f"{self._package}: no source to read its public names from")
        return {
            name: module for module, name, alias in _DECLARATION.findall(source) if name == alias
        }

    def attribute(self, name: str) -> object:
        """The public ``name`` (or ``__all__``), imported on first use and
        then bound in the package.

        Raises:
            AttributeError: the package declares no such name.
        """
        if name == "__all__":
            value: object = sorted(self.table, key=_sort_key)
        else:
            module = self.table.get(name)
            if module is None:
                raise AttributeError(f"module {self._package!r} has no attribute {name!r}")
            value = getattr(importlib.import_module(module, self._package), name)
        self._namespace[name] = value
        return value

    def names(self) -> list[str]:
        """``dir()`` of the package: what is bound plus every public name."""
        return sorted(set(self._namespace) | set(self.table))
