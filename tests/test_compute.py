"""The compute libraries as axes: ``--blas`` (the BLAS library each job runs on, among
those its image holds side by side), ``--onednn`` (TensorFlow's and MXNet's oneDNN
kernels), what each row records as asked for and as loaded, and ``--settings-from
FRAMEWORK/DATASET`` (a framework's defaults for one data set used on the other)."""

from __future__ import annotations

import json
import math
import subprocess

import pandas as pd
import pytest

from conftest import dlbench
from dlbench_runner import blas as blas_libraries
from orchestrator import catalog
from orchestrator.runtimes import native
from orchestrator.runtimes.base import Target

SWITCHING = ("caffe", "theano", "torch", "pytorch")


def planned(*args) -> list[dict]:
    proc = dlbench("run", "--profile", "quick", "--dry-run", "--format", "json", *args, check=True)
    return [json.loads(line) for line in proc.stdout.splitlines()]


def error_of(*args) -> str:
    proc = dlbench("run", "--profile", "quick", "--dry-run", *args)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    line, = proc.stderr.strip().splitlines()
    return line


# -- the plan ---------------------------------------------------------------------------------
def test_a_blas_axis_multiplies_the_jobs_of_frameworks_that_can_switch():
    jobs = planned("--frameworks", "caffe,theano,tensorflow", "--datasets", "mnist",
                   "--blas", "openblas,blis,atlas")
    assert [(j["framework"], j["blas"]) for j in jobs] == [
        (fw, name) for fw in ("caffe", "theano", "tensorflow")
        for name in ("openblas-pthread", "blis-openmp", "atlas")]
    for job in jobs:
        if job["framework"] == "tensorflow":    # no BLAS to switch: stored as unsupported
            assert job["unsupported"].startswith("tensorflow cannot switch its BLAS library: ")
        else:
            assert job["unsupported"] is None
    assert all(job["onednn"] is None for job in jobs)


def test_onednn_on_and_off_and_the_frameworks_without_it():
    jobs = planned("--frameworks", "tensorflow,mxnet,caffe", "--datasets", "mnist",
                   "--onednn", "on,off")
    assert {(j["framework"], j["onednn"], j["unsupported"] is None) for j in jobs} == {
        ("tensorflow", "on", True), ("tensorflow", "off", True), ("mxnet", "on", True),
        ("mxnet", "off", True), ("caffe", "on", False), ("caffe", "off", False)}


def test_asking_for_the_default_keeps_the_job_id_it_had():
    """A job that leaves the compute libraries at their defaults is the job it was before
    they were axes (its id, which --resume matches, unchanged); one that asks differs."""
    from orchestrator.plan import Job
    job = Job(framework="caffe", dataset="mnist", model="m", profile="quick", hyperparameters={},
              threads=2)
    assert job.job_id("img", "data") == Job(**job.model_dump(exclude={"blas", "onednn"})).job_id("img", "data")
    assert "blas" not in job.model_dump(exclude=set(Job.NOT_IDENTITY) | set(Job.IDENTITY_WHERE_GIVEN))
    ids = {job.model_copy(update=change).job_id("img", "data")
           for change in ({}, {"blas": "blis-pthread"}, {"blas": "atlas"}, {"onednn": "off"})}
    assert len(ids) == 4


@pytest.mark.parametrize("args, message", [
    (("--frameworks", "caffe", "--blas", "mkl"),
     "dlbench: error: --blas mkl: caffe's image does not hold it (it holds openblas-pthread, "
     "openblas-openmp, blis-pthread, blis-openmp, atlas, reference)"),
    (("--frameworks", "caffe", "--blas", "goto"),
     "dlbench: error: --blas unknown BLAS 'goto' (choose from atlas, blis, blis-openmp, "
     "blis-pthread, mkl, netlib, openblas, openblas-openmp, openblas-pthread, reference), or default"),
    (("--frameworks", "tensorflow,mxnet", "--blas", "blis"),
     "dlbench: error: --blas blis-openmp: tensorflow, mxnet cannot switch BLAS libraries "
     "(caffe, torch, pytorch, theano can)"),
    (("--frameworks", "caffe,theano", "--onednn", "off"),
     "dlbench: error: --onednn: no oneDNN switch in caffe, theano (only in tensorflow, mxnet)"),
    (("--frameworks", "tensorflow", "--onednn", "maybe"),
     "dlbench: error: --onednn 'maybe': give on, off or default"),
    (("--frameworks", "caffe", "--blas", " , "),
     "dlbench: error: --blas takes BLAS libraries, e.g. openblas,blis"),
    (("--frameworks", "caffe", "--settings-from", "caffe/imagenet"),
     "dlbench: error: --settings-from 'caffe/imagenet': give own, a framework (caffe, tensorflow, "
     "torch, pytorch, mxnet, theano, pytorch2, jax) or FRAMEWORK/DATASET (mnist, cifar10)"),
])
def test_bad_compute_options_are_one_line_errors_before_any_job(args, message):
    assert error_of(*args) == message


def test_a_campaign_file_names_the_line_of_a_bad_library(tmp_path):
    path = tmp_path / "blas.toml"
    path.write_text('name = "blas"\nframeworks = ["caffe"]\nblas = ["openblas",\n  "gotoblas"]\n')
    proc = dlbench("run", "--campaign", path, "--dry-run")
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("blas.toml:3: blas[1]: unknown BLAS 'gotoblas' (choose from "
                                        "atlas, blis, blis-openmp, blis-pthread, mkl, netlib, openblas, "
                                        "openblas-openmp, openblas-pthread, reference), or default")
    path.write_text('name = "blas"\nframeworks = ["caffe"]\ndatasets = ["mnist"]\n'
                    'blas = ["openblas", "default"]\nonednn = ["default"]\n')
    jobs = [json.loads(line) for line in dlbench("run", "--campaign", path, "--dry-run", "--format", "json", "--profile", "quick",
                                                 check=True).stdout.splitlines()]
    assert [j["blas"] for j in jobs] == ["openblas-pthread", None]


def test_the_native_runtime_cannot_switch_blas():
    from orchestrator.plan import Job
    job = Job(framework="pytorch", dataset="mnist", model="m", profile="quick", hyperparameters={},
              threads=2, blas="blis-pthread")
    assert native.unsupported(Target("python3", None), job) == (
        "the native runtime runs on this host's BLAS: run it with --runtime docker or without --blas")
    assert native.unsupported(Target("python3", None), job.model_copy(update={"blas": None})) is None


def test_every_switching_framework_offers_the_same_libraries_first_openblas():
    for framework in catalog.names():
        offered = catalog.blas_offered(framework)
        assert (framework in SWITCHING) == bool(offered)
        if offered:
            assert offered[0] == "openblas-pthread" and set(offered) <= set(blas_libraries.LIBRARIES)


def test_mapped_files_are_named_by_their_debian_folder():
    lib = "/usr/lib/x86_64-linux-gnu"
    assert blas_libraries.loaded([f"{lib}/blis-openmp/libblis.so.3", f"{lib}/lapack/liblapack.so.3.9.0",
                                  f"{lib}/libdnnl.so.2.0"]) == ["blis-openmp"]
    assert blas_libraries.loaded([f"{lib}/openblas-pthread/libopenblasp-r0.3.13.so",
                                  f"{lib}/openblas-pthread/liblapack.so.3"]) == ["openblas-pthread"]
    assert blas_libraries.loaded([f"{lib}/atlas/libblas.so.3.10.3", f"{lib}/blas/libblas.so.3.9.0"]) == \
        ["atlas", "reference"]      # two at once: the row shows both
    assert blas_libraries.loaded(["/usr/local/lib/python3.9/dist-packages/mxnet/libopenblas.so.0"]) == \
        ["libopenblas.so.0"]        # a wheel's own copy, by its file name
    assert blas_libraries.environment("blis", {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}) == {
        "LD_LIBRARY_PATH": "/opt/dlbench/blas/blis-openmp:/usr/local/cuda/lib64"}


def test_the_memory_map_is_read_once_for_the_runner_and_the_adapters(tmp_path):
    """A process's memory map as Linux writes it: the runner's BLAS files and the adapters'
    OpenBLAS, OpenMP and CUDA libraries are the files whose paths hold their names."""
    lib = "/usr/lib/x86_64-linux-gnu"
    maps = tmp_path / "maps"
    maps.write_text(f"7f00-7f01 r-xp 00000000 08:01 11 {lib}/openblas-pthread/libblas.so.3\n"
                    "7f01-7f02 rw-p 00000000 00:00 0\n"          # anonymous: no file
                    f"7f02-7f03 r-xp 00000000 08:01 12 {lib}/libgomp.so.1.0.0\n"
                    f"7f03-7f04 r--p 00001000 08:01 12 {lib}/libgomp.so.1.0.0\n"
                    "7f04-7f05 r-xp 00000000 08:01 13 /opt/mxnet/libOpenBLAS.so.0\n")
    assert blas_libraries.mapped("openblas", maps) == [
        "/opt/mxnet/libOpenBLAS.so.0", f"{lib}/openblas-pthread/libblas.so.3"]
    assert blas_libraries.mapped("libgomp", maps) == [f"{lib}/libgomp.so.1.0.0"]
    assert blas_libraries.mapped_libraries(maps) == [
        "/opt/mxnet/libOpenBLAS.so.0", f"{lib}/openblas-pthread/libblas.so.3"]
    assert blas_libraries.mapped("openblas", tmp_path / "none") == []


# -- cross-data-set settings (ICDCS finding 1) ------------------------------------------------
def test_a_frameworks_mnist_defaults_on_cifar10():
    jobs = planned("--frameworks", "caffe", "--settings-from", "own,caffe/mnist")
    by = {(j["dataset"], j["settings_from"]): j["hyperparameters"] for j in jobs}
    # on MNIST caffe/mnist is its own defaults: one job, not two
    assert set(by) == {("mnist", None), ("cifar10", None), ("cifar10", "caffe/mnist")}
    mnist, cifar = by["mnist", None], by["cifar10", "caffe/mnist"]
    assert (cifar["batch_size"], cifar["learning_rate"]) == (mnist["batch_size"], mnist["learning_rate"])
    # the same passes over the training set: max_iter x 64 of 60,000 MNIST images, on 50,000
    # (cifar10_quick's second phase ends training; its first keeps its share of it)
    passes = mnist["max_iter"] * mnist["batch_size"] / 60000
    assert cifar["max_iter_lr1"] == math.ceil(passes * 50000 / mnist["batch_size"]) != mnist["max_iter"]
    jobs = planned("--frameworks", "pytorch", "--datasets", "cifar10", "--settings-from", "caffe/mnist")
    job, = jobs
    assert job["settings_from"] == "caffe/mnist" and job["hyperparameters"]["batch_size"] == 64


# -- real jobs ----------------------------------------------------------------------------------
@pytest.mark.docker
@pytest.mark.parametrize("framework", SWITCHING)
def test_each_image_holds_the_libraries_it_offers(build_image, framework):
    build_image(framework)
    listing = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh",
                              f"dlbench/{framework}:cpu", "-c",
                              "cd /opt/dlbench/blas && for d in *; do echo $d $(readlink -e $d/libblas.so.3)"
                              " $(readlink -e $d/liblapack.so.3); done"],
                             capture_output=True, text=True, check=True).stdout.split("\n")
    found = {line.split()[0]: line.split()[1:] for line in listing if line.strip()}
    assert sorted(found) == sorted(catalog.blas_offered(framework))
    for name, (blas_file, lapack_file) in found.items():
        assert blas_libraries.loaded([blas_file]) == [name], blas_file
        assert blas_libraries.name_of(lapack_file) in (name, None), lapack_file


@pytest.mark.docker
def test_jobs_run_on_the_library_they_ask_for(build_image, data_root, tmp_path):
    """Caffe's LeNet (a few iterations) on three libraries and TensorFlow's rows, which cannot
    switch: each row says what it asked for and what the training process mapped.  (A job
    that leaves the library to its image: tests/test_caffe.py and the other images' tests.)"""
    build_image("caffe")
    results = tmp_path / "results"
    campaign = tmp_path / "blas.toml"
    campaign.write_text('name = "blas"\nframeworks = ["caffe", "tensorflow"]\ndatasets = ["mnist"]\n'
                        'profiles = ["quick"]\nblas = ["openblas", "blis-openmp", "reference"]\n'
                        '[hyperparameters]\nrobust_images = 0\nexport_onnx = 0\n'
                        '[hyperparameters.caffe]\nmax_iter = 30\n')
    proc = dlbench("run", "--campaign", campaign, "--results", results, "--data-dir", data_root)
    assert (results / "runs").is_dir(), proc.stderr
    frame = pd.read_parquet(results / "runs")
    rows = {(r.framework, r.blas): r for r in frame.itertuples()}
    assert len(rows) == 6
    for name in ("openblas-pthread", "blis-openmp", "reference"):
        row = rows["caffe", name]
        assert row.status == "ok", row.error
        assert row.blas_loaded == name
        assert json.loads(row.threads_env)["BLIS_NUM_THREADS"] == str(row.threads)
    for name in ("openblas-pthread", "blis-openmp", "reference"):
        row = rows["tensorflow", name]
        assert row.status == "unsupported" and "loads no BLAS library" in row.error
    assert proc.returncode == 3     # the unsupported rows are not ok


# -- the report: how the varied settings relate to the measures --------------------------------
def test_the_correlation_table_of_a_family_that_varies_two_settings():
    from orchestrator.report import correlations

    def row(threads, blas, seconds, accuracy, status="ok"):
        return dict(section=0, framework="caffe", dataset="mnist", model="caffe-lenet", device="cpu",
                    profile="quick", status=status, threads=threads, blas=blas, onednn=None,
                    settings_from=None, hyperparameters=json.dumps({"batch_size": 64, "max_iter": 500}),
                    train_time_s=seconds, accuracy=accuracy, cpu_percent_mean=90.0 * threads,
                    memory_peak_bytes=3e8)
    rows = pd.DataFrame([row(1, None, 30.0, 0.97), row(2, None, 16.0, 0.97), row(1, "atlas", 40.0, 0.97),
                         row(2, "atlas", 22.0, 0.98), row(2, "atlas", 99.0, 0.1, status="failed")])
    table = correlations.table(rows).set_index(["axis", "measure"])
    assert set(table.index.get_level_values("axis")) == {"threads", "blas"}   # batch_size did not vary
    threads = table.loc[("threads", "train time")]
    # ranks: threads 1.5, 3.5, 1.5, 3.5 against times 3, 1, 4, 2
    assert (threads.statistic, threads.value, threads.runs) == ("rho", pytest.approx(-2 / 5 ** 0.5), 4)
    assert table.loc[("threads", "CPU use")].value == pytest.approx(1.0)
    library = table.loc[("blas", "train time")]
    assert (library.statistic, library.best, library["values"]) == ("epsilon2", "default", "atlas, default")
    assert library.spread == pytest.approx(31.0 / 23.0)        # the medians, 31 s and 23 s
    # Kruskal-Wallis: rank means 2 and 3 of 1..4, H = 12 / 20 x 2 x (0.5² + 0.5²) = 0.6; / (n - 1)
    assert library.value == pytest.approx(0.2)
    assert ("threads", "peak memory") not in table.index       # the same in every run
    one_run = correlations.table(rows.iloc[[0, 1, 2]])      # atlas once: no ε², the best and ×
    library = one_run[(one_run["axis"] == "blas") & (one_run["measure"] == "train time")].iloc[0]
    assert pd.isna(library["value"]) and library["best"] == "default" and library["spread"] == pytest.approx(40 / 23)


def test_theano_links_openblas_by_name_and_any_other_library_through_libblas():
    """Theano sets OpenBLAS's threads to 1 inside its OpenMP loops only when it links
    OpenBLAS by name: the default job keeps -lopenblas (as GTDLBench's setup would have),
    another library is linked as libblas.so.3, which the job's LD_LIBRARY_PATH chooses."""
    from dlbench_runner import runner
    theano = runner.adapter_module(str(catalog.framework_dir("theano")))
    assert [theano.blas_ldflags(b) for b in (None, "openblas-pthread", "openblas-openmp")] == ["-lopenblas"] * 3
    assert [theano.blas_ldflags(b) for b in ("blis-openmp", "atlas", "reference")] == ["-lblas"] * 3
    assert "blas.ldflags=-lblas" in theano.theano_flags(2, "/c", "float64", blas="atlas")
