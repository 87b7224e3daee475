"""Whether any bootstrap server accepts a connection, asked before a writer opens its producer.

A producer that cannot connect waits ``max_block_ms`` (60 s by default) before its first send
fails. A plain TCP connect answers in milliseconds when nothing listens at an address or its
name does not resolve; the write then stops at once, naming each address and why. A connect
that times out is no such answer (a slow or filtering network), so the producer is left to
try within its own limits.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

#: Upper bound of one connect attempt, as Java's ``socket.connection.setup.timeout.ms`` default.
CONNECT_TIMEOUT = 10.0


def unreachable(addresses: Sequence[tuple[str, int]], timeout: float) -> str | None:
    """Why no address accepts a connection; None as soon as one does, or one times out."""
    reasons = []
    for host, port in addresses:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except ConnectionRefusedError:
            reasons.append(f"{host}:{port} (connection refused)")
        except socket.gaierror as exc:
            reasons.append(f"{host}:{port} (cannot resolve {host!r}: {exc.strerror})")
        except TimeoutError:
            return None
        except OSError as exc:  # network or host unreachable, ...
            reasons.append(f"{host}:{port} ({exc.strerror or exc})")
        else:
            return None
    return f"no bootstrap server reachable from {socket.gethostname()}: {'; '.join(reasons)}"
