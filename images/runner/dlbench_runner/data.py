"""Readers for the canonical MNIST (IDX) and CIFAR-10 (binary version) files.

Each file may be stored plain or gzip-compressed (``name`` or ``name.gz``).
The header parsing is shared with the host, which verifies data sets with it;
only the array readers need numpy.

A file is never read past the size it should have: an IDX file the size its
header promises (at most MAX_IDX_BYTES), a CIFAR-10 batch at most
CIFAR_MAX_RECORDS records, so that a small compressed file cannot expand to
gigabytes in memory; a damaged gzip stream is a DataError naming the file.
"""

import gzip
import os
import struct
import zlib

IDX_IMAGES_MAGIC = 2051
IDX_LABELS_MAGIC = 2049
CIFAR_RECORD = 1 + 3 * 32 * 32
CIFAR_MAX_RECORDS = 10000           # a batch file of the canonical layout
MAX_IDX_BYTES = 256 << 20           # MNIST's largest file is 47 MB

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
CIFAR_DIR = "cifar-10-batches-bin"
CIFAR_TRAIN = ["data_batch_%d.bin" % i for i in range(1, 6)]
CIFAR_TEST = ["test_batch.bin"]


class DataError(Exception):
    """A data set file is missing or malformed; the message names the file."""


def find(directory, name):
    """Path of ``name`` or ``name.gz`` in ``directory``."""
    for candidate in (name, name + ".gz"):
        path = os.path.join(directory, candidate)
        if os.path.isfile(path):
            return path
    raise DataError("%s: missing (neither %s nor %s.gz)" % (os.path.join(directory, name), name, name))


def read_bytes(path, limit=None):
    """The file's bytes (decompressed), at most ``limit`` of them (None: all)."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            return f.read() if limit is None else f.read(limit)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError("%s: cannot read: %s" % (path, exc))


def read_idx(path):
    """An IDX file's bytes, read no further than its header says it holds (and one
    byte more, to tell a longer file); parse_idx checks the rest."""
    head = read_bytes(path, 16)
    if len(head) >= 8 and struct.unpack(">i", head[:4])[0] in (IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC):
        magic, count = struct.unpack(">ii", head[:8])
        dims = (count,) + (struct.unpack(">ii", head[8:16]) if magic == IDX_IMAGES_MAGIC
                           and len(head) == 16 else ())
        header = 16 if magic == IDX_IMAGES_MAGIC else 8
        size = header + _product(dims)
        if min(dims) < 0 or size > MAX_IDX_BYTES:
            raise DataError("%s: its header promises %d bytes (dimensions %s), more than %d"
                            % (path, size, "x".join(str(d) for d in dims), MAX_IDX_BYTES))
        raw = read_bytes(path, size + 1)
        if len(raw) > size:
            raise DataError("%s: longer than the %d bytes its header promises (dimensions %s)"
                            % (path, size, "x".join(str(d) for d in dims)))
        return raw
    return head                     # parse_idx says what is wrong with it


def read_cifar(path):
    """A CIFAR-10 batch file's bytes, at most CIFAR_MAX_RECORDS records (and one byte
    more, to tell a longer file)."""
    raw = read_bytes(path, CIFAR_MAX_RECORDS * CIFAR_RECORD + 1)
    if len(raw) > CIFAR_MAX_RECORDS * CIFAR_RECORD:
        raise DataError("%s: more than %d records" % (path, CIFAR_MAX_RECORDS))
    return raw


def parse_idx(path, raw):
    """Header of an IDX file: (magic, dims) after checking sizes; raises DataError."""
    if len(raw) < 8:
        raise DataError("%s: too short for an IDX header (%d bytes)" % (path, len(raw)))
    magic, count = struct.unpack(">ii", raw[:8])
    if magic == IDX_IMAGES_MAGIC:
        if len(raw) < 16:
            raise DataError("%s: truncated IDX image header" % path)
        rows, cols = struct.unpack(">ii", raw[8:16])
        dims, header = (count, rows, cols), 16
    elif magic == IDX_LABELS_MAGIC:
        dims, header = (count,), 8
    else:
        raise DataError("%s: bad magic number %d (expected %d or %d)"
                        % (path, magic, IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC))
    expected = header + _product(dims)
    if len(raw) != expected:
        raise DataError("%s: %d bytes, expected %d for dimensions %s"
                        % (path, len(raw), expected, "x".join(str(d) for d in dims)))
    return magic, dims


def _product(dims):
    n = 1
    for d in dims:
        n *= d
    return n


def idx_array(path):
    import numpy as np
    raw = read_idx(path)
    _, dims = parse_idx(path, raw)
    header = 16 if len(dims) == 3 else 8
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def check_cifar(path, raw):
    if len(raw) == 0 or len(raw) % CIFAR_RECORD:
        raise DataError("%s: %d bytes is not a whole number of %d-byte records"
                        % (path, len(raw), CIFAR_RECORD))
    return len(raw) // CIFAR_RECORD


def cifar_arrays(paths):
    import numpy as np
    parts = []
    for path in paths:
        raw = read_cifar(path)
        check_cifar(path, raw)
        parts.append(np.frombuffer(raw, dtype=np.uint8).reshape(-1, CIFAR_RECORD))
    records = np.concatenate(parts)
    return records[:, 1:].reshape(-1, 3, 32, 32), records[:, 0].astype(np.int64)


def load(dataset, data_dir, splits=("train", "test")):
    """The data set's splits as numpy arrays (``<split>_images``, ``<split>_labels``).

    Images are uint8, MNIST as N x 28 x 28 and CIFAR-10 as N x 3 x 32 x 32
    (channel-first, as stored); labels are int64.
    """
    arrays = {}
    if dataset == "mnist":
        root = os.path.join(data_dir, "mnist")
        for key, name in MNIST_FILES.items():
            if key.split("_")[0] in splits:
                arrays[key] = idx_array(find(root, name))
                if key.endswith("_labels"):
                    arrays[key] = arrays[key].astype("int64")
        return arrays
    if dataset == "cifar10":
        root = os.path.join(data_dir, "cifar10", CIFAR_DIR)
        for split, names in (("train", CIFAR_TRAIN), ("test", CIFAR_TEST)):
            if split in splits:
                arrays[split + "_images"], arrays[split + "_labels"] = \
                    cifar_arrays([find(root, n) for n in names])
        return arrays
    raise DataError("unknown data set %r" % dataset)


def test_split(dataset, data_dir):
    """The test images and labels alone (the host's migration check)."""
    arrays = load(dataset, data_dir, ("test",))
    return arrays["test_images"], arrays["test_labels"]
