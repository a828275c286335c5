"""Compiles, at image build time, the C modules Theano generates for this image's jobs, into
WARM (``adapter.WARM_COMPILEDIR``), which every job copies into its own fresh compile
directory before it imports Theano: a job then compiles only what is missing (48 to 80 s of
g++ a job on two cores otherwise, outside the timed spans but in every job's wall time).

It runs the runner's quick job of each model, with its checks after training, on a few
hundred synthetic images in the canonical file layout (the build has no data set): the same
networks, batch sizes, number type and compiler flags as a real job on this machine, so the
same modules.  Theano keys each module by its code and its compiler flags (g++'s
``-march=native`` among them), so a job on another CPU, or with another thread count
(OpenMP on or off), finds fewer of them and compiles the rest, as without this.

    python3 warm.py FRAMEWORK_DIR
"""

import gzip
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy
from dlbench_runner import contract

sys.path.insert(0, sys.argv[1])
from adapter import WARM_COMPILEDIR, compile_directory  # noqa: E402

LOCKS = "lock_dir"      # Theano's lock, never copied
SCRATCH = "/compile"    # a job's $DLBENCH_COMPILE_DIR in its container (runtimes/docker.py)


def idx(path, array):
    """An IDX file (MNIST's format): big-endian magic, dimensions, unsigned bytes."""
    with gzip.open(path + ".gz", "wb") as f:
        f.write(struct.pack(">HBB", 0, 8, array.ndim))
        f.write(struct.pack(">" + "I" * array.ndim, *array.shape))
        f.write(array.astype("uint8").tobytes())


def synthetic_data(root, rng):
    mnist = os.path.join(root, "mnist")
    os.makedirs(mnist)
    for split, n in (("train", 1500), ("t10k", 500)):
        idx(os.path.join(mnist, "%s-images-idx3-ubyte" % split), rng.integers(0, 256, (n, 28, 28)))
        idx(os.path.join(mnist, "%s-labels-idx1-ubyte" % split), rng.integers(0, 10, n))
    cifar = os.path.join(root, "cifar10", "cifar-10-batches-bin")
    os.makedirs(cifar)
    for name in ["data_batch_%d.bin" % i for i in range(1, 6)] + ["test_batch.bin"]:
        records = numpy.concatenate([rng.integers(0, 10, (100, 1)),
                                     rng.integers(0, 256, (100, 3 * 32 * 32))], axis=1)
        with open(os.path.join(cifar, name), "wb") as f:
            f.write(records.astype("uint8").tobytes())


def main():
    framework_dir = sys.argv[1]
    work = tempfile.mkdtemp()
    try:
        synthetic_data(os.path.join(work, "data"), numpy.random.default_rng(1))
        # the job's own path (Theano keys a module by the path it was compiled in)
        os.makedirs(SCRATCH)
        env = dict(os.environ, DLBENCH_COMPILE_DIR=SCRATCH, DLBENCH_NO_WARM_COMPILEDIR="1")
        # LeNet5 holds out validation_images of what it is given: 500 of the 1,500 here
        for dataset, settings in (("mnist", ["validation_images=500"]), ("cifar10", [])):
            os.makedirs(os.path.join(work, "out-" + dataset))
            subprocess.run([sys.executable, "-m", "dlbench_runner", "--framework-dir", framework_dir,
                            "--data", os.path.join(work, "data"), "--out", os.path.join(work, "out-" + dataset),
                            "--dataset", dataset, "--profile", contract.QUICK_PROFILE,
                            "--threads", str(os.cpu_count()),
                            *[arg for s in settings for arg in ("--set", s)]], env=env, check=True)
        shutil.copytree(compile_directory(SCRATCH), WARM_COMPILEDIR, ignore=shutil.ignore_patterns(LOCKS))
    finally:
        shutil.rmtree(work)
        shutil.rmtree(SCRATCH, ignore_errors=True)
    # Theano made its module directories private (mkdtemp); a job runs as another user
    for directory, _, files in os.walk(WARM_COMPILEDIR):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)
    modules = sum(len(os.listdir(os.path.join(WARM_COMPILEDIR, d))) for d in os.listdir(WARM_COMPILEDIR))
    print("warm.py: %d compiled modules in %s" % (modules, WARM_COMPILEDIR))


if __name__ == "__main__":
    main()
