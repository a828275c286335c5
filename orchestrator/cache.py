"""The user cache: ``~/.cache/dlbench`` on Linux (``$XDG_CACHE_HOME/dlbench`` when that
is set), holding the data sets, the source archives, the owners' lock files, the build
logs, each image's last build time on this machine (``build_times``) and the record of data
sets already verified.  Each of them is a folder made here,
so that a cache that cannot be a directory (``XDG_CACHE_HOME`` naming a file, a
read-only disk) is one error line, wherever it is first needed."""

from __future__ import annotations

from pathlib import Path

import platformdirs

from .errors import DlbenchError


def root() -> Path:
    return Path(platformdirs.user_cache_dir("dlbench"))


def folder(name: str) -> Path:
    """``root() / name``, made if it is missing."""
    path = root() / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DlbenchError(f"{path}: cannot make the cache directory: {exc.strerror} (dlbench "
                           "keeps its cache in $XDG_CACHE_HOME/dlbench, else ~/.cache/dlbench)") from None
    return path


def build_times() -> Path:
    """The file of each image's last build time, by machine (``build_progress.Times``)."""
    return folder("builds") / "times.json"
