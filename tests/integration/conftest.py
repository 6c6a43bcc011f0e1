"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.fake_backend import FakeBackend


@pytest.fixture
async def backend() -> AsyncIterator[FakeBackend]:
    b = FakeBackend()
    await b.start()
    yield b
    await b.stop()
