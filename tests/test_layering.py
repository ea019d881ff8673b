"""The import graph, read from the source: who may import what, and no
cycles.

Every module of ``events/``, ``orchestrator/`` and ``exporters/`` is parsed
(never imported) and each ``import`` is sorted by where it stands:

- ``module``: at module level (also under ``try``/``if``), run on import;
- ``deferred``: inside a function, or under ``if TYPE_CHECKING:`` — run
  only when called, or never.

A module belongs to the layer of the longest name in :data:`LAYERS` that
covers it (a name covers itself and everything below it; a package's
``__init__`` is ``package.__init__``). :data:`RULES` says what each layer
may import at module level and what more only deferred; the standard
library is always allowed, and everything else not listed is refused.

There must be no cycle in the graph of every import, deferred ones
included: an import inside a function that closes a cycle only moves the
failure to run time, and a ``TYPE_CHECKING`` one still ties the modules
together. Names are resolved to the module that defines them through a
package's lazy name table (its ``TYPE_CHECKING`` declarations), so
``from events import read_log`` is an edge to ``events._reader``. The
imports Python makes implicitly (a module's parent package first) and those
made by name (``importlib.import_module``: the lazy tables themselves, an
isolated step's body and span activator) are not edges.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("events", "orchestrator", "exporters")

#: Layer -> the modules it covers (the longest covering name wins).
LAYERS: dict[str, tuple[str, ...]] = {
    "events": ("events",),
    "exporters": ("exporters",),
    "runtime": ("orchestrator",),
    "errors": ("orchestrator._errors",),
    "embedding": ("orchestrator.__init__", "orchestrator._startup", "orchestrator._launch_trace"),
    "engine": ("orchestrator.engine",),
    "engine-pure": (
        "orchestrator.engine._config",
        "orchestrator.engine._conventions",
        "orchestrator.engine._messages",
        "orchestrator.engine._resolution",
        "orchestrator.engine._slice",
    ),
    "cli": ("orchestrator.cli", "orchestrator.__main__"),
    "ray-embedding": ("orchestrator.ray",),
    "recording": ("orchestrator.recording",),
}

_BASICS = frozenset({"attrs", "orjson"})

#: Layer -> (what it may import at module level, what more only deferred).
#: Entries are layers or third-party top-level packages; the standard
#: library is always allowed.
RULES: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # The kernel: pure data and functions.
    "events": (frozenset({"events"}) | _BASICS, frozenset()),
    # Consumers of events; the only layer that imports OpenTelemetry itself.
    "exporters": (frozenset({"events", "exporters", "opentelemetry"}) | _BASICS, frozenset()),
    # The orchestrator's errors: a leaf every orchestrator layer may use.
    "errors": (frozenset({"events"}) | _BASICS, frozenset()),
    # Runner, graph, policies, isolation...: never exporters or OpenTelemetry
    # (a span is made current through a hook), never the engine or the CLI.
    "runtime": (frozenset({"events", "errors", "runtime", "anyio"}) | _BASICS, frozenset()),
    # The reference engine's pure modules (configuration; the state
    # projection, message rules and report columns it plugs into the
    # kernel): events and the errors only.
    "engine-pure": (frozenset({"events", "errors", "engine-pure"}) | _BASICS, frozenset()),
    # The reference engine: probes on top of the runtime.
    "engine": (
        frozenset({"events", "errors", "runtime", "engine", "engine-pure", "anyio"}) | _BASICS,
        frozenset(),
    ),
    # The embedding API and the package's surface: the runtime at import;
    # the engine, the logging bridge and tracing (exporters; OpenTelemetry's
    # span type, for the launch's trace) only when a caller asks for them,
    # so importing orchestrator loads no OpenTelemetry.
    "embedding": (
        frozenset({"events", "errors", "runtime", "embedding", "anyio"}) | _BASICS,
        frozenset({"engine", "engine-pure", "exporters", "opentelemetry"}),
    ),
    # The Ray embedding: the embedding API in each actor; Ray itself, the
    # engine (fault targets, replay) and tracing (the launch's span) only
    # inside the functions that use them, so importing orchestrator.ray needs
    # no Ray.
    "ray-embedding": (
        frozenset({"events", "errors", "runtime", "embedding", "ray-embedding", "anyio"}) | _BASICS,
        frozenset({"engine", "engine-pure", "exporters", "ray"}),
    ),
    # Recording a real engine's own start: the runtime, and the engine's
    # platform code only once a recording starts, so that the entry point an
    # engine loads in every process imports nothing while recording is off.
    "recording": (
        frozenset({"events", "errors", "runtime", "recording", "anyio"}) | _BASICS,
        frozenset({"engine", "engine-pure"}),
    ),
    # The command line: on top of everything; nothing imports it.
    "cli": (
        frozenset(
            {
                "events",
                "errors",
                "runtime",
                "embedding",
                "engine",
                "engine-pure",
                "exporters",
                "cli",
                "anyio",
            }
        )
        | _BASICS,
        frozenset(),
    ),
}


@attrs.frozen(kw_only=True)
class Import:
    """One import statement's edge: ``source`` imports ``target`` (one of
    ours, resolved to its defining module where the lazy table says, or the
    top-level name of another distribution)."""

    source: str
    target: str
    deferred: bool
    line: int

    def describe(self) -> str:
        where = "deferred" if self.deferred else "module-level"
        return f"{self.source} ({where}, line {self.line}) imports {self.target}"


@attrs.frozen(kw_only=True)
class Module:
    name: str  # ``events``, ``events._codec``
    layer_name: str  # ``events.__init__`` for a package
    path: Path
    is_package: bool


def discover() -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            modules[name] = Module(
                name=name, layer_name=".".join(parts), path=path, is_package=is_package
            )
    return modules


MODULES = discover()


def lazy_table(module: Module) -> dict[str, str]:
    """A package's lazily loaded names (``from .module import Name as Name``
    under its ``if TYPE_CHECKING:``, the one declaration; see
    ``events/_surface.py``), resolved to module names; empty when it has
    none."""
    if not module.is_package:
        return {}
    return {
        name: f"{module.name}.{submodule}" if submodule else module.name
        for name, submodule in declared_names(module.path.read_text(encoding="utf-8")).items()
    }


def declared_names(source: str) -> dict[str, str]:
    """``{name: submodule}`` for the relative one-name imports under the
    top-level ``if TYPE_CHECKING:`` blocks of ``source``."""
    found = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
            continue
        for child in node.body:
            if isinstance(child, ast.ImportFrom) and child.level == 1:
                for alias in child.names:
                    if alias.asname == alias.name:
                        found[alias.name] = child.module or ""
    return found


LAZY = {name: lazy_table(module) for name, module in MODULES.items()}


def _statements(tree: ast.AST, deferred: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _statements(node, True)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                yield child, True
                yield from _statements(child, True)
            for child in node.orelse:
                yield child, deferred
                yield from _statements(child, deferred)
        else:
            if isinstance(node, ast.stmt):
                yield node, deferred
            yield from _statements(node, deferred)


def _resolve_from(module: Module, node: ast.ImportFrom) -> list[str]:
    if node.level:
        base = module.name.split(".")
        if not module.is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join([*base, *([node.module] if node.module else [])])
    else:
        prefix = node.module or ""
    targets = []
    for alias in node.names:
        submodule = f"{prefix}.{alias.name}"
        if submodule in MODULES:
            targets.append(submodule)
        elif prefix in LAZY and alias.name in LAZY[prefix]:
            targets.append(LAZY[prefix][alias.name])
        else:
            targets.append(prefix)
    return targets


def imports_of(module: Module) -> list[Import]:
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    found = []
    for node, deferred in _statements(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.module == "__future__":
                continue
            targets = _resolve_from(module, node)
        else:
            continue
        for target in targets:
            if target not in MODULES:
                target = target.split(".")[0]
            found.append(
                Import(source=module.name, target=target, deferred=deferred, line=node.lineno)
            )
    return found


IMPORTS = [edge for module in MODULES.values() for edge in imports_of(module)]


def layer_of(name: str) -> str:
    """The layer of one of our modules (by module name)."""
    layer_name = MODULES[name].layer_name
    best, best_length = None, -1
    for layer, covered in LAYERS.items():
        for prefix in covered:
            if (layer_name == prefix or layer_name.startswith(prefix + ".")) and len(
                prefix
            ) > best_length:
                best, best_length = layer, len(prefix)
    assert best is not None, f"{name} is in no layer"
    return best


def test_the_rules_cover_every_layer() -> None:
    assert set(RULES) == set(LAYERS)
    for module in MODULES:
        layer_of(module)
    # The table names what exists.
    for covered in LAYERS.values():
        for prefix in covered:
            assert any(
                m.layer_name == prefix or m.layer_name.startswith(prefix + ".")
                for m in MODULES.values()
            ), prefix


def test_every_import_is_allowed_by_its_layer() -> None:
    refused = []
    for edge in IMPORTS:
        source_layer = layer_of(edge.source)
        if edge.target in MODULES:
            kind = layer_of(edge.target)
        elif edge.target in sys.stdlib_module_names:
            continue
        else:
            kind = edge.target
        at_import, deferred_only = RULES[source_layer]
        allowed = at_import | deferred_only if edge.deferred else at_import
        if kind not in allowed:
            refused.append(f"{edge.describe()} (layer {source_layer} may not import {kind})")
    assert not refused, "\n".join(refused)


def test_nothing_imports_the_command_line() -> None:
    users = {
        edge.source
        for edge in IMPORTS
        if edge.target in MODULES
        and layer_of(edge.target) == "cli"
        and layer_of(edge.source) != "cli"
    }
    assert users == set()


def test_there_is_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for edge in IMPORTS:
        if edge.target in MODULES and edge.target != edge.source:
            graph[edge.source].add(edge.target)
    cycles = _cycles(graph)
    assert not cycles, "modules that import each other:\n" + "\n".join(
        ", ".join(cycle) for cycle in cycles
    )


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules of each strongly connected component of more than one
    module: each imports, through the others, itself (Tarjan's algorithm,
    iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


# --- the checker checks -----------------------------------------------------------------


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize(
    ("source", "statement", "expected"),
    [
        ("orchestrator._runner", "from ._context import StepContext", "orchestrator._context"),
        ("orchestrator.cli._run", "from .._startup import Startup", "orchestrator._startup"),
        ("orchestrator.cli", "from . import _parser", "orchestrator.cli._parser"),
        ("exporters._spans", "from events import read_log", "events._reader"),
        ("exporters._spans", "from opentelemetry.trace import Span", "opentelemetry"),
    ],
)
def test_imports_are_resolved(source: str, statement: str, expected: str) -> None:
    node = ast.parse(statement).body[0]
    module = MODULES[source]
    if isinstance(node, ast.ImportFrom):
        [target] = _resolve_from(module, node)
    else:
        target = statement.split()[1]
    assert (target if target in MODULES else target.split(".")[0]) == expected


def test_deferred_imports_are_told_apart(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import json\n"
        "if TYPE_CHECKING:\n"
        "    import csv\n"
        "def f():\n"
        "    import re\n"
        "class C:\n"
        "    def m(self):\n"
        "        import ast\n"
    )
    module = Module(
        name="events._sample", layer_name="events._sample", path=source, is_package=False
    )
    kinds = {edge.target: edge.deferred for edge in imports_of(module)}
    assert kinds == {"typing": False, "json": False, "csv": True, "re": True, "ast": True}
