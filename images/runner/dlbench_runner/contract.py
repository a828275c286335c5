"""What the host knows of the runner: with ``fair`` (the fair profile's networks, which
need numpy), the only module of this package the host imports.

Standard library only and Python 3.9, like the rest of the runner.  The host
plans jobs with the same profiles, hyper-parameter resolution and thread
variables the runner uses, reads the runner's tagged event lines and its
versioned result record, and verifies data sets with the runner's own file
format readers (``formats``).
"""

import json
import math
import os
import platform

from . import blas, data as formats  # noqa: F401 (blas: the host's too)

# Version of the result record this runner writes.  History:
#   1  first version: timings, accuracy, per-epoch curves, provenance.
#   2  ``model_size_bytes`` (the trained model saved as the framework's users save
#      it, after every timed span) and ``param_bytes`` (the parameters' bytes).
#   3  ``robustness``: the trained model's accuracy under white-box attacks, one
#      entry per attack and epsilon (``attack``, ``epsilon``, ``steps``, ``images``,
#      ``accuracy``, ``time_s``, ``reason``).
#   4  migration: ``migration_reason`` (why the trained model was not exported to ONNX;
#      empty when it was), ``migration_model_bytes`` (the exported file's size) and
#      ``migration_time_s`` (the export and the framework's own predictions for the
#      host to compare, outside every timed span); the files ``model.onnx`` and
#      ``migration.npz`` beside the result (``migration.py``).
#   5  the compute libraries: ``blas_loaded``, the BLAS implementations the training
#      process mapped, by name (``blas.loaded``); a job whose spec asks for a BLAS
#      (``blas``) that is not among them fails.  The spec's ``onednn`` (on, off) sets
#      the framework's oneDNN switch (models.json's ``onednn.variable``).
#   6  each ``robustness`` entry's ``attack_loss`` (what the attack's direction follows: the
#      cross entropy's exact output gradient, back-propagated as a vector-Jacobian product)
#      and ``vanished_gradients`` (how many attacked images' input gradients vanished);
#      ``gradient_check`` checks a second image, the most confidently classified.
#   7  a job of several workers (the spec's ``workers``, ``world.py``): worker 0's result
#      holds ``workers``, ``worker_batch_size`` (its share of each batch),
#      ``worker_train_time_s`` (every worker's, in rank order), ``dist_engine`` and
#      ``dist_backend``; the other workers write none.
#   8  ``compile_time_s``: the seconds of setup spent compiling the training step ahead
#      (``torch.compile``'s first calls; a setting such as ``compile``); None where the
#      adapter compiled nothing ahead.
SCHEMA_VERSION = 8

# Where a worker of a job of several stands (``world.py``): the runtime sets these.
WORKER_RANK = "DLBENCH_WORKER_RANK"
WORKER_ADDRESS = "DLBENCH_WORKER_ADDRESS"
WORKER_TIMEOUT = "DLBENCH_WORKER_TIMEOUT_S"
WORKER_HOSTS = "DLBENCH_WORKER_HOSTS"

# One machine-readable line on stdout per event, at the start of a fresh line.
EVENT_TAG = ":::DLBENCH "

# Thread variables every BLAS and OpenMP runtime honours; a job's thread count sets them.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")

PAPER_PROFILE = "paper"     # the published settings
QUICK_PROFILE = "quick"     # the same models, trained briefly
FAIR_PROFILE = "fair"       # one network alike in every framework (FAIR below)
PROFILES = (PAPER_PROFILE, QUICK_PROFILE, FAIR_PROFILE)
# The fair profile (``fair.py``): one network per data set, the same in every framework
# whose models.json lists the data set under ``fair``; these settings and the thread count
# are all a fair job may change (``--set``), as its network and its training are fixed.
# The prototxts' solvers' batch size, learning rate and momentum (a fixed learning rate:
# LeNet's "inv" policy is left out, as are weight decay and Caffe's doubled bias learning
# rate); ``steps`` of training (one epoch of MNIST, two of CIFAR-10); the loss of each of the
# first ``log_steps`` steps is kept; the logits of the first ``probe_images`` test images are
# taken before the first step; after the test pass each layer is timed alone ``op_repeats``
# times (``ops.py``; 0: not timed).
FAIR = {
    "mnist": {"batch_size": 64, "learning_rate": 0.01, "momentum": 0.9, "steps": 937,
              "log_steps": 200, "probe_images": 64, "op_repeats": 20},
    "cifar10": {"batch_size": 100, "learning_rate": 0.001, "momentum": 0.9, "steps": 1000,
                "log_steps": 200, "probe_images": 64, "op_repeats": 20},
}
FAIR_MODELS = {"mnist": "fair-lenet", "cifar10": "fair-cifar10_quick"}
# The initial weights a fair job finds beside its spec (the host writes them there).
FAIR_WEIGHTS_FILE = "weights.npz"
# The checks after training a fair job leaves out (its adapter trains and tests only).
FAIR_CHECKS = {"robust_images": 0, "export_onnx": 0}

# Bounds every model's hyper-parameters keep, checked here so that the host (which
# plans with these functions) and the runner refuse the same values: every number
# is finite and 0 or more, an integer fits the 32-bit integers frameworks take,
# learning rates are more than 0, and the length of training, batch sizes and the
# batches of a test pass (``test_iter``) are at least 1 (a batch at most
# MAX_BATCH_SIZE images, more than either data set holds); a named choice is one of
# its values (``dtype``: the floating-point type a model computes in; ``export_onnx``:
# 0 or 1).
MAX_INT = 2**31 - 1
MAX_BATCH_SIZE = 65536
POSITIVE = ("learning_rate", "learning_rate_lr1")
AT_LEAST_ONE = ("epochs", "max_iter", "max_steps", "batch_size", "test_batch_size", "test_iter",
                "steps", "probe_images")
BATCH_SIZES = ("batch_size", "test_batch_size")
CHOICES = {"dtype": ("float64", "float32"), "export_onnx": (0, 1)}
# Seeds: what every framework's seeding takes (numpy's RandomState, torch, TensorFlow).
MAX_SEED = MAX_INT

# The white-box robustness check after training, settings every model takes (models.json
# may change them): on the first ``robust_images`` test images (0: no check), FGSM at each
# of ``epsilons`` and PGD (BIM from a random start, PGD_STEPS steps) at ``pgd_epsilon``.
# An epsilon is in the [0, 1] pixel scale, whatever the model's own preprocessing, written
# as a number or a fraction ("4/255"); ``epsilons`` is a comma-separated list of them.
ROBUSTNESS = {
    "mnist": {"robust_images": 1000, "epsilons": "0.05,0.1,0.2,0.3", "pgd_epsilon": "0.1"},
    "cifar10": {"robust_images": 1000, "epsilons": "1/255,2/255,4/255,8/255", "pgd_epsilon": "4/255"},
}
# The quick profile attacks the first 100 (a PGD step is a forward and backward pass of
# every image: on 1,000 it would double a quick job; a model's profile may change it).
QUICK_ROBUSTNESS = {"robust_images": 100}
EPSILON_KEYS = ("epsilons", "pgd_epsilon")
# A setting whose bound is another's: checked with it (``robust_images`` <= ``test_subset``).
CHECKED_WITH = {"robust_images": ("test_subset",)}
PGD_STEPS = 10
# The migration check after the robustness check, a setting every model takes: 1 exports
# the trained model to ONNX for the host to run with onnxruntime, 0 does not.
MIGRATION = {"export_onnx": 1}
# The largest exported model a job may hand the host (its /out holds at most 64 MiB).
MAX_MODEL_BYTES = 48 << 20
# The FGSM images a job keeps for transfer attacks (robustness.py's ``transfer.npz``): the
# largest such file; 1,000 CIFAR-10 images take about 4 MB, MNIST ones 0.45 MB.
TRANSFER_FILE = "transfer.npz"
MAX_TRANSFER_BYTES = 16 << 20
# The settings of the checks after training, not of the training itself (a fair job's
# layer timings, ``op_repeats``, among them).
AFTER_TRAINING = frozenset([key for settings in ROBUSTNESS.values() for key in settings]
                           + list(MIGRATION) + ["op_repeats"])
# OpenMP's thread count, a setting every model takes: 0 gives the OpenMP runtime the job's
# thread count, like every other thread variable; N > 0 sets OMP_NUM_THREADS to N, and the
# frameworks that set their OpenMP threads themselves (Lua Torch7's -threads, PyTorch's
# set_num_threads) take N too.  The BLAS libraries keep the job's count (their own variables).
OPENMP = {"omp_threads": 0}
# Settings added after rows were first stored, at defaults that change nothing (TensorFlow's
# thread pools and OpenMP's threads, 0: the job's CPU count): a row without them was run as
# with them.
LATER_SETTINGS = frozenset(["intra_op_threads", "inter_op_threads", "omp_threads"])
# The test images of each data set: ``robust_images`` and ``test_subset`` take at most these.
TEST_IMAGES = {"mnist": 10000, "cifar10": 10000}
# An image of each data set, as the readers (``formats``) give it and the checks after
# training take it: MNIST 28 x 28, CIFAR-10 3 x 32 x 32.
IMAGE_SHAPES = {"mnist": (28, 28), "cifar10": (3, 32, 32)}

__all__ = ["SCHEMA_VERSION", "EVENT_TAG", "THREAD_VARIABLES", "PROFILES", "PAPER_PROFILE", "QUICK_PROFILE",
           "SpecError",
           "load_catalog", "resolve_hyperparameters", "check_value", "check_seed", "default_seed", "MAX_SEED",
           "formats", "cpu_model", "DEVICES", "device_of", "gpu_index", "ROBUSTNESS", "PGD_STEPS", "TEST_IMAGES", "epsilons",
           "MIGRATION", "MAX_MODEL_BYTES", "AFTER_TRAINING", "LATER_SETTINGS", "OPENMP", "FAIR_PROFILE", "FAIR", "FAIR_MODELS", "FAIR_WEIGHTS_FILE",
           "model_name", "fair_hyperparameters", "thread_environment", "worker_threads",
           "WORKER_RANK", "WORKER_ADDRESS", "WORKER_TIMEOUT", "WORKER_HOSTS",
           "openmp_threads", "TRANSFER_FILE", "MAX_TRANSFER_BYTES", "IMAGE_SHAPES"]


def openmp_threads(threads, hyperparameters):
    """The OpenMP threads of a job of ``threads`` threads (None: not set) and these settings."""
    return hyperparameters.get("omp_threads") or threads


def worker_threads(threads, workers):
    """The threads each of a job's ``workers`` gets of its ``threads`` (None: not set): an
    even share, at least one."""
    return max(1, threads // workers) if threads and workers else threads


def thread_environment(threads, hyperparameters):
    """The thread variables of a job of ``threads`` threads (None: none set): every BLAS and
    OpenMP runtime's set to it, OMP_NUM_THREADS to ``omp_threads`` where that is given."""
    environment = {name: str(threads) for name in THREAD_VARIABLES} if threads else {}
    if hyperparameters.get("omp_threads"):
        environment["OMP_NUM_THREADS"] = str(hyperparameters["omp_threads"])
    return environment


class SpecError(Exception):
    """A job spec that cannot be run; the message says why."""


def load_catalog(framework_dir):
    """A framework directory's ``models.json``: its models and their default hyper-parameters."""
    with open(os.path.join(framework_dir, "models.json")) as f:
        return json.load(f)


def resolve_hyperparameters(catalog, dataset, profile, overrides=None, device="cpu"):
    """The paper defaults (with the model's ``gpu_hyperparameters`` on top for a job on a
    GPU: what the original ran there, e.g. Theano's float32), then the profile's changes,
    then the user's overrides."""
    models = catalog["models"]
    if profile == FAIR_PROFILE:
        return _fair_hyperparameters(catalog, dataset, overrides or {})
    if dataset not in models:
        raise SpecError("%s has no model for data set %r (it has: %s)"
                        % (catalog["framework"], dataset, ", ".join(sorted(models))))
    entry = models[dataset]
    if profile not in PROFILES:
        raise SpecError("unknown profile %r (choose from %s)" % (profile, ", ".join(PROFILES)))
    params = dict(ROBUSTNESS.get(dataset, {}))
    if profile == QUICK_PROFILE and dataset in ROBUSTNESS:
        params.update(QUICK_ROBUSTNESS)
    params.update(MIGRATION)
    params.update(OPENMP)
    params.update(entry["hyperparameters"])
    if gpu_index(device) is not None:
        params.update(entry.get("gpu_hyperparameters", {}))
    params.update(entry.get("profiles", {}).get(profile, {}))
    for key, value in (overrides or {}).items():
        if key not in params:
            raise SpecError("%s/%s has no hyper-parameter %r (it has: %s)"
                            % (catalog["framework"], dataset, key, ", ".join(sorted(params))))
        params[key] = _coerce(key, value, params[key])
    for key, value in params.items():
        check_value(key, value)
    _check_robust_images(params, dataset, "robust_images" in (overrides or {}))
    return params


def _fair_hyperparameters(catalog, dataset, overrides):
    if dataset not in catalog.get("fair", ()):
        raise SpecError("%s has no fair network for %s" % (catalog["framework"], dataset))
    return fair_hyperparameters(dataset, overrides)


def fair_hyperparameters(dataset, overrides=None):
    """A fair job's settings: ``FAIR``'s, the user's ``overrides`` of them on top."""
    if dataset not in FAIR:
        raise SpecError("no fair network for data set %r (there are: %s)" % (dataset, ", ".join(sorted(FAIR))))
    overrides = overrides or {}
    params = dict(FAIR[dataset], **FAIR_CHECKS)
    params.update(OPENMP)
    for key, value in overrides.items():
        if key not in FAIR[dataset] and key not in OPENMP:
            raise SpecError("the fair profile fixes the network and its training: %r is not "
                            "one of its settings (%s)" % (key, ", ".join(sorted(list(FAIR[dataset])
                                                                                + list(OPENMP)))))
        params[key] = _coerce(key, value, params[key])
    for key, value in params.items():
        check_value(key, value)
    if params["probe_images"] > TEST_IMAGES[dataset]:
        raise SpecError("hyper-parameter 'probe_images' must be at most %d (the test images of "
                        "%s), not %d" % (TEST_IMAGES[dataset], dataset, params["probe_images"]))
    return params


def model_name(catalog, dataset, profile):
    """The model a job of this profile trains: the framework's own, or the fair network."""
    if profile == FAIR_PROFILE:
        return FAIR_MODELS[dataset]
    return catalog["models"][dataset]["model"]


def _check_robust_images(params, dataset, given):
    """``robust_images`` takes at most the test images the job tests on: a value given is
    refused past them, the default is cut to them."""
    images = params.get("robust_images") or 0
    tested = params.get("test_subset") or TEST_IMAGES.get(dataset)
    if tested is not None and images > tested and not given:
        params["robust_images"] = tested
    elif tested is not None and images > tested:
        raise SpecError("hyper-parameter 'robust_images' must be at most %d (the test images "
                        "of %s%s), not %d" % (tested, dataset, " this profile tests on"
                                              if params.get("test_subset") else "", images))


def epsilons(text):
    """An ``epsilons`` (or ``pgd_epsilon``) setting as floats: numbers or fractions such as
    4/255, comma-separated, each in [0, 1]; SpecError naming the bad one."""
    values = []
    for item in str(text).split(","):
        item = item.strip()
        top, slash, bottom = item.partition("/")
        try:
            value = float(top) / float(bottom) if slash else float(item)
        except (ValueError, ZeroDivisionError):
            raise SpecError("epsilon %r: give a number or a fraction such as 4/255" % item)
        if not 0.0 <= value <= 1.0:             # NaN too
            raise SpecError("epsilon %s: an epsilon is in the [0, 1] pixel scale" % item)
        values.append(value)
    return values


def _coerce(key, value, default):
    """An override takes the type of the default it replaces (an int may stand for a float;
    a number for an epsilon setting's text)."""
    if key in EPSILON_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise SpecError("hyper-parameter %r must be a finite number, not %d digits"
                            % (key, len(str(value))))
    if type(value) is not type(default):
        raise SpecError("hyper-parameter %r must be %s, not %r" % (key, type(default).__name__, value))
    return value


def check_value(key, value):
    """Refuse a hyper-parameter outside the bounds above; the message names it."""
    if key in CHOICES and value not in CHOICES[key]:
        raise SpecError("hyper-parameter %r must be one of %s, not %r"
                        % (key, ", ".join(str(choice) for choice in CHOICES[key]), value))
    if key in EPSILON_KEYS:
        try:
            found = epsilons(value)
        except SpecError as exc:
            raise SpecError("hyper-parameter %r: %s" % (key, exc))
        if key == "pgd_epsilon" and len(found) != 1:
            raise SpecError("hyper-parameter 'pgd_epsilon' is one epsilon, not %r" % (value,))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError("hyper-parameter %r must be a finite number, not %r" % (key, value))
    if key in POSITIVE and not value > 0:
        raise SpecError("hyper-parameter %r must be more than 0, not %r" % (key, value))
    if key in AT_LEAST_ONE and value < 1:
        raise SpecError("hyper-parameter %r must be at least 1, not %r" % (key, value))
    if value < 0:
        raise SpecError("hyper-parameter %r must be 0 or more, not %r" % (key, value))
    if key in BATCH_SIZES and value > MAX_BATCH_SIZE:
        raise SpecError("hyper-parameter %r must be at most %d, not %r" % (key, MAX_BATCH_SIZE, value))
    if isinstance(value, int) and value > MAX_INT:
        raise SpecError("hyper-parameter %r must be at most %d, not %r" % (key, MAX_INT, value))


# A device has three spellings, each where it is read, and the conversions between the
# last two are here:
# - the command line and a campaign file: ``cpu`` or ``gpu:N`` (``--gpu N`` is ``gpu:N``;
#   the images are cpu and gpu too), read by the host's ``options.device``;
# - the plan: the GPU's index on the host (``Job.gpu``; None on the CPU), which a row keeps
#   as text in its ``gpu`` column;
# - the job spec, a row's ``device`` column and the paper's cells: ``cpu`` or ``cuda``, no
#   index, as the paper's columns are named.  A container (or the native runtime's process,
#   through CUDA_VISIBLE_DEVICES) sees its own GPU alone, as its first.  The runner takes
#   ``cuda:N`` too, for a run by hand on a machine of several GPUs.
# Rows hold the last two spellings since schema version 1: they stay.
DEVICES = ("cpu", "cuda")      # the spec's and the rows' devices


def device_of(gpu):
    """The device a job on GPU ``gpu`` (None: the CPU) has in its spec and its row."""
    return "cpu" if gpu is None else "cuda"


def gpu_index(device):
    """The GPU a job's device names: None for ``cpu``, N for ``cuda:N``, 0 for ``cuda``.
    Every adapter selects its GPU by this number, so the forms are parsed here alone."""
    if device == "cpu":
        return None
    kind, colon, index = str(device).partition(":")
    if kind != "cuda" or (colon and not (index.isascii() and index.isdigit())):
        raise SpecError("device %r: use cpu, cuda or cuda:N" % (device,))
    return int(index or 0)


def default_seed(catalog, dataset, profile=None):
    """The seed a model's first run takes when none is given: the original's where
    models.json names it (``seed``), else 1; 1 for every framework's fair network (its
    weights and batches are drawn from the seed: the same seed, the same start)."""
    if profile == FAIR_PROFILE:
        return 1
    return catalog["models"].get(dataset, {}).get("seed", 1)


def check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise SpecError("seed %r: a seed is a whole number from 0 to %d" % (seed, MAX_SEED))
    return seed


def cpu_model():
    """The CPU's model name, read alike for the runner's ``cpu_model`` and the host's row."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
