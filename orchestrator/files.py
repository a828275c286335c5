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


def one_line(what: BaseException | str, limit: int = 300) -> str:
    """An error (or its text) on one line of at most ``limit`` characters; an error that
    says nothing is named by its type."""
    text = " ".join(str(what).split())
    if not text and isinstance(what, BaseException):
        text = type(what).__name__
    return text[:limit]


def read_npz(data: bytes, name: str, limit: int, most: int) -> dict:
    """The arrays of an ``.npz`` file dlbench did not make (``name``, for messages): a zip
    of at most ``most`` arrays, none pickled, that unpack to at most ``limit`` bytes
    together, each as its zip entry declares (numpy reads an entry no further than that,
    so a small file that would inflate to gigabytes is refused before it is read); else
    ``Refused`` with the reason on one line."""
    import io
    import zipfile

    import numpy as np

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
        if len(members) > most:
            raise Refused(f"{name} holds {len(members)} arrays, more than {most}")
        unpacked = sum(member.file_size for member in members)
        if unpacked > limit:
            raise Refused(f"{name} unpacks to {unpacked} bytes, more than {limit}")
        with np.load(io.BytesIO(data), allow_pickle=False) as stored:
            return {key: stored[key] for key in stored.files}
    except Refused:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, NotImplementedError) as exc:
        raise Refused(f"{name} is invalid: {one_line(exc)}") from None
