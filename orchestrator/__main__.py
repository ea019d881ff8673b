"""``python -m orchestrator``: the ``startup-orchestrator`` command line."""

from ._cli import main

raise SystemExit(main())
