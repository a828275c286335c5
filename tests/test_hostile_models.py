"""A job's ONNX model is an untrusted program: the host runs it in a child process that
reads no file but the model and stops at the host's limits (orchestrator/checks/untrusted.py).

The hostile models are built here with the onnx package's helpers, as a job could write
them: a tensor stored as external data naming a host file (relative to the working
directory, absolute, inside an ``If``'s branches), a ``Loop`` of 10^12 iterations and a
``ConstantOfShape`` of a huge shape.  They are checked through the migration check's own
code, end to end by a framework added from outside (a directory on
``DLBENCH_FRAMEWORKS_PATH``, run natively) whose adapter exports them, through
``dlbench report``'s transfer matrix from a stored model, and left in /out by a job image
(``docker``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pandas as pd
import pytest
from onnx import TensorProto, external_data_helper, helper

from conftest import REPO, dlbench
from orchestrator import store
from orchestrator.checks import migration, transfer, untrusted
from orchestrator.interrupts import Interrupted
from test_hostile_npz import LYING_MIGRATION, LYING_TRANSFER, TERA

FIXTURE = Path(__file__).parent / "fixtures" / "numpy_softmax"
SECRET = bytes(range(65, 75))          # the host file's bytes: "ABCDEFGHIJ"
PIXELS = helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["N", 28, 28])
OUTPUTS = helper.make_tensor_value_info("outputs", TensorProto.FLOAT, ["N", 10])


def _model(nodes, initializers=(), opset=17) -> bytes:
    """pixels -> a column of zeros per image, plus ``vector`` (10 numbers the nodes make) ->
    N x 10 outputs: whatever ``vector`` holds becomes each image's logits."""
    zeros = [helper.make_node("ReduceSum", ["pixels", "axes"], ["sums"], keepdims=0),
             helper.make_node("Unsqueeze", ["sums", "one_axis"], ["column"]),
             helper.make_node("Mul", ["column", "zero"], ["zeros"]),
             helper.make_node("Add", ["zeros", "vector"], ["outputs"])]
    constants = [helper.make_tensor("axes", TensorProto.INT64, [2], [1, 2]),
                 helper.make_tensor("one_axis", TensorProto.INT64, [1], [1]),
                 helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])]
    graph = helper.make_graph(list(nodes) + zeros, "hostile", [PIXELS], [OUTPUTS],
                              constants + list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _external(name: str, location: str) -> TensorProto:
    """10 bytes of ``location`` as a uint8 tensor stored outside the model."""
    tensor = TensorProto(name=name, data_type=TensorProto.UINT8, dims=[10], raw_data=bytes(10))
    external_data_helper.set_external_data(tensor, location, offset=0, length=10)
    tensor.ClearField("raw_data")
    return tensor


def secret_initializer(location: str) -> bytes:
    return _model([helper.make_node("Cast", ["secret"], ["vector"], to=TensorProto.FLOAT)],
                  [_external("secret", location)])


def secret_constant(location: str) -> bytes:
    """The external tensor as a Constant's value, in both branches of an If inside the
    branch of another If: two subgraphs deep."""
    def branch(name, inner):
        out = helper.make_tensor_value_info(f"{name}_out", TensorProto.UINT8, [10])
        return helper.make_graph(inner(name), name, [], [out])

    def leaf(name):
        return [helper.make_node("Constant", [], [f"{name}_out"], value=_external(f"{name}_value", location))]

    def middle(name):
        return [helper.make_node("If", ["yes"], [f"{name}_out"], then_branch=branch(f"{name}_a", leaf),
                                 else_branch=branch(f"{name}_b", leaf))]

    nodes = [helper.make_node("Constant", [], ["yes"], value=helper.make_tensor("t", TensorProto.BOOL, [], [True])),
             helper.make_node("If", ["yes"], ["bytes"], then_branch=branch("then", middle),
                              else_branch=branch("else", middle)),
             helper.make_node("Cast", ["bytes"], ["vector"], to=TensorProto.FLOAT)]
    return _model(nodes)


def endless_loop(trips: int = 10 ** 12) -> bytes:
    """A Loop of ``trips`` iterations adding 1 to a vector of 10: 0.5 KB."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["going"], ["still"]),
         helper.make_node("Add", ["v_in", "step"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("going", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [10])],
        [helper.make_tensor_value_info("still", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [10])],
        [helper.make_tensor("step", TensorProto.FLOAT, [10], [1.0] * 10)])
    nodes = [helper.make_node("Loop", ["trips", "yes", "start"], ["vector"], body=body)]
    return _model(nodes, [helper.make_tensor("trips", TensorProto.INT64, [], [trips]),
                          helper.make_tensor("yes", TensorProto.BOOL, [], [True]),
                          helper.make_tensor("start", TensorProto.FLOAT, [10], [0.0] * 10)])


def huge_constant(elements: int = 1 << 34) -> bytes:
    """A ConstantOfShape of ``elements`` float32 numbers (64 GiB), summed to 10."""
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["huge"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
             helper.make_node("ReduceSum", ["huge", "first"], ["vector"], keepdims=0)]
    return _model(nodes, [helper.make_tensor("shape", TensorProto.INT64, [2], [elements // 10, 10]),
                          helper.make_tensor("first", TensorProto.INT64, [1], [0])])


@pytest.fixture
def beside_secret(tmp_path, monkeypatch) -> Path:
    """dlbench's working directory holding the host's secret file."""
    (tmp_path / "secret.txt").write_bytes(SECRET)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "secret.txt"


IMAGES = np.zeros((20, 28, 28), np.uint8)
GOOD = dict(predictions=np.zeros(20, np.int64), logits=np.zeros((16, 10)))


def job_with(tmp_path: Path, model: bytes) -> Path:
    """A job directory whose out/ holds ``model`` and the framework's 20 predictions."""
    job = tmp_path / "job"
    (job / "out").mkdir(parents=True)
    (job / "out" / "model.onnx").write_bytes(model)
    np.savez(job / "out" / "migration.npz", **GOOD)
    return job


@pytest.mark.parametrize("make", [secret_initializer, secret_constant])
def test_onnxruntime_alone_reads_the_file_a_model_names(beside_secret, make):
    """What the host guards against: onnxruntime given the bytes resolves the relative name
    against the working directory, in a subgraph as well (onnxruntime itself refuses an
    absolute path or one with ``..``)."""
    session = onnxruntime.InferenceSession(make("secret.txt"), providers=["CPUExecutionProvider"])
    outputs = session.run(None, {"pixels": np.zeros((2, 28, 28), np.float32)})[0]
    assert bytes(outputs[0].astype(np.uint8)) == SECRET


@pytest.mark.parametrize("make, location, where", [
    (secret_initializer, "secret.txt", "graph 'hostile' / initializer 'secret'"),
    (secret_initializer, "absolute", "graph 'hostile' / initializer 'secret'"),
    (secret_constant, "secret.txt", "graph 'hostile' / node 1 / attribute 'then_branch' / g 'then' / node 0 / "
                                    "attribute 'then_branch' / g 'then_a' / node 0 / attribute 'value'"),
])
def test_a_tensor_stored_outside_the_model_is_refused_before_it_is_loaded(beside_secret, data_root, tmp_path,
                                                                          make, location, where):
    location = str(beside_secret) if location == "absolute" else location
    found = migration.evaluate(job_with(tmp_path, make(location)), "mnist", data_root)
    assert found.migration_reason.startswith(f"the tensor "), found.migration_reason
    assert where in found.migration_reason
    assert found.migration_reason.endswith(f"is stored as external data ({location!r}): dlbench runs one "
                                           "self-contained ONNX file and reads no other")
    assert found.migrated_accuracy is None and found.migration_max_logit_error is None


def test_every_tensor_stored_outside_is_found_wherever_it_is():
    """Initializers, sparse tensors' values and indices, node attributes (one tensor and
    lists of them), graphs in Loop bodies, functions, training graphs."""
    def external(name="x"):
        return _external(name, "secret.txt")

    def model_with(graph_nodes=(), initializers=(), sparse=(), functions=(), training=False):
        graph = helper.make_graph(list(graph_nodes), "g", [], [], list(initializers), sparse_initializer=list(sparse))
        model = helper.make_model(graph, functions=list(functions))
        if training:
            model.training_info.add().initialization.CopyFrom(
                helper.make_graph([], "init", [], [], [external("trained")]))
        return model

    loop_body = helper.make_graph([helper.make_node("Constant", [], ["c"], value=external("deep"))], "body", [], [])
    cases = [model_with(initializers=[external()]),
             model_with(sparse=[helper.make_sparse_tensor(external("values"), helper.make_tensor(
                 "i", TensorProto.INT64, [1], [0]), [10])]),
             model_with(sparse=[helper.make_sparse_tensor(helper.make_tensor("v", TensorProto.UINT8, [1], [1]),
                                                          external("indices"), [10])]),
             model_with([helper.make_node("Foo", [], ["y"], tensors=[external("listed")])]),
             model_with([helper.make_node("Loop", ["", ""], ["y"], body=loop_body)]),
             model_with(functions=[helper.make_function("local", "f", [], ["c"], [helper.make_node(
                 "Constant", [], ["c"], value=external("in_function"))], [helper.make_opsetid("", 17)])]),
             model_with(training=True)]
    for model in cases:
        assert "is stored as external data ('secret.txt')" in untrusted.stored_outside(model)
    inside = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    assert untrusted.stored_outside(model_with(initializers=[inside])) is None
    assert untrusted.stored_outside(onnx.ModelProto.FromString(endless_loop())) is None


def test_a_model_past_the_wall_clock_limit_is_stopped_with_a_reason(data_root, tmp_path, monkeypatch):
    """A Loop of 10^12 iterations: killed at the limit (3 s here), the reason in the row."""
    monkeypatch.setattr(untrusted, "WALL_SECONDS", 3)
    started = time.monotonic()
    found = migration.evaluate(job_with(tmp_path, endless_loop()), "mnist", data_root)
    assert found.migration_reason == "the ONNX model ran past the host's limit of 3 s and was stopped"
    assert 3 <= time.monotonic() - started < 8
    assert found.migrated_accuracy is None and found.seconds >= 3
    assert no_check_running()


def is_check(process) -> bool:
    """A process is a check's child (``untrusted_child.py`` run by its path)."""
    return str(untrusted.CHILD) in process.cmdline()


def no_check_running() -> bool:
    import psutil
    return not [p for p in psutil.Process().children(recursive=True) if is_check(p)]


def test_a_model_past_the_cpu_limit_is_stopped_by_the_kernel(tmp_path, monkeypatch):
    """RLIMIT_CPU in the child: 2 s of CPU time, however long the wall-clock limit."""
    monkeypatch.setattr(untrusted, "CPU_SECONDS", 2)
    started = time.monotonic()
    found, = untrusted.classify(endless_loop(), [IMAGES])
    assert str(found) == "the ONNX model used more than the host's limit of 2 s of CPU time and was stopped"
    assert time.monotonic() - started < untrusted.WALL_SECONDS


def test_a_model_past_the_memory_limit_is_refused_within_it():
    """A ConstantOfShape of 6 GiB (one this machine could hold: 24 GiB) fails its
    allocation in the child; the child never held more than the limit."""
    found, = untrusted.classify(huge_constant(3 << 29), [IMAGES])
    assert isinstance(found, untrusted.Refused)
    assert "Failed to allocate memory" in str(found) and str(found).endswith("(the host's limit: 4 GiB of memory)")
    peak = untrusted.last_usage[0].ru_maxrss * 1024
    assert peak < untrusted.MEMORY_BYTES


def test_the_transfer_matrix_runs_stored_models_within_the_same_limits(monkeypatch):
    monkeypatch.setattr(untrusted, "WALL_SECONDS", 2)
    images = transfer.Images(np.zeros((5, 28, 28), np.float32), np.zeros(5, np.int64), 0.1)
    found = transfer.accuracies(endless_loop(), [images, images])
    assert [str(f) for f in found] == ["the ONNX model ran past the host's limit of 2 s and was stopped"] * 2
    refused, = transfer.accuracies(secret_initializer("secret.txt"), [images])
    assert isinstance(refused, untrusted.Refused) and "stored as external data" in str(refused)
    assert transfer.accuracies(_model([helper.make_node("Cast", ["v"], ["vector"], to=TensorProto.FLOAT)],
                                      [helper.make_tensor("v", TensorProto.FLOAT, [10], [1.0] + [0.0] * 9)]),
                               [images]) == [1.0]        # class 0, the labels'


def test_a_check_is_stopped_when_the_run_is_cancelled():
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    started = time.monotonic()
    found, = untrusted.classify(endless_loop(), [IMAGES], stop=stop)
    assert str(found) == "the check was stopped" and time.monotonic() - started < 5
    assert no_check_running()


def test_a_stop_signal_during_a_check_interrupts_the_thread_that_waits(monkeypatch):
    """In a lane (not the main thread, where the signal handler raises): the wait sees the
    signal that came and raises ``Interrupted`` with the child killed."""
    from orchestrator import interrupts

    raised = []

    def lane():
        try:
            untrusted.classify(endless_loop(), [IMAGES])
        except Interrupted as exc:
            raised.append(exc.exit_code)

    monkeypatch.setattr(interrupts, "received", [])
    thread = threading.Thread(target=lane)
    thread.start()
    time.sleep(1.0)
    interrupts.received.append(signal.SIGTERM)
    thread.join(5)
    assert not thread.is_alive() and raised == [128 + signal.SIGTERM]
    assert no_check_running()


# -- end to end: a framework added from outside whose adapter exports a hostile model -------
HOSTILE_ADAPTER = '''

# -- the hostile framework: the model it exports is one of the files beside this one
_Trained = Adapter


class Adapter(_Trained):
    def __init__(self, ctx):
        super().__init__(ctx)
        if self.hp["hostile"] != "none":
            self.export_onnx = self._hostile

    def _hostile(self, path, pixels):
        import shutil
        shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), self.hp["hostile"] + ".onnx"), path)
'''


@pytest.fixture(scope="module")
def frameworks(tmp_path_factory) -> Path:
    """Two frameworks dlbench finds on DLBENCH_FRAMEWORKS_PATH, run natively: ``softmax``
    (the test adapter, its own model) and ``hostile`` (the same training, a hostile model:
    ``--set hostile=...`` names it; the Loop by default)."""
    top = tmp_path_factory.mktemp("frameworks")
    models = {"secret": secret_initializer("secret.txt"), "subgraph": secret_constant("secret.txt"),
              "loop": endless_loop(), "huge": huge_constant(3 << 29)}
    for name, hostile in (("softmax", "none"), ("hostile", "loop")):
        folder = top / name
        folder.mkdir()
        (folder / "adapter.py").write_text((FIXTURE / "adapter.py").read_text() + HOSTILE_ADAPTER)
        catalog = json.loads((FIXTURE / "models.json").read_text())
        catalog.update(framework=name, native={"module": "numpy"})
        mnist = catalog["models"]["mnist"]
        mnist["hyperparameters"]["hostile"] = hostile
        mnist["settings"] = {"length": ["epochs"], "learning_rate": ["learning_rate"], "train_images": 60000}
        (folder / "models.json").write_text(json.dumps(catalog))
        (folder / "Dockerfile").write_text("# run natively only\n")
        for kind, model in models.items():
            (folder / f"{kind}.onnx").write_bytes(model)
    return top


def run_args(frameworks_list: str, data_root: Path, results: Path, *options, attack: bool = False) -> list[str]:
    return ["run", "--runtime", "native", "--python", sys.executable, "--frameworks", frameworks_list,
            "--datasets", "mnist", "--profile", "quick", "--cpus", "1", *([] if attack else ["--set", "robust_images=0"]),
            "--results", str(results), "--data-dir", str(data_root), *options]


def run_env(frameworks: Path, results: Path) -> dict:
    return {"DLBENCH_FRAMEWORKS_PATH": str(frameworks), "DOCKER_HOST": f"unix://{results.parent}/no-docker.sock"}


def everything_stored(results: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(results.rglob("*")) if p.is_file())


@pytest.mark.parametrize("hostile", ["secret", "subgraph"])
def test_dlbench_run_reads_no_host_file_a_model_names(frameworks, data_root, beside_secret, tmp_path, hostile):
    """dlbench run from a directory holding secret.txt: an ok row whose reason says the
    model was refused; the secret's bytes nowhere in the results."""
    results = tmp_path / "results"
    dlbench(*run_args("hostile", data_root, results, "--set", f'hostile="{hostile}"'), check=True,
            env=run_env(frameworks, results))
    row = store.load(results).iloc[0]
    assert row.status == "ok" and "is stored as external data ('secret.txt')" in row.migration_reason
    assert pd.isna(row.migration_max_logit_error) and pd.isna(row.migrated_accuracy)
    stored = everything_stored(results)
    assert SECRET not in stored and np.float64(max(SECRET)).tobytes() not in stored   # the logit error it made
    assert [p.name for p in (results / "_jobs").iterdir()] == [row.run_id]      # its row's, without out/
    assert not (results / "_jobs" / row.run_id / "out").exists()


def test_dlbench_run_stores_a_reason_for_a_model_past_the_memory_limit(frameworks, data_root, tmp_path):
    results = tmp_path / "results"
    dlbench(*run_args("hostile", data_root, results, "--set", 'hostile="huge"'), check=True,
            env=run_env(frameworks, results))
    row = store.load(results).iloc[0]
    assert row.status == "ok" and row.migration_reason.endswith("(the host's limit: 4 GiB of memory)")


def wait_for_check(process: subprocess.Popen, limit_s: float = 300, after=lambda: True) -> None:
    """Until ``process`` runs a model's check (a child ``untrusted_child.py``) once
    ``after()`` holds."""
    import psutil
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            if after() and any(is_check(p) for p in psutil.Process(process.pid).children(True)):
                return
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.2)
    raise AssertionError("no check started")


def signalled_during_check(process: subprocess.Popen, signum: int, limit_s: float = 300,
                           after=lambda: True) -> str:
    """Send ``signum`` to dlbench one second into a model check (``wait_for_check``): it
    must exit within 5 s with the signal's status, no traceback, and no check process
    left running; its stderr."""
    import psutil
    try:
        wait_for_check(process, limit_s, after)
        checks = [p for p in psutil.Process(process.pid).children(True) if is_check(p)]
        time.sleep(1.0)             # well inside the Loop
        sent = time.monotonic()
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=30)
        assert time.monotonic() - sent < 5
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr
    assert not [p for p in checks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    return stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_dlbench_run_stops_within_5_s_of_a_signal_during_a_check(frameworks, data_root, tmp_path, signum):
    """The first job's row stored, the second job's model looping: the signal ends dlbench
    within 5 s, with its exit code, the first row kept, no job directory and no check left."""
    results = tmp_path / "results"
    env = dict(os.environ, **run_env(frameworks, results))
    env.pop("DLBENCH_RESULTS_DIR", None)
    process = subprocess.Popen([sys.executable, "-m", "orchestrator",
                                *run_args("softmax,hostile", data_root, results)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stderr = signalled_during_check(process, signum, after=lambda: any((results / "runs").glob("*.parquet")))
    assert "interrupted; the rows stored so far are kept" in stderr      # the second job's check
    rows = store.load(results)
    assert list(rows.framework) == ["softmax"] and rows.status.tolist() == ["ok"]
    assert [p.name for p in (results / "_jobs").iterdir()] == list(rows.run_id)     # the first job's only


# -- dlbench report: a stored model is the job's too (the transfer matrices run it) ---------
@pytest.fixture(scope="module")
def attacked(frameworks, data_root, tmp_path_factory) -> Path:
    """A results directory of one run that kept its FGSM images and its model (read only)."""
    results = tmp_path_factory.mktemp("attacked") / "results"
    dlbench(*run_args("hostile", data_root, results, "--set", 'hostile="none"', attack=True), check=True,
            env=run_env(frameworks, results))
    return results


def with_stored_model(attacked: Path, tmp_path: Path, model: bytes) -> Path:
    """A copy of ``attacked`` whose stored model is ``model``."""
    results = tmp_path / "results"
    shutil.copytree(attacked, results)
    run_id, = store.load(results).run_id
    assert store.transfer_path(results, run_id).exists()
    store.model_path(results, run_id).write_bytes(model)
    return results


def test_dlbench_report_reads_no_host_file_a_stored_model_names(attacked, beside_secret, tmp_path):
    results = with_stored_model(attacked, tmp_path, secret_initializer("secret.txt"))
    document = json.loads(dlbench("report", "--results", results, "--format", "json", check=True).stdout)
    cell, = document["transfer"]
    assert cell["accuracy"] is None and "is stored as external data ('secret.txt')" in cell["reason"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_dlbench_report_stops_within_5_s_of_a_signal_during_a_model(attacked, tmp_path, signum):
    """The stored model loops: `dlbench report` ignored SIGTERM for 10 minutes; now the
    signal ends it within 5 s, the child killed."""
    results = with_stored_model(attacked, tmp_path, endless_loop())
    process = subprocess.Popen([sys.executable, "-m", "orchestrator", "report", "--results", str(results)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    signalled_during_check(process, signum, limit_s=120)


# -- in a container: the same models left in /out by a job image ---------------------------
ENTRYPOINT = '''
import json, shutil, sys
spec = json.load(open(sys.argv[sys.argv.index("--spec") + 1]))
kind = {1: "secret", 2: "subgraph", 3: "loop", 4: "secret"}[spec["seed"]]
shutil.copyfile("/models/%s.onnx" % kind, "/out/model.onnx")
if spec["seed"] == 4:       # npz files whose headers lie (tests/test_hostile_npz.py)
    shutil.copyfile("/models/lying-migration.npz", "/out/migration.npz")
    shutil.copyfile("/models/lying-transfer.npz", "/out/transfer.npz")
else:
    shutil.copyfile("/models/migration.npz", "/out/migration.npz")
json.dump({"schema_version": 1, "framework": spec["framework"], "dataset": spec["dataset"], "model": "m",
           "profile": spec["profile"], "hyperparameters": {}, "device": "cpu", "seed": spec["seed"],
           "status": "ok", "test_samples": 20, "migration_time_s": 0.1}, open("/out/result.json", "w"))
'''


@pytest.fixture(scope="module")
def model_image(tmp_path_factory):
    """A job image whose job leaves a hostile model in /out, picked by its seed."""
    import docker
    from orchestrator import build
    from test_hostile import TEST_LABEL

    client = docker.from_env()
    base = build.Builder(client, say=lambda *a: None).base()
    folder = tmp_path_factory.mktemp("model-image")
    (folder / "models").mkdir()
    for kind, model in (("secret", secret_initializer("secret.txt")), ("subgraph", secret_constant("secret.txt")),
                        ("loop", endless_loop())):
        (folder / "models" / f"{kind}.onnx").write_bytes(model)
    np.savez(folder / "models" / "migration.npz", **GOOD)
    (folder / "models" / "lying-migration.npz").write_bytes(LYING_MIGRATION)
    (folder / "models" / "lying-transfer.npz").write_bytes(LYING_TRANSFER)
    (folder / "job.py").write_text(ENTRYPOINT)
    (folder / "Dockerfile").write_text(f"FROM {base.id}\nCOPY models /models\nCOPY job.py /job.py\n"
                                       'ENTRYPOINT ["python3", "/job.py"]\n')
    tag = f"dlbench-test/models:{os.getpid()}"
    image, _ = client.images.build(path=str(folder), tag=tag, rm=True, labels={TEST_LABEL: "models"})
    yield tag, image
    client.images.remove(image.id, force=True)


@pytest.mark.docker
def test_a_containers_hostile_models_are_reasons_on_ok_rows(model_image, beside_secret, data_root, tmp_path,
                                                           monkeypatch):
    from test_hostile import run_hostile

    monkeypatch.setattr(untrusted, "WALL_SECONDS", 3)
    results = tmp_path / "results"
    records = run_hostile(monkeypatch, model_image, results, data_root, seed=1, repeats=4)
    reasons = {r.seed: (r.status, r.migration_reason) for r in records}
    assert reasons[3] == ("ok", "the ONNX model ran past the host's limit of 3 s and was stopped")
    for seed in (1, 2):
        assert reasons[seed][0] == "ok" and "is stored as external data ('secret.txt')" in reasons[seed][1]
    # npz files whose headers declare 2^40 values: the check's reason, no file stored unread
    assert reasons[4][0] == "ok" and reasons[4][1].startswith(
        f"migration.npz is invalid: predictions.npy declares {TERA} int64"), reasons[4]
    liar = next(r for r in records if r.seed == 4)
    assert not store.transfer_path(results, liar.run_id).exists()
    assert liar.transfer_reason.startswith(f"transfer.npz is invalid: images.npy declares {TERA}x28x28")
    assert len(store.load(results)) == 4
    assert SECRET not in everything_stored(results)
