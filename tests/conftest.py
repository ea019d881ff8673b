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


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every ``@pytest.mark.anyio`` test on both anyio backends."""
    backend: str = request.param
    return backend
