"""Files the runner leaves in /out beside ``result.json``: each written whole or not at all."""

import os


def write_atomic(path, write):
    """``write(f)`` into a temporary name beside ``path``, fsynced, renamed into place."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        remove(tmp)


def remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass
