"""MNIST and CIFAR-10 on the host: where they come from, and proof that they are whole.

A data root holds the canonical layout::

    ROOT/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]
    ROOT/cifar10/cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin[.gz]

It is either a local copy the user names (``--data-dir`` or DLBENCH_DATA_DIR),
or the user cache, filled by downloading the official archives from their
canonical mirrors and checking them against the published MD5 sums.  Every
copy is verified structurally before use: magic numbers, sizes, record and
per-class counts.  The data set's identity is the SHA-256 of its decompressed
files, the same for a plain and a gzip-compressed copy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

from dlbench_runner.contract import formats

from . import cache
from .errors import DatasetError

MNIST_COUNTS = {
    "train": (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949),
    "test": (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009),
}
# MD5 of the decompressed official IDX files: a copy matching these is the original.
MNIST_OFFICIAL_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}


@dataclasses.dataclass(frozen=True)
class Download:
    """One official archive: its name, MD5 and the mirrors that serve it."""

    filename: str
    md5: str
    mirrors: tuple[str, ...]


MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
DOWNLOADS = {
    "mnist": (
        Download("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873", MNIST_MIRRORS),
        Download("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432", MNIST_MIRRORS),
        Download("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3", MNIST_MIRRORS),
        Download("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c", MNIST_MIRRORS),
    ),
    "cifar10": (
        Download("cifar-10-binary.tar.gz", "c32a1d4ab5d03f1284b67883e8d87530",
                 ("https://www.cs.toronto.edu/~kriz/",)),
    ),
}


@dataclasses.dataclass(frozen=True)
class VerifiedDataset:
    name: str
    root: Path          # the data root; the data set is root / name
    sha256: str         # of the decompressed files, in canonical order
    samples: dict       # {"train": n, "test": n}
    official: bool | None   # byte-identical to the official files, where that is known

    @property
    def path(self) -> Path:
        return self.root / self.name


def cache_root() -> Path:
    return cache.folder("datasets")


def default_root(data_dir: str | os.PathLike | None) -> tuple[Path, bool]:
    """The data root to use, and whether it is a local copy (never written to)."""
    chosen = data_dir or os.environ.get("DLBENCH_DATA_DIR")
    if chosen:
        return Path(chosen).expanduser(), True
    return cache_root(), False


# -- verification ---------------------------------------------------------------

def _class_counts(path: str, labels: bytes, expected: tuple[int, ...]) -> None:
    counts = Counter(labels)
    bad = sorted(k for k in counts if k > 9)
    if bad:
        raise DatasetError(f"{path}: label {bad[0]} out of range 0-9")
    got = tuple(counts.get(k, 0) for k in range(10))
    if got != expected:
        raise DatasetError(f"{path}: per-class counts {list(got)}, expected {list(expected)}")


def _read(path: str, reader=formats.read_idx) -> bytes:
    try:
        return reader(path)
    except formats.DataError as exc:
        raise DatasetError(str(exc)) from None


def verify_mnist(root: Path) -> VerifiedDataset:
    directory = str(root / "mnist")
    digest, official = hashlib.sha256(), True
    samples = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images_name, labels_name = f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"
        try:
            images_path = formats.find(directory, images_name)
            labels_path = formats.find(directory, labels_name)
            images, labels = _read(images_path), _read(labels_path)
            magic, dims = formats.parse_idx(images_path, images)
            if magic != formats.IDX_IMAGES_MAGIC:
                raise DatasetError(f"{images_path}: holds labels (magic {magic}), not images")
            magic, label_dims = formats.parse_idx(labels_path, labels)
            if magic != formats.IDX_LABELS_MAGIC:
                raise DatasetError(f"{labels_path}: holds images (magic {magic}), not labels")
        except formats.DataError as exc:
            raise DatasetError(str(exc)) from None
        expected_n = sum(MNIST_COUNTS[split])
        if dims != (expected_n, 28, 28):
            raise DatasetError(f"{images_path}: dimensions {'x'.join(map(str, dims))}, "
                               f"expected {expected_n}x28x28")
        if label_dims != (expected_n,):
            raise DatasetError(f"{labels_path}: {label_dims[0]} labels, expected {expected_n}")
        _class_counts(labels_path, labels[8:], MNIST_COUNTS[split])
        for name, raw in ((images_name, images), (labels_name, labels)):
            digest.update(raw)
            official &= hashlib.md5(raw).hexdigest() == MNIST_OFFICIAL_MD5[name]
        samples[split] = expected_n
    return VerifiedDataset("mnist", root, digest.hexdigest(), samples, official)


def verify_cifar10(root: Path) -> VerifiedDataset:
    directory = str(root / "cifar10" / formats.CIFAR_DIR)
    digest = hashlib.sha256()
    samples = {}
    for split, names, per_class in (("train", formats.CIFAR_TRAIN, 5000), ("test", formats.CIFAR_TEST, 1000)):
        labels = bytearray()
        for name in names:
            try:
                path = formats.find(directory, name)
                raw = _read(path, formats.read_cifar)
                records = formats.check_cifar(path, raw)
            except formats.DataError as exc:
                raise DatasetError(str(exc)) from None
            if records != 10000:
                raise DatasetError(f"{path}: {records} records, expected 10000")
            labels += raw[::formats.CIFAR_RECORD]
            digest.update(raw)
        _class_counts(os.path.join(directory, names[0] if len(names) == 1 else "data_batch_*.bin"),
                      bytes(labels), (per_class,) * 10)
        samples[split] = len(labels)
    # The record order of a copy may differ from the official files, so only
    # the structure is proven here; a download is checked against the MD5 too.
    return VerifiedDataset("cifar10", root, digest.hexdigest(), samples, None)


VERIFIERS = {"mnist": verify_mnist, "cifar10": verify_cifar10}


def verify(name: str, root: Path) -> VerifiedDataset:
    if not (root / name).is_dir():
        raise DatasetError(f"{root / name}: no such directory (expected the {name} data set there)")
    return VERIFIERS[name](root)


# -- download and import --------------------------------------------------------

def _fetch(item: Download, directory: Path, progress=None) -> Path:
    """Fetch one archive from the first mirror that serves it whole."""
    import requests

    target = directory / item.filename
    errors = []
    for mirror in item.mirrors:
        url = mirror + item.filename
        partial = target.with_suffix(target.suffix + ".part")
        try:
            with requests.get(url, stream=True, timeout=60) as response:
                response.raise_for_status()
                total = int(response.headers.get("content-length") or 0)
                md5 = hashlib.md5()
                with open(partial, "wb") as f:
                    task = progress.add_task(item.filename, total=total or None) if progress else None
                    for chunk in response.iter_content(1 << 20):
                        f.write(chunk)
                        md5.update(chunk)
                        if progress:
                            progress.update(task, advance=len(chunk))
            if md5.hexdigest() != item.md5:
                errors.append(f"{url}: MD5 {md5.hexdigest()}, expected {item.md5}")
                partial.unlink()
                continue
            partial.replace(target)
            return target
        except (requests.RequestException, OSError) as exc:
            errors.append(f"{url}: {exc}")
            partial.unlink(missing_ok=True)
    raise DatasetError(f"cannot download {item.filename}: " + "; ".join(errors))


def download(name: str, root: Path | None = None, progress=None,
             downloads: tuple[Download, ...] | None = None) -> VerifiedDataset:
    """Download ``name`` into ``root`` (the user cache) and verify it."""
    root = root or cache_root()
    final = root / name
    with tempfile.TemporaryDirectory(dir=_mkdir(root), prefix=f".{name}-") as tmp:
        staging = Path(tmp) / name
        staging.mkdir()
        for item in downloads or DOWNLOADS[name]:
            archive = _fetch(item, staging, progress)
            if archive.name.endswith(".tar.gz"):
                _extract_cifar(archive, staging)
                archive.unlink()
        verify(name, Path(tmp))
        if final.exists():
            shutil.rmtree(final)
        staging.replace(final)
    return verify(name, root)


def _extract_cifar(archive: Path, into: Path) -> None:
    """Extract only the expected regular files of the binary archive."""
    wanted = {f"{formats.CIFAR_DIR}/{n}" for n in formats.CIFAR_TRAIN + formats.CIFAR_TEST}
    wanted.add(f"{formats.CIFAR_DIR}/batches.meta.txt")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name in wanted and m.isfile()]
        if len(members) != len(wanted):
            raise DatasetError(f"{archive}: lacks {sorted(wanted - {m.name for m in members})}")
        (into / formats.CIFAR_DIR).mkdir(exist_ok=True)
        for member in members:
            with tar.extractfile(member) as src, open(into / member.name, "wb") as dst:
                shutil.copyfileobj(src, dst)


def import_copy(name: str, source: Path, root: Path | None = None) -> VerifiedDataset:
    """Verify a local copy (a data root) and copy it into the cache."""
    verify(name, source)
    root = root or cache_root()
    final = root / name
    with tempfile.TemporaryDirectory(dir=_mkdir(root), prefix=f".{name}-") as tmp:
        shutil.copytree(source / name, Path(tmp) / name)
        if final.exists():
            shutil.rmtree(final)
        (Path(tmp) / name).replace(final)
    return verify(name, root)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


VERIFIED_RECORD = "verified-datasets.json"


def _signature(path: Path) -> list:
    """What identifies the files as they were verified: each one's name, size, mtime,
    inode, device and ctime.  The ctime (inode change time) is set by the kernel on every
    write and every change of the mtime, and cannot be set back by a user, so a file
    rewritten in place with its mtime restored no longer matches."""
    return sorted([str(p.relative_to(path)), s.st_size, s.st_mtime_ns, s.st_ino, s.st_dev,
                   s.st_ctime_ns] for p in path.rglob("*") if p.is_file() for s in [p.stat()])


def verify_remembered(name: str, root: Path) -> VerifiedDataset:
    """``verify``, remembered in the user cache: a data set whose files are the same ones
    (same names, sizes, modification and inode change times, inodes and devices) as when
    they were last verified is not read again.  ``dlbench datasets verify`` always reads
    everything."""
    record = cache.root() / VERIFIED_RECORD
    key = f"{name}:{(root / name).resolve()}"
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    signature = _signature(root / name) if (root / name).is_dir() else None
    entry = known.get(key) if isinstance(known, dict) else None
    if signature and isinstance(entry, dict) and entry.get("signature") == signature:
        return VerifiedDataset(name, root, entry["sha256"], entry["samples"], entry["official"])
    info = verify(name, root)
    known = known if isinstance(known, dict) else {}
    known[key] = {"signature": signature, "sha256": info.sha256, "samples": info.samples,
                  "official": info.official}
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f".{record.name}.{os.getpid()}")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, record)
    except OSError:
        pass            # remembering is an optimisation; a read-only cache just verifies again
    return info


def prepare(names: list[str], data_dir=None, progress=None) -> dict[str, VerifiedDataset]:
    """Every named data set, verified; the cache is filled by download where needed."""
    root, local = default_root(data_dir)
    prepared = {}
    for name in names:
        if local or (root / name).is_dir():
            prepared[name] = verify_remembered(name, root)
        else:
            prepared[name] = download(name, root, progress)
    return prepared
