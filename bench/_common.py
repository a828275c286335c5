"""What the scripts of bench/ share: a parser whose errors are one line, a count argument,
and the lines above every script's figures (the date, the machine, the command)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import sys
from pathlib import Path


class Parser(argparse.ArgumentParser):
    def error(self, message):          # one line, not argparse's usage block
        sys.exit(f"{self.prog}: error: {message}")


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not an integer of 1 or more: {text!r}")
    return int(text)


def header(software: str | None = None, more: str = "") -> None:
    """The date, the machine (``software``: what it runs, by default this Python and
    dlbench; ``more`` after it) and the command line, each on a line of its own."""
    from orchestrator import __version__, hostinfo

    software = software or f"Python {platform.python_version()}, dlbench {__version__}"
    print(f"date     {dt.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"machine  {hostinfo.cpu_model()}, {os.cpu_count()} cores, {hostinfo.memory_gb()} GiB, "
          f"{platform.system()} {platform.release()}; {software}{more}")
    print(f"command  {shlex.join([Path(sys.executable).name, *sys.argv])}")
