"""Shared pytest configuration.

Async tests use the pytest plugin that ships with anyio (``@pytest.mark.anyio``)
and run once per backend.
"""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every ``@pytest.mark.anyio`` test on both anyio backends."""
    backend: str = request.param
    return backend
