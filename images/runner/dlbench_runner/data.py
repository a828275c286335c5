"""Readers for the canonical MNIST (IDX) and CIFAR-10 (binary version) files.

Each file may be stored plain or gzip-compressed (``name`` or ``name.gz``).
The header parsing is shared with the host, which verifies data sets with it;
only the array readers need numpy.
"""

import gzip
import os
import struct

IDX_IMAGES_MAGIC = 2051
IDX_LABELS_MAGIC = 2049
CIFAR_RECORD = 1 + 3 * 32 * 32

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


def read_bytes(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            return f.read()
    except (OSError, EOFError) as exc:
        raise DataError("%s: cannot read: %s" % (path, exc))


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
    raw = read_bytes(path)
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
        raw = read_bytes(path)
        check_cifar(path, raw)
        parts.append(np.frombuffer(raw, dtype=np.uint8).reshape(-1, CIFAR_RECORD))
    records = np.concatenate(parts)
    return records[:, 1:].reshape(-1, 3, 32, 32), records[:, 0].astype(np.int64)


def load(dataset, data_dir):
    """The whole data set as numpy arrays.

    Images are uint8, MNIST as N x 28 x 28 and CIFAR-10 as N x 3 x 32 x 32
    (channel-first, as stored); labels are int64.
    """
    if dataset == "mnist":
        root = os.path.join(data_dir, "mnist")
        arrays = {key: idx_array(find(root, name)) for key, name in MNIST_FILES.items()}
        for key in ("train_labels", "test_labels"):
            arrays[key] = arrays[key].astype("int64")
        return arrays
    if dataset == "cifar10":
        root = os.path.join(data_dir, "cifar10", CIFAR_DIR)
        train_x, train_y = cifar_arrays([find(root, n) for n in CIFAR_TRAIN])
        test_x, test_y = cifar_arrays([find(root, n) for n in CIFAR_TEST])
        return {"train_images": train_x, "train_labels": train_y,
                "test_images": test_x, "test_labels": test_y}
    raise DataError("unknown data set %r" % dataset)
