"""Files dlbench reads but did not make: a job's output, a campaign file, what lies in a
results directory.  Each is read only when ``fstat`` says it is a regular file within a
size limit, after an open that never blocks (``O_NONBLOCK``: a FIFO with no writer would
hold a plain ``open`` for ever, deaf to signals) and never takes a terminal.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

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


NPY_HEADER_BYTES = 4096     # an .npy member's magic and header, at most (numpy writes 128)
NUMERIC = "biuf"            # the dtype kinds read: booleans, integers, floats


def read_npz(data: bytes, name: str, limit: int, most: int, names: Sequence[str] | None = None) -> dict:
    """The arrays of an ``.npz`` file dlbench did not make (``name``, for messages), else
    ``Refused`` with the reason on one line.  Nothing is unpacked before everything
    declared is known to fit: the zip holds at most ``most`` members, each an ``.npy``
    array (no other file, no name twice) named in ``names`` (when given), declaring at
    most ``limit`` bytes unpacked together; then each member's ``.npy`` header is parsed
    alone, its dtype plain numbers (nothing pickled, no fields) and its shape times its
    item size exactly what the member holds after the header.  A header may lie about
    the shape (382 bytes that declare 2^40 numbers): numpy would allocate what it
    declares before finding the data short, so the shape is believed only where the
    member's declared size backs it, and that size is what ``zipfile`` unpacks at most."""
    import io
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = _npz_members(archive, name, limit, most, names)
            return {key: _npz_array(archive, member) for key, member in members.items()}
    except Refused:
        raise
    except MemoryError:
        raise Refused(f"{name} is invalid: its arrays do not fit in memory") from None
    except Exception as exc:        # zip, zlib, numpy: whatever the bytes make them raise
        raise Refused(f"{name} is invalid: {one_line(exc)}") from None


def _npz_members(archive, name: str, limit: int, most: int, names: Sequence[str] | None) -> dict:
    """The zip's ``.npy`` members by array name, each header checked; nothing loaded."""
    members = archive.infolist()
    if len(members) > most:
        raise Refused(f"{name} holds {len(members)} arrays, more than {most}")
    keys = [member.filename.removesuffix(".npy") for member in members]
    odd = [member.filename for member in members if not member.filename.endswith(".npy")]
    if odd:
        raise Refused(f"{name} is invalid: {odd[0]!r} is not an .npy array")
    if len(set(keys)) < len(keys):
        raise Refused(f"{name} is invalid: it names an array twice")
    if names is not None and not set(keys) <= set(names):
        raise Refused(f"{name} is invalid: it holds {', '.join(f'{key}.npy' for key in sorted(keys))}, "
                      f"not {', '.join(names)}")
    unpacked = sum(member.file_size for member in members)
    if unpacked > limit:
        raise Refused(f"{name} unpacks to {unpacked} bytes, more than {limit}")
    for key, member in zip(keys, members):
        _npy_header(archive, member, name)
    return dict(zip(keys, members))


def _npy_header(archive, member, name: str) -> None:
    """A member's ``.npy`` header, read alone and checked against the member's size."""
    import math

    from numpy.lib import format as npy

    where = f"{name} is invalid: {member.filename}"
    with archive.open(member) as stream:
        version = npy.read_magic(stream)
        if version not in ((1, 0), (2, 0)):
            raise Refused(f"{where} is .npy version {version[0]}.{version[1]}, not 1.0 or 2.0")
        read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, _, dtype = read(stream, max_header_size=NPY_HEADER_BYTES)
        header = stream.tell()
    if dtype.hasobject:
        raise Refused(f"{name} is invalid: Object arrays cannot be loaded ({member.filename} "
                      "holds Python objects, which only a pickle can)")
    if dtype.kind not in NUMERIC or dtype.fields is not None or dtype.subdtype is not None:
        raise Refused(f"{where} holds {dtype}, not plain numbers")
    if any(n < 0 for n in shape):
        raise Refused(f"{where} declares the shape {shape}")
    declared = math.prod(shape) * dtype.itemsize
    if declared != member.file_size - header:
        raise Refused(f"{where} declares {'x'.join(map(str, shape)) or 'a scalar'} {dtype} "
                      f"({declared} bytes), but holds {member.file_size - header} after its header")


def _npz_array(archive, member):
    """A member whose header was checked, read."""
    from numpy.lib import format as npy

    with archive.open(member) as stream:
        return npy.read_array(stream, allow_pickle=False, max_header_size=NPY_HEADER_BYTES)
