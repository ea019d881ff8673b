"""Importers: the only way probes import modules.

Every probe calls :meth:`StepContext.import_module` / ``find_spec``, which go
to the run's importer. The real one is importlib; the injecting one applies a
:class:`~orchestrator.FaultPlan` first; simulated hosts supply their own. No
importer ever patches ``builtins.__import__``: a fault is visible only to the
probes of the run it was configured for.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
from types import ModuleType
from typing import Protocol, runtime_checkable

from ._faults import FaultPlan

__all__ = ["Importer", "InjectingImporter", "RealImporter"]


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
        self._base = base
        self._plan = plan
        self._rank = rank

    @property
    def plan(self) -> FaultPlan:
        """The fault plan applied."""
        return self._plan

    @property
    def base(self) -> Importer:
        """The importer asked when no fault applies."""
        return self._base

    def import_module(self, name: str) -> ModuleType:
        """Fire the fault configured for ``name`` or for one of its parent
        packages (importing ``a.b`` imports ``a`` first, so a broken ``a``
        breaks ``a.b`` too) on this rank, else import."""
        parts = name.split(".")
        for end in range(1, len(parts) + 1):
            fault = self._plan.for_target(".".join(parts[:end]), self._rank)
            if fault is not None:
                fault.fire()
        return self._base.import_module(name)

    def find_spec(self, name: str) -> importlib.machinery.ModuleSpec | None:
        """A spec for a faulted module (or a parent of one), else the base's."""
        targets = self._plan.targets(self._rank)
        if any(t == name or t.startswith(name + ".") for t in targets):
            return importlib.machinery.ModuleSpec(name, loader=None)
        return self._base.find_spec(name)
