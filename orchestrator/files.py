"""Files dlbench reads but did not make: a job's output, a campaign file, what lies in a
results directory.  Each is read only when ``fstat`` says it is a regular file within a
size limit, after an open that never blocks (``O_NONBLOCK``: a FIFO with no writer would
hold a plain ``open`` for ever, deaf to signals) and never takes a terminal.
"""

from __future__ import annotations

import os
import stat

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory",
         stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFSOCK: "a socket"}


class Refused(Exception):
    """A file that was not read, and why in a few words: ``not a regular file (a FIFO)``,
    ``5242881 bytes (limit 4194304)``."""


def kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words."""
    return "a regular file" if stat.S_ISREG(mode) else KINDS.get(stat.S_IFMT(mode), "a special file")


def kind_at(name, dir_fd: int | None = None) -> str | None:
    """What ``name`` itself is (a link is not followed), or None if it cannot be seen."""
    try:
        return kind(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return None


def read_regular(name, limit: int, dir_fd: int | None = None, follow_links: bool = True) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; raises ``Refused`` for
    anything else, and the open's ``OSError`` (``FileNotFoundError``; ``ELOOP`` for a link
    when ``follow_links`` is false)."""
    fd = os.open(name, _READ | (0 if follow_links else os.O_NOFOLLOW), dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"not a regular file ({kind(info.st_mode)})")
        if info.st_size > limit:
            raise Refused(f"{info.st_size} bytes (limit {limit})")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:                          # grew after fstat
            raise Refused(f"over {limit} bytes (limit {limit})")
        return data
    finally:
        os.close(fd)
