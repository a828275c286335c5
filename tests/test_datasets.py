"""Data set verification and download, on the real files and damaged copies of them."""

from __future__ import annotations

import gzip
import hashlib
import os
import http.server
import shutil
import threading
from functools import partial
from pathlib import Path

import pytest

from orchestrator import datasets
from orchestrator.errors import DatasetError


def test_real_mnist_is_verified_and_official(data_root):
    info = datasets.verify("mnist", data_root)
    assert info.samples == {"train": 60000, "test": 10000}
    assert info.official is True
    assert len(info.sha256) == 64


def test_real_cifar10_is_verified(data_root):
    info = datasets.verify("cifar10", data_root)
    assert info.samples == {"train": 50000, "test": 10000}


def copy_mnist(data_root: Path, tmp_path: Path, decompress=()) -> Path:
    root = tmp_path / "data"
    shutil.copytree(data_root / "mnist", root / "mnist")
    for name in decompress:
        gz = root / "mnist" / f"{name}.gz"
        (root / "mnist" / name).write_bytes(gzip.decompress(gz.read_bytes()))
        gz.unlink()
    return root


def test_plain_and_compressed_copies_have_the_same_identity(data_root, tmp_path):
    plain = copy_mnist(data_root, tmp_path, decompress=["t10k-labels-idx1-ubyte", "t10k-images-idx3-ubyte"])
    assert datasets.verify("mnist", plain).sha256 == datasets.verify("mnist", data_root).sha256


def damage(root: Path, name: str, edit) -> Path:
    path = root / "mnist" / name
    raw = bytearray(gzip.decompress((root / "mnist" / f"{name}.gz").read_bytes()))
    (root / "mnist" / f"{name}.gz").unlink()
    path.write_bytes(bytes(edit(raw)))
    return path


def _set(raw, index, value):
    raw[index] = value
    return raw


@pytest.mark.parametrize("name, edit, message", [
    ("t10k-images-idx3-ubyte", lambda raw: raw[:-100], "bytes, expected 7840016"),
    ("t10k-images-idx3-ubyte", lambda raw: _set(raw, 2, 9), "bad magic number"),
    ("t10k-labels-idx1-ubyte", lambda raw: _set(raw, 8, (raw[8] + 1) % 10), "per-class counts"),
    ("t10k-labels-idx1-ubyte", lambda raw: _set(raw, 8, 12), "label 12 out of range"),
    ("train-labels-idx1-ubyte", lambda raw: raw[:8] + raw[9:], "bytes, expected 60008"),
])
def test_damaged_mnist_is_refused_naming_the_file(data_root, tmp_path, name, edit, message):
    root = copy_mnist(data_root, tmp_path)
    path = damage(root, name, edit)
    with pytest.raises(DatasetError, match=message) as err:
        datasets.verify("mnist", root)
    assert str(path) in str(err.value)


def test_missing_and_truncated_gzip_files_are_named(data_root, tmp_path):
    root = copy_mnist(data_root, tmp_path)
    gz = root / "mnist" / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:5000])
    with pytest.raises(DatasetError, match="train-images-idx3-ubyte.gz: cannot read"):
        datasets.verify("mnist", root)
    gz.unlink()
    with pytest.raises(DatasetError, match="train-images-idx3-ubyte.*missing"):
        datasets.verify("mnist", root)
    with pytest.raises(DatasetError, match="no such directory"):
        datasets.verify("cifar10", root)


def test_damaged_cifar10_is_refused(data_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_root / "cifar10", root / "cifar10")
    batch = root / "cifar10" / "cifar-10-batches-bin" / "test_batch.bin.gz"
    raw = gzip.decompress(batch.read_bytes())
    batch.write_bytes(gzip.compress(raw[:-3073], compresslevel=1))
    with pytest.raises(DatasetError, match="test_batch.bin.gz: 9999 records, expected 10000"):
        datasets.verify("cifar10", root)


@pytest.fixture
def mirror(data_root):
    """A real HTTP server on loopback serving the MNIST archives."""
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(data_root / "mnist"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def mnist_downloads(data_root, mirrors, corrupt=None):
    items = []
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        md5 = hashlib.md5((data_root / "mnist" / name).read_bytes()).hexdigest()
        items.append(datasets.Download(name, "0" * 32 if name == corrupt else md5, tuple(mirrors)))
    return tuple(items)


def test_download_checks_checksums_and_structure(data_root, tmp_path, mirror):
    info = datasets.download("mnist", tmp_path / "cache",
                             downloads=mnist_downloads(data_root, ["http://127.0.0.1:9/", mirror]))
    assert info.path == tmp_path / "cache" / "mnist"
    assert info.sha256 == datasets.verify("mnist", data_root).sha256


def test_download_with_a_bad_checksum_leaves_nothing(data_root, tmp_path, mirror):
    with pytest.raises(DatasetError, match="t10k-labels-idx1-ubyte.gz: .*MD5"):
        datasets.download("mnist", tmp_path / "cache",
                          downloads=mnist_downloads(data_root, [mirror], corrupt="t10k-labels-idx1-ubyte.gz"))
    assert not (tmp_path / "cache" / "mnist").exists()


def test_import_copies_a_verified_copy_into_the_cache(data_root, tmp_path):
    info = datasets.import_copy("mnist", data_root, tmp_path / "cache")
    assert info.official and (tmp_path / "cache" / "mnist" / "t10k-labels-idx1-ubyte.gz").is_file()


def test_a_verified_copy_is_remembered_until_its_files_change(data_root, tmp_path, monkeypatch):
    """`dlbench run` does not read an unchanged data set again; a changed file is read
    (and here refused) as if never seen."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    copy = copy_mnist(data_root, tmp_path, decompress=["t10k-labels-idx1-ubyte"])
    first = datasets.verify_remembered("mnist", copy)
    assert (tmp_path / "cache" / "dlbench" / datasets.VERIFIED_RECORD).is_file()
    labels = copy / "mnist" / "t10k-labels-idx1-ubyte"
    raw = bytearray(labels.read_bytes())
    raw[8] = (raw[8] + 1) % 10
    labels.write_bytes(bytes(raw))                  # same size, a new modification time
    os.utime(labels, ns=(labels.stat().st_atime_ns, labels.stat().st_mtime_ns + 1))
    with pytest.raises(DatasetError, match="per-class counts"):
        datasets.verify_remembered("mnist", copy)
    assert datasets.verify_remembered("mnist", data_root).sha256 == first.sha256   # the original
    assert datasets.verify_remembered("mnist", data_root) == datasets.verify("mnist", data_root)
