from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from orchestrator import VirtualClock

T = TypeVar("T")


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def vrun(clock: VirtualClock) -> Callable[[Coroutine[Any, Any, T]], T]:
    """Run a coroutine on the test's virtual clock (time jumps whenever everything waits)."""
    return clock.run
