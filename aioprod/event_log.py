"""What an operator must hear of, without flooding the log.

A problem (a broker refusing connections, a failed handshake, a partition without a
leader, a storm of retries, a new producer identity) is logged at WARNING the moment it
starts, naming the broker and the reason; while it lasts it is logged again at most once
per ``interval`` and reason (saying how often it happened meanwhile), so a new reason is
logged at once. Its end is logged at INFO — only for a problem that was logged. Messages carry
the producer's ``client_id``; they are built from errors and addresses, never from
credentials (which the configuration keeps as :class:`~aioprod.config.Secret`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Hashable
from typing import Any

#: How often a problem that lasts is logged again.
DEFAULT_INTERVAL = 30.0


def log_prefix(client_id: str) -> str:
    """``[client_id] `` to start a message's format string (a ``%`` in the id is text)."""
    return f"[{client_id}] ".replace("%", "%%")


class ClientLogger(logging.LoggerAdapter[logging.Logger]):
    """A module's logger whose lines start with the producer's ``[client_id]``, as the
    event log's do: with two producers in one process, whose session or transaction it is."""

    def __init__(self, logger: logging.Logger, client_id: str) -> None:
        super().__init__(logger)
        self._prefix = log_prefix(client_id)

    def process(self, msg: object, kwargs: Any) -> tuple[str, Any]:
        return f"{self._prefix}{msg}", kwargs


class _Seen:
    __slots__ = ("logged", "open", "suppressed", "warned")

    def __init__(self) -> None:
        #: When each reason was last logged: a reason that flips back and forth (a broker that
        #: refuses, then accepts and drops) is not a new one each time. Kept past the problem's
        #: end, so that one that ends and starts again within the interval is not either.
        self.logged: dict[str, float] = {}
        self.suppressed = 0
        #: The problem is on (not resolved since it last happened).
        self.open = True
        #: A warning was logged since the problem last started: only then is its end news.
        self.warned = False


class EventLog:
    """Rate-limited WARNING for problems, INFO for their end; one per producer."""

    def __init__(self, client_id: str, interval: float = DEFAULT_INTERVAL) -> None:
        self.interval = interval
        self._prefix = log_prefix(client_id)
        self._problems: dict[Hashable, _Seen] = {}
        self._notes: dict[Hashable, float] = {}

    def problem(self, logger: logging.Logger, key: Hashable, reason: str, message: str, *args: object) -> None:
        """Log ``message % args`` at WARNING, unless the problem ``key`` was logged less
        than ``interval`` ago for the same ``reason``."""
        now = _now()
        seen = self._problems.get(key)
        if seen is None:
            seen = self._problems[key] = _Seen()
        elif not seen.open:
            seen.open, seen.warned = True, False
        if now - seen.logged.get(reason, -math.inf) < self.interval:
            seen.suppressed += 1
            return
        text = self._prefix + message
        if seen.suppressed:
            text += f" ({seen.suppressed} more since the last warning)"
        logger.warning(text, *args)
        # Reasons not logged for an interval are forgotten: some carry changing detail.
        seen.logged = {old: at for old, at in seen.logged.items() if now - at < self.interval}
        seen.logged[reason] = now
        seen.suppressed = 0
        seen.warned = True

    def resolved(self, logger: logging.Logger, key: Hashable, message: str, *args: object) -> bool:
        """The problem ``key`` is over: log ``message`` at INFO if the problem was logged
        (with how often it happened after its last warning, which would otherwise go unsaid)."""
        seen = self._problems.get(key)
        if seen is None or not seen.open:
            return False
        seen.open = False
        expired = not any(_now() - at < self.interval for at in seen.logged.values())
        if expired:
            del self._problems[key]  # nothing left to rate-limit
        if not seen.warned and not (expired and seen.suppressed):
            # It came back within the interval of its last warning: its end is no news either
            # (its count goes with the next warning, unless the entry goes: then said here).
            return True
        self._log_end(logger, seen.suppressed, message, args)
        seen.suppressed = 0
        return True

    def resolved_all(self, logger: logging.Logger, prefix: tuple[Hashable, ...], message: str, *args: object) -> None:
        """The problems whose key is a tuple starting with ``prefix`` are over: one INFO line
        for them all (if any was logged), with how often they happened after their warnings."""
        size = len(prefix)
        keys = [
            key for key, seen in self._problems.items() if isinstance(key, tuple) and key[:size] == prefix and seen.open
        ]
        if not keys:
            return
        self._log_end(logger, sum(self._problems.pop(key).suppressed for key in keys), message, args)

    def _log_end(self, logger: logging.Logger, suppressed: int, message: str, args: tuple[object, ...]) -> None:
        text = self._prefix + message
        if suppressed:
            text += f" ({suppressed} more after the last warning)"
        logger.info(text, *args)

    def forget(self, key: Hashable) -> None:
        """Drop what is kept of ``key`` without logging: what it was about is gone (a topic
        no longer used), and its end will never be seen."""
        self._problems.pop(key, None)
        self._notes.pop(key, None)

    def active(self, key: Hashable) -> bool:
        seen = self._problems.get(key)
        return seen is not None and seen.open

    def warning(self, logger: logging.Logger, message: str, *args: object) -> None:
        """A WARNING that is not a lasting problem (said once), with the producer's prefix."""
        logger.warning(self._prefix + message, *args)

    def note(self, logger: logging.Logger, key: Hashable, message: str, *args: object) -> None:
        """Log ``message`` at INFO at most once per ``interval`` for ``key`` (a set-up, a
        reconnection: worth knowing, not worth a line per occurrence)."""
        now = _now()
        last = self._notes.get(key)
        if last is not None and now - last < self.interval:
            return
        self._notes[key] = now
        logger.info(self._prefix + message, *args)


def _now() -> float:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()
