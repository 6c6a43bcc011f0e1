"""Hypothesis keeps caches (and would keep its example database) under a storage directory,
`.hypothesis` in the working directory by default: here a temporary one, removed at the end."""

from __future__ import annotations

import shutil
import tempfile

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

_HOME = tempfile.mkdtemp(prefix="fleet-proxy-hypothesis-")
set_hypothesis_home_dir(_HOME)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_HOME, ignore_errors=True)
