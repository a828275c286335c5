"""Shared fixtures: the real data sets, the CLI as a user runs it, and each framework's image
and quick runs, made once a test session.

A framework's test module names its framework, ``FRAMEWORK = "caffe"``, and takes ``built``
(its image, built or found up to date) and ``quick_results`` (its quick rows on both data
sets, by data set); ``build_image`` and ``quick_run`` serve any other framework and data sets.
A module that opens pages takes ``browser`` (headless chromium; its window ``BROWSER_WINDOW``
where the module sets one) and marks those tests ``needs_browser``.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent
CI_STAGES = "DLBENCH_CI_STAGES"     # set by .ci/run: "name=seconds;..." of the stages before pytest
BESIDE = "+"        # a stage named "+name" ran beside the one before it: not added to the total
_file_seconds: collections.Counter = collections.Counter()


def pytest_runtest_logreport(report):
    """Each test file's time: its tests' setup, call and teardown (a module's shared image
    build or training counts in the setup of its first test)."""
    _file_seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter):
    """Under .ci/run: the time of every stage, pytest's test files one by one, and the total
    (a stage that ran beside another is shown, not added)."""
    if CI_STAGES not in os.environ:
        return
    stages = [item.split("=", 1) for item in os.environ[CI_STAGES].split(";") if "=" in item]
    rows = [(name, float(seconds)) for name, seconds in stages]
    rows += sorted(_file_seconds.items(), key=lambda item: -item[1])
    total = sum(seconds for name, seconds in rows if not name.startswith(BESIDE))
    terminalreporter.write_sep("-", "CI stage times")
    for name, seconds in rows + [("total", total)]:
        name = f"  beside the one above: {name[1:]}" if name.startswith(BESIDE) else name
        terminalreporter.write_line(f"{seconds:8.1f} s  {seconds / 60:5.1f} min  {name}")


def _shared(name: str, variable: str, marker: str, what: str) -> Path:
    """A folder of ``shared/`` beside the repository (or ``variable``), which must hold
    ``marker``: the tests never download what is there."""
    path = Path(os.environ.get(variable, REPO.parent / "shared" / name))
    if not (path / marker).is_dir():
        pytest.fail(f"{what} not found at {path}; set {variable}")
    return path


def shared_datasets() -> Path:
    """The real MNIST and CIFAR-10, in the canonical layout."""
    return _shared("datasets", "DLBENCH_TEST_DATA_DIR", "mnist", "test data sets")


@pytest.fixture(scope="session")
def data_root() -> Path:
    return shared_datasets()


def shared_sources() -> Path:
    """The pinned source archives' local mirror (tests never fetch from GitHub)."""
    return _shared("sources", "DLBENCH_TEST_SOURCES_DIR", "torch7", "source archives")


@pytest.fixture(scope="session")
def sources_root() -> Path:
    return shared_sources()


# GitHub, and any other HTTPS server, only through a proxy that is not there: no network route.
NO_ROUTE = {"HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
            "NO_PROXY": "", "no_proxy": ""}


CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs a headless browser: Debian's chromium and chromium-driver (scripts/setup --dev installs them)")


@pytest.fixture(scope="module")
def browser(request):
    """Debian's chromium, headless, through its chromedriver, with the console's messages
    kept (``get_log("browser")``); one a module, its window the module's ``BROWSER_WINDOW``
    (width, height; default 1400 x 1000)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    width, height = getattr(request.module, "BROWSER_WINDOW", (1400, 1000))
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     f"--window-size={width},{height}"):
        options.add_argument(argument)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(600)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


def dlbench(*args, env=None, check=False, timeout=1800) -> subprocess.CompletedProcess:
    """Run the installed CLI in a subprocess, as a user would."""
    full_env = dict(os.environ)
    full_env.pop("DLBENCH_DATA_DIR", None)
    full_env.pop("DLBENCH_RESULTS_DIR", None)
    full_env.pop("DLBENCH_SOURCES_DIR", None)
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "orchestrator", *map(str, args)],
                          capture_output=True, text=True, env=full_env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"dlbench {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def quiet_host(limit_s: float = 120.0) -> None:
    """Waits, at most ``limit_s``, for the 1-minute load average to come down to the
    host's CPUs: a run whose rows a test holds as undisturbed starts on a quiet host (the
    report marks a run that started above CPUs + 0.5 disturbed), whatever the test before
    it left running."""
    deadline = time.monotonic() + limit_s
    while os.getloadavg()[0] > (os.cpu_count() or 1) and time.monotonic() < deadline:
        time.sleep(5)


@pytest.fixture(scope="session")
def build_image():
    """``build_image(framework)``: `dlbench build-images` for it, once a session; the process."""
    done = {}

    def build(framework: str) -> subprocess.CompletedProcess:
        if framework not in done:
            done[framework] = dlbench("build-images", "--frameworks", framework, check=True)
        return done[framework]
    return build


def quick_profile(framework: str, dataset: str) -> dict:
    """The quick profile's settings of a framework's model, from its models.json."""
    with open(REPO / "images" / framework / "models.json") as f:
        return json.load(f)["models"][dataset]["profiles"]["quick"]


@pytest.fixture(scope="session")
def quick_run(build_image, data_root, tmp_path_factory):
    """``quick_run(framework, datasets)``: the quick profile through the CLI on the real data,
    its image built first, once a session for each; the results directory."""
    done = {}

    def run(framework: str, datasets: str = "mnist,cifar10") -> Path:
        if (framework, datasets) not in done:
            build_image(framework)
            results = tmp_path_factory.mktemp(f"{framework}-results")
            dlbench("run", "--frameworks", framework, "--datasets", datasets, "--profile", "quick",
                    "--results", results, "--data-dir", data_root, check=True)
            done[framework, datasets] = results
        return done[framework, datasets]
    return run


@pytest.fixture(scope="module")
def built(request, build_image) -> subprocess.CompletedProcess:
    """The image of the test module's FRAMEWORK."""
    return build_image(request.module.FRAMEWORK)


@pytest.fixture(scope="module")
def quick_results(request, quick_run) -> dict:
    """The quick rows of the test module's FRAMEWORK on both data sets, by data set."""
    frame = pd.read_parquet(quick_run(request.module.FRAMEWORK) / "runs")
    return {row.dataset: row for row in frame.itertuples()}


def assert_model_size(row, element_sizes=(4,), at_most=3.0):
    """An ok row's model size: its parameters times one of ``element_sizes`` bytes, and a
    saved model that holds them all, at most ``at_most`` times their bytes (its format's
    own additions: a TensorFlow checkpoint's moving averages, a Torch7 module's gradient
    buffers) and a little more (names, headers)."""
    assert row.param_bytes in [row.param_count * size for size in element_sizes], row.param_bytes
    assert row.param_bytes <= row.model_size_bytes <= at_most * row.param_bytes + (64 << 10), \
        (row.model_size_bytes, row.param_bytes)


def assert_robustness(results: Path, row) -> dict:
    """An ok row's robustness rows and its runner's gradient check, as the issue asks of
    them: every attack and epsilon of its settings on ``images`` images; FGSM's accuracy not
    rising with epsilon by more than half a point (one image where there are fewer than
    200), PGD's at most FGSM's at its epsilon, neither above the clean accuracy on the same
    images; the adapter's input gradient within the runner's tolerance of finite differences
    on 8 pixels of the trained model, at an image it gets wrong and at the one it classifies
    most confidently; every attack along the exact cross entropy's direction
    (``ATTACK_LOSS``), with at most 1% of its images' gradients vanished.  Returns the rows
    by (attack, epsilon)."""
    from dlbench_runner import contract
    from orchestrator import store

    from dlbench_runner import robustness

    hp = json.loads(row.hyperparameters)
    images = hp["robust_images"]
    frame = store.load_robustness(results, [row.run_id])
    found = {(r.attack, round(r.epsilon, 9)): r for r in frame.itertuples()}
    epsilons = [round(e, 9) for e in contract.epsilons(hp["epsilons"])]
    pgd = round(contract.epsilons(hp["pgd_epsilon"])[0], 9)
    assert list(found) == [("none", 0.0)] + [("fgsm", e) for e in epsilons] + [("pgd", pgd)]
    assert all(r.images == images and r.time_s > 0 and pd.isna(r.reason) for r in found.values())
    clean = found["none", 0.0].accuracy
    fgsm = [found["fgsm", e].accuracy for e in epsilons]
    slack = max(0.005, 1.0 / images)         # half a point, or one image of fewer than 200
    assert all(later <= earlier + slack for earlier, later in zip(fgsm, fgsm[1:])), fgsm
    assert max(fgsm) <= clean and found["pgd", pgd].accuracy <= found["fgsm", pgd].accuracy
    assert found["pgd", pgd].steps == contract.PGD_STEPS
    attacks = [r for key, r in found.items() if key[0] != "none"]
    assert all(r.attack_loss == robustness.ATTACK_LOSS for r in attacks)
    assert all(r.vanished_gradients <= 0.01 * images for r in attacks), \
        [(r.attack, r.epsilon, r.vanished_gradients) for r in attacks]
    check = json.loads((results / "_jobs" / row.run_id / "result.json").read_text())["gradient_check"]
    assert len(check["pixels"]) == robustness.CHECK_PIXELS, check
    assert check["relative_error"] <= robustness.GRADIENT_TOLERANCE, check
    confident = check["confident"]
    assert len(confident["pixels"]) == robustness.CHECK_PIXELS and confident["image"] != check["image"]
    assert max(sorted(confident["errors"])[:-robustness.CHECK_OUTLIERS]) <= robustness.GRADIENT_TOLERANCE
    return found


def assert_migration(results: Path, row, tolerance: float = 1e-4) -> None:
    """An ok row's migration check, as the issue asks of it: the exported ONNX model stored
    beside the rows, its accuracy on the images the job tested the framework's own within 0.1
    points, no image classified otherwise than by the framework, and its outputs on the
    runner's batch within ``tolerance`` (relative: 1e-4 for a float32 graph, 1e-9 for a
    float64 one) of the framework's own."""
    from orchestrator import store

    assert pd.isna(row.migration_reason), row.migration_reason
    assert abs(row.migrated_accuracy - row.accuracy) <= 0.001, (row.migrated_accuracy, row.accuracy)
    assert row.migration_mismatches == 0
    assert 0 <= row.migration_max_logit_error <= tolerance, row.migration_max_logit_error
    assert store.model_path(results, row.run_id).stat().st_size == row.migration_model_bytes > 0
    assert row.migration_time_s > 0


# The checks after training (robustness on 1,000 images, the ONNX export) in a paper-profile
# job cut short to test its timed loop: the quick jobs test them, here they would only cost.
NO_CHECKS = ("robust_images=0", "export_onnx=0")


def make_plan(frameworks: list[str] | None = None, datasets: list[str] | None = None,
              profile: str = "paper", cpus: int | None = None, gpu: int | None = None,
              overrides: dict | None = None, repeats: int = 1, seed: int | None = None,
              host_cpus: int | None = None):
    """One job per framework and data set (and repeat), as ``dlbench run`` plans it from
    its plain options: the matrix of one value on each axis, expanded."""
    from orchestrator.options import Axes
    from orchestrator.plan import expand

    axes = Axes(frameworks=frameworks, datasets=datasets, profiles=[profile],
                hyperparameters={k: [v] for k, v in (overrides or {}).items()},
                threads=[cpus], devices=[gpu], repeats=repeats, seed=seed)
    return expand(axes, host_cpus)


def immediate_result(job, run_id: str, job_id: str, job_dir: Path) -> None:
    """What a stand-in runtime's job leaves at once: its job directory and a valid ok
    result (no framework, no training), for tests of the job loop without Docker."""
    from orchestrator import jobdir

    jobdir.prepare(job_dir, job.spec(run_id, job_id)).close()
    (job_dir / "out" / "result.json").write_text(json.dumps({
        "schema_version": 1, "status": "ok", "framework": job.framework, "dataset": job.dataset,
        "model": job.model, "profile": job.profile, "hyperparameters": {}, "device": "cpu",
        "seed": job.seed}))


SOFTMAX = Path(__file__).parent / "fixtures" / "numpy_softmax"


def native_framework(folder: Path, name: str, adapter_more: str = "", **catalog) -> Path:
    """The test adapter (a numpy softmax regression, fixtures/numpy_softmax) as a framework
    ``name`` in ``folder`` that dlbench finds (DLBENCH_FRAMEWORKS_PATH: ``folder``'s parent)
    and runs natively; ``adapter_more`` is appended to its adapter, ``catalog`` updates its
    models.json.  Returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter.py").write_text((SOFTMAX / "adapter.py").read_text() + adapter_more)
    models = json.loads((SOFTMAX / "models.json").read_text())
    models.update(framework=name, native={"module": "numpy"}, **catalog)
    models["models"]["mnist"]["settings"] = {"length": ["epochs"], "learning_rate": ["learning_rate"],
                                             "train_images": 60000}
    (folder / "models.json").write_text(json.dumps(models))
    (folder / "Dockerfile").write_text("# run natively only\n")
    return folder

