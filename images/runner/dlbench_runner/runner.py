"""Run one job: set up, train, test, each timed here, and write the result.

An adapter (``adapter.py`` in the framework directory) defines ``Adapter``::

    class Adapter:
        def __init__(self, ctx): ...
        def setup(self):        # import the framework, load data, build the model
        def train(self):        # the training loop; calls ctx.progress() every few steps
                                #     and ctx.epoch_done() per epoch; time it spends on
                                #     other work (a script's per-epoch test passes) goes
                                #     into ctx.train_excluded_s, and out of the epoch's
                                #     time_s too
        def test(self):         # one pass over the test set -> {"accuracy": .., "loss": ..},
                                #     and "predictions" where it has them: the classes it
                                #     predicted for each image, in order (the migration
                                #     check compares the ONNX model's with them)
        def save(self, folder): # the trained model into the empty folder, as the
                                #     framework's users save it (its size is measured)
        def describe(self):     # -> {"framework_version", "param_count", "param_bytes",
                                #     "device_name", "threads": {...}, ...}
        def synchronize(self):  # optional: wait until the device has done all the work
                                #     queued on it (a GPU); called before every clock read
        def export_onnx(self, path, pixels):
                                # optional: the trained model as one ONNX file at path, its
                                #     input the pixels (float32, [0, 1], the data set's
                                #     layout), its preprocessing inside, its output the 10
                                #     classes' logits; with ``logits(pixels)``, the
                                #     framework's own outputs (``migration.py``)
        def gather(self, value):
                                # a framework with a data-parallel engine (models.json's
                                #     ``distributed``), in a job of several workers
                                #     (``ctx.world``, ``world.py``): every worker's value, in
                                #     rank order; its setup joined the others, its train
                                #     takes ``ctx.world.shard`` of each batch, the loss
                                #     scaled by ``ctx.world.scale``, and counts the epoch's
                                #     loss and accuracy over all workers
        def leave(self):        # ... and leaves them once trained: worker 0 alone tests,
                                #     checks and writes the result; the others end there

A job of the fair profile (``fair.py`` in this package) runs the framework directory's
``fair.py`` instead, whose ``Fair`` (usually a subclass of ``Adapter``, which is
importable there as ``dlbench_adapter``) builds the fair network from ``fair.NETWORKS``
and ``ctx.fair_weights()``; in ``setup`` it gives ``ctx.fair_logits()`` the logits of
``ctx.fair_data().probe_x``, in ``train`` it runs the batches of ``FairData.batch(step)``
in order, reporting each with ``ctx.fair_step()``, and ends with ``ctx.fair_trained()``.
The result then holds ``fair``: the weights' digest, those logits and the first losses.

Every clock read goes through ``ctx.now()``, the runner's and an adapter's own
(a span it keeps out of training, a paper span): on a GPU, a framework that queues
work asynchronously (PyTorch, TensorFlow, MXNet, Theano's gpuarray) has then
finished what came before the read, so that every span holds the work done in it.
On the CPU ``synchronize`` does nothing (an adapter defines it so).

After the last timed span (the test pass) the runner asks the adapter to save the
trained model (``save``) into a scratch folder of its own, in the temporary
directory: ``model_size_bytes`` is what the files written there hold, and the
folder is removed at once.  Then come the after-training checks, in ``checks.py``'s order.
A fair job times each layer of its network alone
(``ops.py``; ``op_repeats`` times, 0: not at all).  Then, unless ``robust_images`` is 0,
it attacks the trained model with the adapter's own input gradients (``robustness.py``), and keeps
the FGSM images at ``pgd_epsilon`` as ``/out/transfer.npz`` for transfer attacks.  Then,
unless ``export_onnx`` is 0, it exports the model to ONNX (``migration.py``):
``/out/model.onnx`` and the framework's own predictions beside it, for the host to run
the model with onnxruntime; a model that cannot be exported gives ``migration_reason``,
never a failed job.  No span holds any of these; ``total_time_s`` does, and
``robustness_time_s`` and ``migration_time_s`` say what each cost.

Every loss an adapter reports is checked here: one that is NaN or infinite
stops the job as failed, naming the epoch and step (``TrainingDiverged``), so
that a run that never trained is not stored as ok.  So does an exception a
framework swallows, which Python reports as "Exception ignored ..." through
``sys.unraisablehook`` (``SwallowedError``): MXNet runs its optimizer in a
ctypes callback of its engine, and an error there (a NaN learning rate) was only
printed, 1,600 times, while the weights never changed.
"""

import datetime
import importlib.util
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback

from . import blas, checks, data, world
from .contract import (EVENT_TAG, SCHEMA_VERSION, THREAD_VARIABLES, cpu_model, gpu_index,
                       FAIR_PROFILE, openmp_threads, thread_environment, worker_threads)

PROGRESS_INTERVAL_S = 1.0


def emit(event, **fields):
    fields["event"] = event
    sys.stdout.write("\n" + EVENT_TAG + json.dumps(fields, sort_keys=True) + "\n")
    sys.stdout.flush()


class TrainingDiverged(ArithmeticError):
    """A reported loss is NaN or infinite: the job stops as failed."""


class SwallowedError(RuntimeError):
    """The framework caught an exception and only printed it: the job stops as failed."""


class Swallowed:
    """Records what reaches ``sys.unraisablehook`` (still printed to the log), so
    that ``check`` can fail the job."""

    def __init__(self):
        self.count, self.first = 0, None

    def hook(self, unraisable):
        self.count += 1
        if self.first is None:
            self.first = "%s: %s (%s)" % (getattr(unraisable.exc_type, "__name__", "Exception"),
                                          unraisable.exc_value, unraisable.err_msg or "ignored")
        sys.__unraisablehook__(unraisable)

    def check(self):
        if self.count:
            raise SwallowedError("the framework ignored %d exception(s); the first: %s"
                                 % (self.count, " ".join(str(self.first).split())[:500]))


def utcnow():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class Context:
    """What an adapter sees of its job, and how it reports back."""

    def __init__(self, spec, data_dir):
        self.spec = spec
        self.hp = spec["hyperparameters"]
        self.dataset = spec["dataset"]
        self.device = spec["device"]
        self.gpu = gpu_index(self.device)   # None on the CPU, else the GPU's index
        self.seed = spec["seed"]
        self.threads = spec["threads"]
        # The threads of the framework's own OpenMP setter, where it has one.
        self.omp_threads = openmp_threads(self.threads, self.hp)
        self.data_dir = data_dir
        self.epochs = []
        # Epochs the training will take; adapters that count iterations set it.
        self.planned_epochs = self.hp.get("epochs")
        self.train_samples = 0
        self.test_samples = 0
        # Seconds inside train() that were not training (time.perf_counter's clock).
        self.train_excluded_s = 0.0
        self._last_progress = 0.0
        self._epoch_start = None
        self._epoch_excluded_from = 0.0
        self._step = None           # the last step reported
        self.swallowed = Swallowed()
        self.synchronize = lambda: None     # the adapter's, once it is made
        self._test_arrays = None            # the whole test split, as load_data read it
        # The classes the test pass predicted for the images it tested, in their order, where
        # the adapter's test() gives them ("predictions"): the migration check's framework
        # side, without a second pass over the same images.
        self.test_predictions = None
        # Where this worker stands among the job's workers (``world.py``); None: one process.
        self.world = None
        # Seconds of setup an adapter spent compiling its training step ahead (a compiled
        # step's first calls, e.g. torch.compile's); None: it compiled nothing ahead.
        self.compile_time_s = None
        self.fair = {"losses": []}          # a fair job's weights digest, logits and losses
        self._fair_sums = [0.0, 0]          # its losses' sum, its right predictions

    def now(self):
        """The clock (time.perf_counter), read once the device has finished its queued work."""
        self.synchronize()
        return time.perf_counter()

    def load_data(self, cut=True):
        """The data set's arrays; a model whose settings hold ``train_subset`` or
        ``test_subset`` N > 0 trains or tests on the first N images of that split (the quick
        profile's sizes; the Torch scripts' own non-full mode).  ``cut``: the arrays hold
        only those; else they are whole, for a program that takes the first N itself."""
        arrays = data.load(self.dataset, self.data_dir)
        self._test_arrays = (arrays["test_images"], arrays["test_labels"])
        samples = {}
        for split in ("train", "test"):
            samples[split] = len(arrays[split + "_labels"])
            subset = self.hp.get(split + "_subset") or 0
            if subset and subset < samples[split]:
                samples[split] = subset
                if cut:
                    arrays[split + "_images"] = arrays[split + "_images"][:subset]
                    arrays[split + "_labels"] = arrays[split + "_labels"][:subset]
        self.train_samples, self.test_samples = samples["train"], samples["test"]
        return arrays

    # -- the fair profile (fair.py): the same network, start and batches in every framework --
    def fair_data(self):
        """The fair network's arrays, the same in every framework (``fair.FairData``)."""
        from . import fair
        return fair.FairData(self.load_data(), self.dataset, self.hp, self.seed)

    def fair_weights(self):
        """The initial weights, in the neutral layout (``fair``'s docstring): the file the
        host gave beside the spec, or, run alone, those the seed draws."""
        from . import fair
        if self.spec.get("fair_weights"):
            weights = fair.load_weights(self.spec["fair_weights"], self.dataset)
        else:
            weights = fair.initial_weights(self.dataset, self.seed)
        self.fair["weights_sha256"] = fair.weights_digest(weights)
        return weights

    def fair_logits(self, logits):
        """The logits of the probe images (``FairData.probe_x``) before the first step."""
        self.fair["logits"] = [[float(v) for v in row] for row in logits]

    def fair_step(self, step, loss, correct):
        """Training step ``step`` (from 0): the batch's loss before its update, and how
        many of its images the network classified right.  The first ``log_steps`` losses
        are kept, every one is checked, and progress is reported."""
        loss = self.check_loss(loss, 1, step)
        if step < self.hp["log_steps"]:
            self.fair["losses"].append(loss)
        self._fair_sums[0] += loss
        self._fair_sums[1] += int(correct)
        self.progress(1, (step + 1) / float(self.hp["steps"]), loss, step)

    def fair_trained(self, steps):
        """The fair training is over: one record of its ``steps`` steps (the mean loss and
        the share of training images classified right, as they were trained)."""
        samples = steps * self.hp["batch_size"]
        self.epoch_done(1, self._fair_sums[0] / max(steps, 1),
                        self._fair_sums[1] / float(max(samples, 1)), samples=samples)

    def test_arrays(self):
        """The test split's images (uint8) and labels, whole, for the robustness check."""
        if self._test_arrays is None:
            arrays = data.load(self.dataset, self.data_dir)
            self._test_arrays = (arrays["test_images"], arrays["test_labels"])
        return self._test_arrays

    def epoch_start(self):
        self._epoch_start = self.now()
        self._epoch_excluded_from = self.train_excluded_s

    def check_loss(self, loss, epoch, step=None):
        """The loss as a float; a NaN or infinite one raises TrainingDiverged (and an
        exception the framework swallowed since the last report, SwallowedError)."""
        self.swallowed.check()
        loss = float(loss)
        if step is not None:
            self._step = step
        if not math.isfinite(loss):
            where = "epoch %s" % epoch
            if self._step is not None:
                where += " (step %d)" % self._step
            raise TrainingDiverged("loss became %s at %s" % (loss, where))
        return loss

    def progress(self, epoch, fraction, loss, step=None):
        """Report progress within an epoch (``step``: training steps so far, counted
        over all epochs); the loss is checked on every call, the report throttled,
        so cheap to call often."""
        loss = self.check_loss(loss, epoch, step)
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_INTERVAL_S:
            self._last_progress = now
            emit("progress", epoch=epoch, epochs=self.planned_epochs,
                 fraction=round(fraction, 4), loss=loss)

    def epoch_done(self, epoch, loss, accuracy, samples=None):
        """Report one finished epoch of training (mean loss, training accuracy)."""
        elapsed = None
        if self._epoch_start is not None:   # less what the epoch spent on other work
            elapsed = (self.now() - self._epoch_start
                       - (self.train_excluded_s - self._epoch_excluded_from))
        record = {"epoch": epoch, "loss": self.check_loss(loss, epoch), "accuracy": float(accuracy),
                  "time_s": elapsed, "samples": samples}
        self.epochs.append(record)
        emit("epoch", epochs=self.planned_epochs, **record)


def adapter_module(framework_dir, name="adapter"):
    """The framework directory's adapter.py (or fair.py) as a module (an adapter imports
    its framework only in setup(), so this works wherever numpy does).  adapter.py is
    importable as ``dlbench_adapter`` once loaded: fair.py builds on it."""
    module_name = "dlbench_adapter" if name == "adapter" else "dlbench_" + name
    module_spec = importlib.util.spec_from_file_location(module_name, os.path.join(framework_dir, name + ".py"))
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    module_spec.loader.exec_module(module)
    return module


def load_adapter(framework_dir, profile=None):
    """The adapter class a job of ``profile`` runs: fair.py's ``Fair`` for the fair
    profile, else adapter.py's ``Adapter``."""
    adapter = adapter_module(framework_dir).Adapter
    if profile == FAIR_PROFILE:
        return adapter_module(framework_dir, "fair").Fair
    return adapter


def apply_threads(threads, hyperparameters, environ=os.environ):
    """Thread variables every BLAS and OpenMP runtime honours (those the host did not set
    already); set before the import."""
    for name, value in thread_environment(threads, hyperparameters).items():
        environ.setdefault(name, value)
    return {name: environ.get(name) for name in THREAD_VARIABLES}


def folder_bytes(folder):
    """The bytes of the regular files under ``folder`` (links not followed)."""
    total = 0
    for top, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(top, name)
            if os.path.isfile(path) and not os.path.islink(path):
                total += os.path.getsize(path)
    return total


def saved_model_bytes(adapter):
    """The size of the trained model as the adapter saves it (None: it has no ``save``)."""
    if not hasattr(adapter, "save"):
        return None
    folder = tempfile.mkdtemp(prefix="dlbench-model-")
    try:
        adapter.save(folder)
        size = folder_bytes(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if not size:
        raise RuntimeError("the adapter's save wrote nothing")
    return size


def write_json_atomic(path, document):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(document, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run(spec, framework_dir, data_dir, out_dir):
    """Run a completed spec; returns the result record (also written to out_dir)."""
    started = utcnow()
    t_start = time.perf_counter()
    if spec.get("workers"):     # each worker its share of the job's threads
        spec = dict(spec, threads=worker_threads(spec["threads"], spec["workers"]))
    env_threads = apply_threads(spec["threads"], spec["hyperparameters"])
    os.environ.update(spec.get("environment") or {})     # read when the framework loads
    ctx = Context(spec, data_dir)
    result = {
        "schema_version": SCHEMA_VERSION, "status": "failed", "error": None,
        "framework": spec["framework"], "dataset": spec["dataset"], "model": spec["model"],
        "profile": spec["profile"], "hyperparameters": spec["hyperparameters"],
        "device": spec["device"], "seed": spec["seed"], "job_id": spec.get("job_id"),
        "run_id": spec.get("run_id"), "started_at": started,
        "python_version": platform.python_version(), "cpu_model": cpu_model(),
        "threads": {"requested": spec["threads"], "env": env_threads},
    }
    phase = "setup"
    previous_hook, sys.unraisablehook = sys.unraisablehook, ctx.swallowed.hook
    try:
        emit("phase", phase="setup")
        ctx.world = world.from_spec(spec)
        adapter = load_adapter(framework_dir, spec["profile"])(ctx)
        ctx.synchronize = getattr(adapter, "synchronize", ctx.synchronize)
        adapter.setup()
        ctx.swallowed.check()
        result["setup_time_s"] = ctx.now() - t_start
        result["compile_time_s"] = ctx.compile_time_s
        phase = "train"
        emit("phase", phase="train")
        t0 = ctx.now()
        adapter.train()
        ctx.swallowed.check()
        result["train_time_s"] = ctx.now() - t0 - ctx.train_excluded_s
        if ctx.train_excluded_s:
            result["train_excluded_s"] = ctx.train_excluded_s
        if ctx.world is not None:       # every worker's time; then worker 0 goes on alone
            result.update(worker_train_time_s=[float(t) for t in adapter.gather(result["train_time_s"])],
                          workers=ctx.world.size,
                          worker_batch_size=len(range(0, ctx.hp["batch_size"], ctx.world.size)))
            adapter.leave()
            if not ctx.world.leader:
                result["status"] = "ok"
                emit("done", status="ok", worker=ctx.world.rank)
                return result
        phase = "test"
        emit("phase", phase="test")
        t0 = ctx.now()
        scores = adapter.test()
        ctx.swallowed.check()
        result["test_time_s"] = ctx.now() - t0
        ctx.test_predictions = scores.pop("predictions", None)
        for key in ("accuracy", "loss"):
            if scores.get(key) is not None and not math.isfinite(float(scores[key])):
                raise TrainingDiverged("the test gave %s %s" % (key, float(scores[key])))
        phase = "save"
        emit("phase", phase="save")
        result["model_size_bytes"] = saved_model_bytes(adapter)
        ctx.swallowed.check()
        for phase, wanted, check, skipped in checks.CHECKS:     # after training: checks.py
            if not wanted(spec, ctx.hp):
                if skipped is not None:
                    skipped(result)
                continue
            emit("phase", phase=phase)
            t0 = ctx.now()
            check(adapter, ctx, result, out_dir)
            ctx.swallowed.check()
            result[phase + "_time_s"] = ctx.now() - t0      # the whole check: its cost
        phase = "describe"
        result.update(adapter.describe())
        result["threads"]["env"] = env_threads
        result["device_name"] = result.get("device_name") or result["cpu_model"]
        result["accuracy"] = float(scores["accuracy"])
        result["test_loss"] = scores.get("loss")
        trained = sum(e.get("samples") or ctx.train_samples for e in ctx.epochs) or ctx.train_samples
        result["train_samples"] = ctx.train_samples
        result["test_samples"] = ctx.test_samples
        result["train_images_per_s"] = trained / result["train_time_s"] if result["train_time_s"] else None
        result["test_images_per_s"] = ctx.test_samples / result["test_time_s"] if result["test_time_s"] else None
        result["status"] = "ok"
    except Exception as exc:  # the failure becomes the record, not a lost run
        result["error"] = "%s during %s: %s" % (type(exc).__name__, phase, exc)
        traceback.print_exc()
        if ctx.world is not None and not ctx.world.leader:     # worker 0 alone writes the result
            emit("done", status="failed", worker=ctx.world.rank, error=result["error"])
            return result
    sys.unraisablehook = previous_hook
    result["epochs"] = ctx.epochs
    if spec["profile"] == FAIR_PROFILE and result["status"] == "ok":
        result["fair"] = ctx.fair
    result["blas"] = result.pop("blas_paths", None) or blas.mapped_libraries()
    result["blas_loaded"] = blas.loaded(result["blas"])
    wanted = spec.get("blas")
    if result["status"] == "ok" and wanted and wanted not in result["blas_loaded"]:
        result["status"] = "failed"
        result["error"] = ("BLAS %s was asked for, but the training process ran on %s"
                           % (wanted, ", ".join(result["blas_loaded"]) or "none"))
    result["total_time_s"] = time.perf_counter() - t_start
    result["finished_at"] = utcnow()
    write_json_atomic(os.path.join(out_dir, "result.json"), result)
    emit("done", status=result["status"], accuracy=result.get("accuracy"), error=result["error"])
    return result
