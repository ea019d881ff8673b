"""Each package's ``__all__`` is exactly its public surface, sorted."""

from __future__ import annotations

import ast
import importlib
import importlib.resources
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

#: The distribution's top-level packages (each ships ``py.typed``).
TOP_LEVEL = ["events", "orchestrator", "exporters"]
#: Every package with a curated public surface.
PACKAGES = [*TOP_LEVEL, "orchestrator.cli", "orchestrator.ray"]
#: The packages whose names load on first use, each declared once under
#: ``if TYPE_CHECKING:`` (``events/_surface.py``).
LAZY_PACKAGES = ["events", "exporters", "orchestrator", "orchestrator.engine"]
#: What ``from __future__ import annotations`` binds in a module's namespace.
FUTURE_FEATURE = type(importlib.import_module("__future__").annotations)


def public_names(module: types.ModuleType) -> set[str]:
    """Names bound in the package that a user may import: no ``_`` prefix, no
    submodules, no ``from __future__`` features."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and not isinstance(value, FUTURE_FEATURE)
    }


def isort_style(name: str) -> tuple[int, list[int | str]]:
    """The order ruff's RUF022 keeps ``__all__`` in: SCREAMING_SNAKE_CASE
    constants, then CamelCase classes, then the rest, each in natural order."""
    if name.isupper() and len(name) > 1:
        category = 0
    elif name[:1].isupper():
        category = 1
    else:
        category = 2
    natural = [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
    return category, natural


@pytest.mark.parametrize("name", PACKAGES)
def test_all_matches_the_public_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        # A package without __all__ must not export anything yet.
        assert public_names(module) == set()
        return
    exported = list(exported)
    assert all(isinstance(item, str) for item in exported)
    # Packages load their public names lazily: resolve every one first (each
    # must resolve), then nothing public may be bound beyond them.
    for item in exported:
        getattr(module, item)
    assert exported == sorted(exported, key=isort_style), "__all__ is not sorted"
    assert len(exported) == len(set(exported)), "__all__ has duplicates"
    assert set(exported) == public_names(module)
    for item in exported:
        assert item in vars(module)
    assert set(dir(module)) >= set(exported)


@pytest.mark.parametrize("name", PACKAGES)
def test_an_unknown_name_is_an_attribute_error(name: str) -> None:
    module = importlib.import_module(name)
    missing = "no_such_name"
    with pytest.raises(AttributeError, match=missing):
        getattr(module, missing)


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_package_is_typed(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__file__ is not None
    assert (importlib.resources.files(name) / "py.typed").is_file()


def type_checking_declarations(name: str) -> dict[str, str]:
    """``{name: ".module"}`` as a type checker reads the package: the
    relative imports under its top-level ``if TYPE_CHECKING:``."""
    module = importlib.import_module(name)
    assert module.__file__ is not None
    found = {}
    for node in ast.parse(Path(module.__file__).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                assert isinstance(child, ast.ImportFrom), ast.unparse(child)
                assert child.level == 1, ast.unparse(child)
                for alias in child.names:
                    # ``as`` the same name: an explicit re-export for mypy.
                    assert alias.asname == alias.name, ast.unparse(child)
                    found[alias.name] = f".{child.module}"
    return found


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_what_type_checkers_see_is_what_loads(name: str) -> None:
    # One declaration, two readers: mypy reads the TYPE_CHECKING block, the
    # package reads its own source at run time. They must agree name for
    # name, and each name must load from the module declared for it.
    module = importlib.import_module(name)
    declared = type_checking_declarations(name)
    assert declared
    assert module._SURFACE.table == declared
    assert set(module.__all__) == set(declared)
    for item, submodule in declared.items():
        defining = importlib.import_module(submodule, name)
        assert getattr(module, item) is getattr(defining, item)


def test_star_import_binds_every_public_name() -> None:
    namespace: dict[str, object] = {}
    exec("from events import *", namespace)
    events = importlib.import_module("events")
    assert {key for key in namespace if key != "__builtins__"} == set(events.__all__)


def test_names_load_on_first_use() -> None:
    # A fresh interpreter: importing the package loads none of its modules
    # but the name table's; one name loads its own module only.
    code = (
        "import sys, events\n"
        "before = {m for m in sys.modules if m.startswith('events.')}\n"
        "events.EventsError\n"
        "after = {m for m in sys.modules if m.startswith('events.')}\n"
        "print(sorted(before), sorted(after - before))\n"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert output.strip() == "['events._surface'] ['events._errors']"


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_dir_lists_every_public_name_before_it_is_loaded(name: str) -> None:
    # A fresh interpreter: dir() of the package lists the names it has not
    # loaded yet too.
    code = (
        f"import importlib\n"
        f"package = importlib.import_module({name!r})\n"
        "names = dir(package)\n"
        "print(sorted(set(package.__all__) - set(names)), names == sorted(names))\n"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert output.strip() == "[] True"
