"""Each package's ``__all__`` is exactly its public surface, sorted."""

from __future__ import annotations

import importlib
import importlib.resources
import re
import types

import pytest

#: The distribution's top-level packages (each ships ``py.typed``).
TOP_LEVEL = ["events", "orchestrator", "exporters"]
#: Every package with a curated public surface.
PACKAGES = [*TOP_LEVEL, "orchestrator.cli"]
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
