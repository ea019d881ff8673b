"""Shared pytest configuration.

Async tests use the pytest plugin that ships with anyio (``@pytest.mark.anyio``)
and run once per backend.
"""

from __future__ import annotations

import os
import sys

import pytest

# The suite keeps bytecode as Python does by default, whatever the shell
# says: under PYTHONDONTWRITEBYTECODE each run would compile every test
# module again (assertion rewriting: half of collection's CPU) and each
# command-line subprocess every product module it imports.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Every process the suite starts (the command line, launchers' ranks,
# isolated steps) imports the tree under test first, not the checkout an
# editable install of the virtualenv points to: a second checkout (a git
# worktree) sharing one virtualenv tests its own code in subprocesses too.
_TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(
    path for path in (_TREE, os.environ.get("PYTHONPATH", "")) if path
)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every ``@pytest.mark.anyio`` test on both anyio backends."""
    backend: str = request.param
    return backend
