"""A rank of a world of one that is asked to stop once its run is over: the
startup's event loop has closed, its log is still open.

Run as ``python -m tests.orchestrator.late_stop_worker RUN_DIR BACKEND
SIGNAL`` (``asyncio`` or ``trio``; ``SIGINT`` or ``SIGTERM``); prints one
JSON document of what it saw, if it lives to.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import orjson

from orchestrator import Graph, Startup, Step


def main() -> None:
    run_dir, backend, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    startup = Startup(
        graph=Graph("tiny", [Step(name="probe", body=lambda _context: {"ok": True})]),
        run_dir=run_dir,
        tracing=None,
        configure_logging=False,
        handle_signals=True,
        environ={},
    )
    with startup:
        result = anyio.run(startup.arun, backend=backend)
        # The event loop and its signal receiver are gone; the launcher
        # stops its ranks now (one of them ended).
        os.kill(os.getpid(), signal.Signals[name])
        seen = {"alive": True, "outcome": result.outcome.value}
    print(orjson.dumps(seen).decode())


if __name__ == "__main__":
    main()
