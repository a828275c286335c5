"""The GPU images: built with `dlbench build-images --variant gpu`, labelled with their CUDA and
cuDNN, holding CUDA builds of their frameworks, and training the quick profile on the CPU
through the same adapter code (`dlbench run --variant gpu`).  No GPU is needed for that: the
checks ask each framework what it was built with.  Where Docker sees a GPU, each also trains
on it.

These images are large (several GB each; Caffe's compiles with nvcc for a quarter of an hour
on two cores, Lua Torch7's cutorch and cunn for much longer), so this module is skipped unless ``DLBENCH_GPU_IMAGES=1`` is set or Docker
sees a GPU (an NVIDIA driver on the host and Docker's ``nvidia`` runtime): a plain
``.ci/run`` does not build them.
"""

from __future__ import annotations

import json
import os
import textwrap

import docker
import pandas as pd
import pytest

from conftest import dlbench
from orchestrator import build, catalog, hostinfo

pytestmark = [pytest.mark.docker, pytest.mark.gpu_image]

FRAMEWORKS = ["caffe", "mxnet", "theano", "torch", "pytorch", "tensorflow"]
CUDA_STUB = "/opt/dlbench/cuda-stub"       # the MXNet image's stand-in libcuda.so.1


def docker_sees_a_gpu() -> bool:
    if not hostinfo.gpu_count():
        return False
    try:
        return "nvidia" in (docker.from_env().info().get("Runtimes") or {})
    except Exception:  # noqa: BLE001 - no daemon: no GPU for containers
        return False


GPU = docker_sees_a_gpu()
if os.environ.get("DLBENCH_GPU_IMAGES") != "1" and not GPU:
    pytest.skip("GPU images are built only with DLBENCH_GPU_IMAGES=1 or where Docker sees a GPU",
                allow_module_level=True)


@pytest.fixture(scope="module")
def gpu_image(sources_root):
    """``gpu_image(framework)``: its GPU image, built (or found up to date) once a module
    (Lua Torch7's from the local source mirror, never GitHub)."""
    client, done = docker.from_env(), {}

    def image(framework: str):
        if framework not in done:
            dlbench("build-images", "--frameworks", framework, "--variant", "gpu",
                    "--sources", sources_root, check=True, timeout=6 * 3600)
            done[framework] = client.images.get(build.image_tag(framework, "gpu"))
        return done[framework]
    return image


def run_in(image, script: str, environment: dict | None = None) -> str:
    """Run a Python script in the image (no network, no GPU); its stdout."""
    out = docker.from_env().containers.run(
        image.id, ["-c", textwrap.dedent(script)], entrypoint=["python3"], remove=True,
        network_mode="none", stderr=False, environment={"HOME": "/tmp", **(environment or {})})
    return out.decode()


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def quick_mnist(results, data_root, sources_root, *device) -> pd.Series:
    """The framework's quick MNIST job through `dlbench run`; its row."""
    proc = dlbench("run", "--datasets", "mnist", "--profile", "quick", *device, "--results", results,
                   "--data-dir", data_root, "--sources", sources_root, check=True)
    row = pd.read_parquet(results / "runs").iloc[0]
    assert row["status"] == "ok", (row["error"], proc.stderr)
    return row


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_gpu_image_is_labelled_with_its_cuda_and_cudnn(gpu_image, framework):
    info = catalog.variant_info(framework, "gpu")
    labels = gpu_image(framework).labels
    assert labels["org.dlbench.variant"] == "gpu"
    assert labels["org.dlbench.framework"] == framework
    assert labels["org.dlbench.framework-version"] == info["version"]
    assert labels["org.dlbench.cuda"] == info["cuda"] != "none"
    assert labels["org.dlbench.cudnn"] == info["cudnn"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_quick_profile_trains_on_the_cpu_in_the_gpu_image(gpu_image, framework, data_root,
                                                              sources_root, tmp_path):
    image = gpu_image(framework)
    row = quick_mnist(tmp_path / "results", data_root, sources_root,
                      "--frameworks", framework, "--variant", "gpu")
    assert row["device"] == "cpu" and row["image_id"] == image.id
    assert row["image"] == build.image_tag(framework, "gpu")
    assert row["accuracy"] > 0.85


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_quick_profile_trains_on_the_gpu(gpu_image, framework, data_root, sources_root, tmp_path):
    if not GPU:
        pytest.skip("needs an NVIDIA GPU that Docker can use")
    gpu_image(framework)
    row = quick_mnist(tmp_path / "results", data_root, sources_root,
                      "--frameworks", framework, "--gpu", "0")
    assert row["device"] == "cuda" and row["accuracy"] > 0.85
    assert row["gpu_name"] and row["gpu_driver"] and row["gpu_memory_total_bytes"] > 0
    assert pd.notna(row["gpu_util_mean"]) and row["gpu_memory_peak_bytes"] > 0


def test_caffe_links_the_cuda_libraries_and_runs_a_net(gpu_image):
    out = run_in(gpu_image("caffe"), """
        import json, subprocess
        import numpy as np
        import caffe, caffe._caffe
        with open("/tmp/net.prototxt", "w") as f:
            f.write('layer { name: "data" type: "Input" top: "data" '
                    'input_param { shape { dim: 2 dim: 3 } } }\\n'
                    'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                    'inner_product_param { num_output: 1 } }\\n')
        caffe.set_mode_cpu()
        net = caffe.Net("/tmp/net.prototxt", caffe.TEST)
        net.blobs["data"].data[...] = np.arange(6, dtype=np.float32).reshape(2, 3)
        net.params["ip"][0].data[...] = 1
        net.params["ip"][1].data[...] = 0.5
        ldd = subprocess.run(["ldd", "/usr/lib/x86_64-linux-gnu/libcaffe.so.1.0.0",
                              caffe._caffe.__file__], capture_output=True, text=True).stdout
        print(json.dumps({"forward": net.forward()["ip"].tolist(), "ldd": ldd}))
    """)
    found = last_json(out)
    assert found["forward"] == [[3.5], [12.5]]          # x @ ones + 0.5 for rows 0-2 and 3-5
    for library in ("libcudart.so.11.0", "libcublas.so.11", "libcurand.so.10", "libblas.so.3"):
        assert library in found["ldd"]
    assert "not found" not in found["ldd"]


def test_mxnet_is_a_cuda_build_with_cudnn_and_nccl(gpu_image):
    out = run_in(gpu_image("mxnet"), """
        import json, subprocess
        import mxnet as mx
        lib = mx.libinfo.find_lib_path()[0]
        print(json.dumps({
            "version": mx.__version__, "gpus": mx.context.num_gpus(),
            "enabled": sorted(f.name for f in mx.runtime.feature_list() if f.enabled),
            "missing": [line.strip() for line in subprocess.run(
                ["ldd", lib], capture_output=True, text=True).stdout.splitlines()
                if "not found" in line]}))
    """, {"LD_LIBRARY_PATH": CUDA_STUB})
    found = last_json(out)
    assert found["version"] == catalog.variant_info("mxnet", "gpu")["version"]
    assert found["gpus"] == 0                   # no GPU here; the stand-in driver says so
    assert {"CUDA", "CUDNN", "NCCL"} <= set(found["enabled"])
    assert found["missing"] == []               # every CUDA library it links is in the image


def test_mxnet_without_a_driver_names_libcuda(gpu_image):
    """Without a driver, and without the stand-in the adapter loads, the import fails on
    libcuda: the stand-in is not on the library path, where it could shadow a real driver."""
    if GPU:
        pytest.skip("Docker gives containers a driver here")
    with pytest.raises(docker.errors.ContainerError) as error:
        run_in(gpu_image("mxnet"), "import mxnet")
    assert "libcuda.so.1" in error.value.stderr.decode()


def test_theano_has_its_gpuarray_back_end_and_nvcc(gpu_image):
    out = run_in(gpu_image("theano"), """
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


def test_lua_torch7_has_cutorch_and_cunn_built_with_cuda(gpu_image):
    out = run_in(gpu_image("torch"), """
        import glob, json, subprocess
        def run(*command):
            return subprocess.run(command, capture_output=True, text=True)
        libraries = sorted(glob.glob("/opt/torch/lib/libTHC*.so") + glob.glob("/opt/torch/lib/lua/5.1/lib*.so"))
        cutorch, cunn = run("th", "-e", "require 'cutorch'"), run("th", "-e", "require 'cunn'")
        print(json.dumps({
            "libraries": [path.rsplit("/", 1)[1] for path in libraries],
            "ldd": run("ldd", *libraries).stdout,
            "rocks": sorted(glob.glob("/opt/torch/lib/luarocks/rocks/cu*/*")),
            "cutorch": [cutorch.returncode, cutorch.stderr + cutorch.stdout],
            "cunn": [cunn.returncode, cunn.stderr + cunn.stdout]}))
    """)
    found = last_json(out)
    # cutorch's THC and Lua module, cunn's THCUNN (its Lua side binds it through the FFI)
    assert {"libTHC.so", "libcutorch.so", "libTHCUNN.so"} <= set(found["libraries"])
    for library in ("libcublas.so.11", "libcusparse.so.11"):   # the CUDA runtime is static
        assert library in found["ldd"]
    assert "not found" not in found["ldd"]
    assert found["rocks"] == ["/opt/torch/lib/luarocks/rocks/cunn/scm-1",
                              "/opt/torch/lib/luarocks/rocks/cutorch/scm-1"]
    # loading cutorch (and so cunn) asks the CUDA runtime for the driver's devices: here,
    # with no driver, it says so (error 35), after every library has loaded (th -e prints
    # the error and exits 0)
    for name in ("cutorch", "cunn"):
        assert "cuda runtime error (35) : CUDA driver version is insufficient" in found[name][1]
