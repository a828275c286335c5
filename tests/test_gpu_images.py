"""The MXNet and Theano GPU images: built with `dlbench build-images --variant gpu`, labelled
with their CUDA and cuDNN, and holding CUDA builds of their frameworks. No GPU is needed: the
checks import the frameworks and ask them what they were built with.

These images are large (several GB each) and take long to build, so this module is skipped
unless ``DLBENCH_GPU_IMAGES=1`` is set or Docker sees a GPU (a working ``nvidia-smi`` on the
host and Docker's ``nvidia`` runtime): a plain ``.ci/run`` does not build them.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from orchestrator import build, hostinfo
from conftest import dlbench

pytestmark = [pytest.mark.docker, pytest.mark.gpu_image]


def docker_sees_a_gpu() -> bool:
    if not hostinfo.gpu_count():
        return False
    try:
        import docker
        return "nvidia" in (docker.from_env().info().get("Runtimes") or {})
    except Exception:
        return False


if os.environ.get("DLBENCH_GPU_IMAGES") != "1" and not docker_sees_a_gpu():
    pytest.skip("GPU images are built only with DLBENCH_GPU_IMAGES=1 or where Docker sees a GPU",
                allow_module_level=True)

# Where the MXNet GPU image keeps its stand-in libcuda.so.1 (libmxnet.so needs one to load).
CUDA_STUB = "/opt/dlbench/cuda-stub"


@pytest.fixture(scope="module")
def gpu_image():
    """``gpu_image(framework)``: its GPU image, built (or found up to date) once a module."""
    import docker
    client, done = docker.from_env(), {}

    def image(framework: str):
        if framework not in done:
            dlbench("build-images", "--frameworks", framework, "--variant", "gpu", check=True,
                    timeout=3 * 3600)
            done[framework] = client.images.get(build.image_tag(framework, "gpu"))
        return done[framework]
    return image


def run_in(image, script: str, environment: dict | None = None) -> str:
    """Run a Python script in the image (no network, no GPU); its stdout."""
    import docker
    out = docker.from_env().containers.run(
        image.id, ["-c", textwrap.dedent(script)], entrypoint=["python3"], remove=True,
        network_mode="none", environment={"HOME": "/tmp", **(environment or {})})
    return out.decode()


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("framework", ["mxnet", "theano"])
def test_the_gpu_image_is_labelled_with_its_cuda_and_cudnn(gpu_image, framework):
    info = build.variant_info(framework, "gpu")
    labels = gpu_image(framework).labels
    assert labels["org.dlbench.variant"] == "gpu"
    assert labels["org.dlbench.framework"] == framework
    assert labels["org.dlbench.framework-version"] == info["version"]
    assert labels["org.dlbench.cuda"] == info["cuda"] != "none"
    assert labels["org.dlbench.cudnn"] == info["cudnn"]


def test_mxnet_is_a_cuda_build_with_cudnn_and_nccl(gpu_image):
    image = gpu_image("mxnet")
    out = run_in(image, """
        import json, subprocess
        import mxnet as mx
        lib = mx.libinfo.find_lib_path()[0]
        features = mx.runtime.Features()
        print(json.dumps({
            "version": mx.__version__, "gpus": mx.context.num_gpus(),
            "enabled": sorted(f.name for f in mx.runtime.feature_list() if f.enabled),
            "missing": [line.strip() for line in subprocess.run(
                ["ldd", lib], capture_output=True, text=True).stdout.splitlines()
                if "not found" in line]}))
    """, {"LD_LIBRARY_PATH": CUDA_STUB})
    found = last_json(out)
    assert found["version"] == build.variant_info("mxnet", "gpu")["version"]
    assert found["gpus"] == 0                   # no GPU here; the stand-in driver says so
    assert {"CUDA", "CUDNN", "NCCL"} <= set(found["enabled"])
    assert found["missing"] == []               # every CUDA library it links is in the image


def test_mxnet_without_a_driver_names_libcuda(gpu_image):
    """Without a GPU (no driver mounted) and without the stand-in, the import fails on libcuda."""
    import docker.errors
    with pytest.raises(docker.errors.ContainerError) as error:
        run_in(gpu_image("mxnet"), "import mxnet")
    assert "libcuda.so.1" in error.value.stderr.decode()


def test_theano_has_its_gpuarray_back_end_and_nvcc(gpu_image):
    image = gpu_image("theano")
    out = run_in(image, """
        import json, os, subprocess
        import pygpu
        import theano
        import theano.gpuarray
        def run(*command):
            return subprocess.run(command, capture_output=True, text=True, check=True).stdout
        print(json.dumps({
            "theano": theano.__version__, "pygpu": pygpu.__version__,
            "nvcc": [line for line in run("nvcc", "--version").splitlines() if "release" in line][0],
            "archs": run("nvcc", "--list-gpu-arch").split(),
            "libcuda": os.readlink("/usr/lib/x86_64-linux-gnu/libcuda.so"),
            "libcuda1": subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}", "libcuda1"],
                                       capture_output=True, text=True).stdout}))
    """)
    found = last_json(out)
    assert found["theano"].startswith("1.0.5")
    assert "release 11.2" in found["nvcc"]
    assert "compute_35" in found["archs"] and "compute_86" in found["archs"]
    # the host's driver is the only libcuda: Debian's libcuda1 is gone, and libgpuarray's
    # "libcuda.so" leads to the libcuda.so.1 a GPU job's container gets from the host
    assert found["libcuda"] == "libcuda.so.1" and found["libcuda1"] != "installed"
