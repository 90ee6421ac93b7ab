"""Fixtures: a real fenced server per module, unique lock names per test."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support import Server  # noqa: E402

_n = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A lock name (and store key) no other test uses."""
    return f"t/{request.node.name}/{next(_n)}"
