"""The Caffe GPU image: Debian's caffe source built with CUDA 11.2 (images/caffe/Dockerfile.gpu).

The build compiles Caffe with nvcc (tens of minutes), so these tests run only where asked
(DLBENCH_GPU_IMAGES=1) or where Docker can use a GPU.  Without a GPU they check what can be
checked without one: libcaffe links the CUDA run-time libraries, pycaffe imports, and the
image trains LeNet on the CPU (``--variant gpu`` runs CPU jobs in the GPU image).  With a
GPU, the same job also trains on it.
"""

from __future__ import annotations

import json
import os

import docker
import pandas as pd
import pytest

from conftest import dlbench
from orchestrator import hostinfo

pytestmark = [pytest.mark.docker, pytest.mark.gpu_image]

IMAGE = "dlbench/caffe:gpu"
LIBCAFFE = "/usr/lib/x86_64-linux-gnu/libcaffe.so.1.0.0"
CHECK = """
import caffe, numpy as np
caffe.set_mode_cpu()
net = caffe.Net('/tmp/net.prototxt', caffe.TEST)
net.blobs['data'].data[...] = np.arange(6, dtype=np.float32).reshape(2, 3)
net.params['ip'][0].data[...] = 1
net.params['ip'][1].data[...] = 0.5
print(net.forward()['ip'].tolist())
"""
NET = ('layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }\n'
       'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
       'inner_product_param { num_output: 1 } }\n')


@pytest.fixture(scope="module")
def gpus() -> int:
    count = hostinfo.gpu_count() or 0
    if not count and os.environ.get("DLBENCH_GPU_IMAGES") != "1":
        pytest.skip("builds the Caffe GPU image: set DLBENCH_GPU_IMAGES=1, or run where Docker sees a GPU")
    return count


@pytest.fixture(scope="module")
def image(gpus):
    dlbench("build-images", "--frameworks", "caffe", "--variant", "gpu", check=True, timeout=7200)
    return docker.from_env().images.get(IMAGE)


def shell(image, script: str) -> str:
    client = docker.from_env()
    out = client.containers.run(image.id, ["-c", script], entrypoint="sh", remove=True,
                                network_disabled=True, stderr=False)   # glog writes to stderr
    return out.decode()


def test_the_image_is_labelled_with_its_cuda(image):
    labels = image.labels
    assert labels["org.dlbench.cuda"] == "11.2"
    assert labels["org.dlbench.variant"] == "gpu"
    assert labels["org.dlbench.framework-version"] == "1.0.0+git20180821.99bd997-8"


def test_libcaffe_links_the_cuda_libraries_and_nothing_is_missing(image):
    out = shell(image, f"ldd {LIBCAFFE} $(python3 -c 'import caffe._caffe as c; print(c.__file__)')")
    for library in ("libcudart.so.11.0", "libcublas.so.11", "libcurand.so.10", "libblas.so.3"):
        assert library in out, out
    assert "not found" not in out, out


def test_pycaffe_imports_and_runs_a_net_on_the_cpu(image):
    out = shell(image, f"printf '{NET}' > /tmp/net.prototxt && python3 -c \"{CHECK}\"")
    # x @ ones + 0.5: rows (0, 1, 2) and (3, 4, 5)
    assert out.strip().splitlines()[-1] == "[[3.5], [12.5]]", out


def test_lenet_trains_on_the_cpu_in_the_gpu_image(image, data_root, tmp_path):
    results = tmp_path / "results"
    proc = dlbench("run", "--frameworks", "caffe", "--datasets", "mnist", "--profile", "quick",
                   "--variant", "gpu", "--results", results, "--data-dir", data_root, check=True)
    row = pd.read_parquet(results / "runs").iloc[0]
    assert row["status"] == "ok", (row["error"], proc.stderr)
    assert row["device"] == "cpu" and row["image"] == IMAGE and row["image_id"] == image.id
    assert row["accuracy"] > 0.9
    libraries = json.loads(row["libraries"])
    assert libraries["caffe_build"] == "cuda" and libraries["cuda"] == "11.2"


def test_lenet_trains_on_the_gpu(image, gpus, data_root, tmp_path):
    if not gpus:
        pytest.skip("needs an NVIDIA GPU that Docker can use")
    results = tmp_path / "results"
    proc = dlbench("run", "--frameworks", "caffe", "--datasets", "mnist", "--profile", "quick",
                   "--gpu", "0", "--results", results, "--data-dir", data_root, check=True)
    row = pd.read_parquet(results / "runs").iloc[0]
    assert row["status"] == "ok", (row["error"], proc.stderr)
    assert row["device"] == "cuda" and row["accuracy"] > 0.9
    assert row["device_name"] and row["device_name"] == row["gpu_name"]
