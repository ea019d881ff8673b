"""``python -m orchestrator``: the ``startup-orchestrator`` command line."""

import sys

try:
    # A Ctrl-C (or a launcher forwarding one) that lands while the command
    # line is still importing is a stop like any other: one line, exit 1.
    from .cli import main
    from .cli._output import exit_program

    code = main()
except KeyboardInterrupt:
    sys.stderr.write("startup-orchestrator: interrupted\n")
    raise SystemExit(1) from None
# The atexit hooks run; the interpreter's teardown is skipped.
exit_program(code)
