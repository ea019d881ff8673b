"""Importers: the only way probes import modules.

Every probe calls :meth:`StepContext.import_module` / ``find_spec``, which go
to the run's importer. The real one is importlib; the injecting one applies a
:class:`~orchestrator.FaultPlan` first; simulated hosts supply their own. No
importer ever patches ``builtins.__import__``: a fault is visible only to the
probes of the run it was configured for.
"""

from __future__ import annotations

import copy
import importlib
import importlib.machinery
import importlib.util
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from ._faults import FaultPlan

__all__ = ["Importer", "InjectingImporter", "RealImporter", "TableImporter"]


@runtime_checkable
class Importer(Protocol):
    """Imports modules for probes.

    ``import_module`` imports or raises exactly what a real import would
    (ModuleNotFoundError, ImportError, OSError from a shared library...).
    ``find_spec`` returns a spec if the module could be imported, ``None`` if
    it (or a parent package) is not installed.
    """

    def import_module(self, name: str) -> ModuleType: ...

    def find_spec(self, name: str) -> importlib.machinery.ModuleSpec | None: ...


class RealImporter:
    """importlib, unchanged."""

    def import_module(self, name: str) -> ModuleType:
        """``importlib.import_module(name)``."""
        return importlib.import_module(name)

    def find_spec(self, name: str) -> importlib.machinery.ModuleSpec | None:
        """``importlib.util.find_spec(name)``, with a missing parent package
        reported as ``None`` rather than ModuleNotFoundError."""
        try:
            return importlib.util.find_spec(name)
        except ModuleNotFoundError:
            return None


class InjectingImporter:
    """Applies a fault plan in front of another importer.

    A module with a fault on this rank is findable (so probes that check
    ``find_spec`` first go on to import it) and its import fires the fault.
    A hanging import never returns, as a real one: its step's daemon thread
    is abandoned at the step's timeout or the run's end.
    """

    def __init__(self, base: Importer, plan: FaultPlan, rank: int) -> None:
        #: The importer asked when no fault applies.
        self.base = base
        #: The fault plan applied.
        self.plan = plan
        self._rank = rank

    def import_module(self, name: str) -> ModuleType:
        """Fire the fault configured for ``name`` or for one of its parent
        packages (importing ``a.b`` imports ``a`` first, so a broken ``a``
        breaks ``a.b`` too) on this rank, else import."""
        for prefix in dotted_prefixes(name):
            fault = self.plan.for_target(prefix, self._rank)
            if fault is not None:
                fault.fire()
        return self.base.import_module(name)

    def find_spec(self, name: str) -> importlib.machinery.ModuleSpec | None:
        """A spec for a faulted module (or a parent of one), else the base's."""
        if any(name in dotted_prefixes(target) for target in self.plan.targets(self._rank)):
            return importlib.machinery.ModuleSpec(name, loader=None)
        return self.base.find_spec(name)


class TableImporter:
    """Imports from a table ``{name: module | exception | None}``, as
    :func:`orchestrator.testing.fake_host` describes; a simulated host
    imports through it too."""

    def __init__(
        self,
        modules: Mapping[str, ModuleType | BaseException | None],
        base: Importer | None,
        origin: str = "fake host",
    ) -> None:
        self._modules = dict(modules)
        self._base = base
        self._origin = origin
        self._packages: dict[str, ModuleType] = {}

    def __repr__(self) -> str:
        return f"TableImporter({sorted(self._modules)!r}, base={self._base!r})"

    def _is_parent(self, name: str) -> bool:
        return any(listed.startswith(name + ".") for listed in self._modules)

    def _answer(self, name: str) -> ModuleType | None:
        """The module ``name`` itself imports as (its parents done), or
        ``None`` when neither ``modules`` nor a listed child names it.
        Raises what importing it raises."""
        if name in self._modules:
            answer = self._modules[name]
            if answer is None:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            if isinstance(answer, BaseException):
                raise self._fresh(answer)
            return answer
        if self._is_parent(name):
            return self._packages.setdefault(name, _package(name))
        return None

    def import_module(self, name: str) -> ModuleType:
        """Import ``name`` (its parent packages first) from the fake host."""
        module: ModuleType | None = None
        for prefix in dotted_prefixes(name):
            module = self._answer(prefix)
            if module is None:
                # Nothing below an unlisted module is listed: the rest is the base's.
                if self._base is None:
                    raise ModuleNotFoundError(f"No module named {prefix!r}", name=prefix)
                return self._base.import_module(name)
        assert module is not None
        return module

    def find_spec(self, name: str) -> importlib.machinery.ModuleSpec | None:
        """A spec if ``name`` would import or raise on import; ``None`` if it
        or a parent package is not installed. As with importlib, a parent
        package that raises on import raises here."""
        for prefix in dotted_prefixes(name):
            if prefix not in self._modules and not self._is_parent(prefix):
                return None if self._base is None else self._base.find_spec(name)
            answer = self._modules.get(prefix)
            if prefix in self._modules and answer is None:
                return None
            if isinstance(answer, BaseException) and prefix != name:
                error = self._fresh(answer)
                if isinstance(error, ModuleNotFoundError) and error.name == prefix:
                    return None
                raise error
        return importlib.machinery.ModuleSpec(name, loader=None, origin=self._origin)

    def _fresh(self, exception: BaseException) -> BaseException:
        # A copy per import, so one import's traceback and context never show
        # up on the next; an exception that cannot be copied is raised as is.
        try:
            return copy.copy(exception)
        except Exception:
            return exception

    def isolation_spec(self) -> dict[str, Any] | None:
        """How a process-isolated step rebuilds this importer: possible only
        when nothing but the base answers."""
        if self._modules or self._base is None:
            raise TypeError(
                "a fake host's modules do not cross into a process-isolated step; "
                "give the step's host a base importer that does"
            )
        spec = getattr(self._base, "isolation_spec", None)
        if spec is None and not isinstance(self._base, RealImporter):
            raise TypeError(f"{self._base!r} cannot be rebuilt in a process-isolated step")
        return None if spec is None else dict(spec())


def dotted_prefixes(name: str) -> list[str]:
    """``a``, ``a.b``, ``a.b.c`` for ``a.b.c``: what importing it imports, in order."""
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


def _package(name: str) -> ModuleType:
    package = ModuleType(name, f"Fake package {name} (a parent of a fake host's module).")
    package.__path__ = []
    package.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, origin="fake host")
    return package
