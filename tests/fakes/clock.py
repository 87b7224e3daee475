"""Virtual time for an event loop that does no real I/O.

Installed on the running loop, the clock stands still while callbacks run and, when
nothing is ready, jumps straight to the next timer instead of waiting for it. Timeouts,
backoffs, linger and delivery deadlines then happen in exactly the order the code
schedules them, in no real time, and a test can assert *when* something happened
(``clock.now``) without a timing threshold. Every byte must move in memory
(:mod:`tests.fakes.network`): a real socket would never be polled.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any


class VirtualDeadlock(RuntimeError):
    """The loop would wait forever: no timer is due and nothing can run."""


class VirtualClock:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.now = loop.time()
        self._loop: Any = loop
        self._selector: Any = loop._selector  # type: ignore[attr-defined]
        self._real_select = self._selector.select

    def time(self) -> float:
        return self.now

    def _select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise VirtualDeadlock("virtual clock: no timer is scheduled and nothing is ready")
        if timeout > 0:
            self.now += timeout
        return []

    def install(self) -> VirtualClock:
        self._loop.time = self.time
        self._selector.select = self._select
        return self

    def uninstall(self) -> None:
        del self._loop.time
        self._selector.select = self._real_select

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass, running everything due on the way."""
        await asyncio.sleep(seconds)

    async def advance_to_whole_millisecond(self) -> None:
        """A batch's age counts whole milliseconds, as in the Java producer: a test that
        asserts when a batch goes starts on one, so that its figures are exact."""
        await self.advance(math.ceil(self.now * 1000) / 1000 - self.now)
