"""The ``dlbench`` command's first lines: the stop signals are taken over
(``interrupts.py``) before anything else is imported, so that SIGINT, SIGTERM and
SIGHUP stop a run the same way in every phase, start-up included."""

import sys

from . import interrupts


def main():
    interrupts.install()
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:           # during start-up: nothing to clean up yet
        sys.exit(interrupts.interrupted())
    cli_main()
