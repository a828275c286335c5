"""The stored tables: the row's columns and the side tables' Parquet schemas, and their
history (the records pydantic validates, the runner's result and the row, are in records.py;
reading rows needs no pydantic).

Stored rows carry ``schema_version``, in every row and in the Parquet file
metadata.  History of the row schema:
    1  first version.
    2  ``campaign`` (the campaign's name, to select its rows); the limits a job ran
       under (``memory_limit_bytes``, ``timeout_s``); the summary of its resource
       trace (``cpu_percent_mean``, ``memory_peak_bytes``, ``gpu_util_mean``,
       ``gpu_memory_peak_bytes``, ``trace_samples``) and the kernel's own peak
       (``memory_peak_cgroup_bytes``).  Version-1 rows are read with these empty.
    3  ``settings_from``: the framework whose default settings the job trained with
       (GTDLBench's cross-settings); empty for a framework's own defaults, as in
       every older row.
    4  ``written_schema_version``: the version the row was first written with
       (``schema_version`` is the version of the file that holds it, which an
       upgrade raises); older rows get their own ``schema_version``.  The results
       directory moved to ``RESULTS/runs/`` and ``RESULTS/traces/`` (rows were
       ``RESULTS/runs-*.parquet``, traces ``RESULTS/_traces/``).
       Host facts that make timings unstable, as pyperf records them: the CPU
       frequency governor (``host_cpu_governor``), turbo boost (``host_turbo``), the
       1-minute load average when the run started (``host_load_avg``) and the CPUs
       isolated from the scheduler (``host_isolated_cpus``, "" for none); each empty
       where the host does not show it (VMs, containers) and in every older row.
       ``node``, ``slurm_job_id`` (the array's job id), ``slurm_array_task_id``: where a
       job of a Slurm campaign ran; empty for local runs, as in every older row.  New
       statuses ``node_fail`` and ``cancelled`` (a Slurm task ended without a row).
       ``script_train_time_s``, ``script_test_time_s``: the training and testing
       times a framework's own script printed (Lua Torch7 runs GTDLBench's scripts,
       whose "whole training time" / "whole test time" are the published numbers),
       beside the runner's own.  Framework ``torch`` is Lua Torch7 from this version
       on; older ``torch`` rows were the PyTorch port and are read as ``pytorch``.
    5  ``paper_train_time_s``, ``paper_test_time_s`` replace ``script_train_time_s`` and
       ``script_test_time_s``: the spans GTDLBench's own method measured (its scripts'
       prints, its logs' spans), with the periodic work its programs did inside them,
       beside dlbench's uniform ``train_time_s`` (training steps only) and
       ``test_time_s`` (one pass over the test set).  Each framework's definition is in
       the documentation (docs/results.md); empty where a job did not run the original's periodic work (for all
       but Lua Torch7, every profile but ``paper``) or GTDLBench published no time.  Version-4 rows keep
       their values under the new names (only Lua Torch7 filled them).
    6  ``gpu_name``, ``gpu_driver``, ``gpu_memory_total_bytes``: the GPU a GPU job ran on,
       its NVIDIA driver and its memory, from the driver (NVML) on the host; empty for
       CPU jobs and in every older row (a GPU row's ``device_name`` still says what the
       framework saw).
    7  ``builds_alongside``: how many image builds of the same ``dlbench run`` ran at any
       point during the job (a job starts as soon as its own image is ready, while others
       may still build, and shares the CPUs with them); 0 for a job that ran alone, empty
       for a job that never started and in every older row (they ran after every build).
    8  ``model_size_bytes``: the bytes of the trained model saved as the framework's own
       users save it (Caffe's .caffemodel, a TensorFlow checkpoint, Lua Torch7's
       torch.save, MXNet's .params, Theano's pickled shared variables, PyTorch's
       state_dict), saved after every timed span; ``param_bytes``: the parameters times
       their element size; ``robustness_time_s``: the seconds of the robustness check
       after training (the gradient check and the attacks, robustness/ has their rows);
       ``gradient_error``: the gradient check's figure (the relative error of the input
       gradient against finite differences, at the second-worst of its pixels).  Empty in
       every older row.
    9  the migration check: the trained model exported to ONNX (stored as
       ``RESULTS/models/<run id>.onnx``) and run by the host with onnxruntime on the test
       images the job tested on: ``migrated_accuracy``, ``migration_mismatches`` (images
       whose class differs from the framework's own prediction),
       ``migration_max_logit_error`` (relative, on the first 16 images),
       ``migration_reason`` (why they are empty: the framework's adapter exports no
       model, its exporter refused it, onnxruntime could not run it),
       ``migration_model_bytes`` (the ONNX file) and ``migration_time_s`` (the export
       and the framework's own predictions, in the job).  Empty in every older row.
    10 ``migration_host_time_s``: the migration check's share on the host, after the job
       (reading the model and the test images, onnxruntime's run): outside the runner's
       ``total_time_s``.  Empty in every older row.
    11 the compute libraries: ``blas`` is now the BLAS library the job asked for and
       ``onednn`` its oneDNN switch (empty: the image's default; empty in older rows);
       ``blas_loaded`` the BLAS implementations the training process mapped, by name
       (the old ``blas`` held those files' paths: upgraded to their names).
    12 the fair profile's checks: ``fair_weights_sha256`` (the digest of the initial weights
       the job started from, ``dlbench_runner.fair.weights_digest``) and
       ``fair_logit_error`` (its logits of the probe images before training against the
       host's NumPy reference: the largest difference over the largest reference logit).
       Empty in every other row.
    13 the noise facts of each job, not of the run: ``host_load_avg`` is now the 1-minute load
       average as the job started (the run's start in older rows; for a job that never
       started, when its row was made); ``host_load_end`` as it ended; ``host_load_max`` the
       highest of the two and of the resource trace's samples; ``other_cpu_s``, the CPU
       seconds the host's other processes used while the job ran (the busy time from
       /proc/stat of the CPUs it may run on, its pinned ones or all, less the job's own,
       its container's cgroup or its process tree's, and less dlbench's), and
       ``other_cpu_share``, that over the job's wall time times those CPUs.  Empty in
       every older row and for a job that never started.
    14 ``transfer_reason``: why the host did not take the FGSM images a job left for the
       transfer attacks (a link, a FIFO, a file past its cap, or one whose npz headers
       the host's reader refused), where it left a file; empty otherwise and in every
       older row.
    15 ``overrides``: the hyper-parameters the job was asked to change (JSON, sorted keys,
       as ``hyperparameters``: ``--set``, ``--sweep``, a campaign's tables, another
       framework's settings; ``{}`` for a job on its model's defaults), so that a report
       tells own from changed settings by what was asked, not by today's models.json;
       empty in every older row (the report then compares with today's defaults).
    16 the platforms a trained model was deployed on after training (``checks/platforms.py``):
       ``platforms`` (those the job asked for, comma-separated), ``platforms_time_s`` (the
       deployments on the host, after the job) and ``platforms_reason`` (why the
       ``platforms`` side table has no rows of the job); empty in a job that asked for
       none and in every older row.
    17 a job trained data-parallel over several workers (``docs/distributed.md``): ``workers``
       (the count asked for; empty: one process, as every older row), ``worker_batch_size``
       (worker 0's share of each global batch), ``dist_engine`` and ``dist_backend`` (what
       the framework trained with), ``worker_train_time_s`` (each worker's own training time,
       in rank order).
    18 ``nodes``: the hosts a job's workers ran on (1 where they shared one; N where a Slurm
       allocation gave each its node, ``--runtime native``); empty for one process and in
       every older row.
    19 ``compile_time_s``: the seconds of setup a job spent compiling its training step
       ahead (``torch.compile``'s first calls, ``--set compile=true``), part of
       ``setup_time_s`` and none of ``train_time_s``; empty where nothing was compiled
       ahead and in every older row.
Readers refuse rows newer than they know; older ones are upgraded step by step
by ``store.upgrade``.

The resource traces are a second table (``TRACE_SCHEMA``), one Parquet file per
job under ``RESULTS/traces/``, with its own version:
    1  first version: run_id, t_s, cpu_percent, memory_bytes, gpu_util,
       gpu_memory_bytes.

The robustness of a trained model is a third table (``ROBUSTNESS_SCHEMA``), one
Parquet file per job under ``RESULTS/robustness/``, one row per attack and epsilon,
with its own version:
    1  first version: run_id, attack (``none``: the clean images, ``fgsm``, ``pgd``),
       epsilon (the [0, 1] pixel scale), steps, images, accuracy, time_s, and reason
       (why accuracy is empty: the framework gave no gradient to the input).
    2  attack_loss (what an attack's direction follows: since 2 the cross entropy's
       exact output gradient as a vector-Jacobian product; older rows get
       ``OLD_ATTACK_LOSS``, the framework's float32 cross-entropy gradient, which
       vanished for confidently classified images) and vanished_gradients (how many
       attacked images had an input gradient that vanished; empty in older rows,
       which did not count them).

The losses of a fair job's first steps are a fourth table (``STEPS_SCHEMA``), one Parquet
file per job under ``RESULTS/steps/``, with its own version:
    1  first version: run_id, step (from 0), loss (the batch's mean loss at that step,
       before its update).

Where a fair job's time goes is a fifth table (``OPS_SCHEMA``), one Parquet file per job
under ``RESULTS/ops/``, one row per layer and pass (``dlbench_runner/ops.py`` defines
them), with its own version:
    1  first version: run_id, layer (``network`` and ``step`` for the whole), index, kind,
       pass (forward, backward, step), shape and output_shape (with the batch), flops,
       time_s (the median; backward: forward-and-backward's less forward's), spread_s
       (the interquartile range of the measured pass), repeats.

Where a trained model was deployed is a sixth table (``PLATFORMS_SCHEMA``), one Parquet
file per job under ``RESULTS/platforms/``, one row per platform (``checks/platforms.py``),
with its own version:
    1  first version: run_id, platform, status (ok, failed), reason, runtime (what ran the
       model), images (the test images it classified), accuracy, mismatches (images
       classified otherwise than by the framework), max_logit_error, conversion_s,
       model_bytes, converter_layout, conversion_shared, latency_ms and latency_iqr_ms
       (batch 1, after warm-up), throughput and throughput_batch, peak_memory_bytes,
       adversarial_images and adversarial_accuracy (the job's FGSM images).
"""

from __future__ import annotations

import datetime as dt
import json
import types
import typing

import pyarrow as pa

from .checks import row_fields

SCHEMA_VERSION = 19
TRACE_SCHEMA_VERSION = 1
ROBUSTNESS_SCHEMA_VERSION = 2
# What robustness rows before version 2 attacked along (``upgrade_robustness``).
OLD_ATTACK_LOSS = ("cross entropy summed over the batch, its input gradient by the framework in "
                   "float32 (vanishes for confidently classified images: gradient-masked)")
STEPS_SCHEMA_VERSION = 1
OPS_SCHEMA_VERSION = 1
PLATFORMS_SCHEMA_VERSION = 1
MAX_PROBE_LOGITS = 10_000 * 10      # a fair job's probe logits: at most every test image's
MAX_LOGGED_STEPS = 100_000
ATTACKS = ("none", "fgsm", "pgd")
MAX_RESULT_BYTES = 4 << 20
STATUSES = ("ok", "failed", "timeout", "oom", "unsupported", "no_result", "node_fail", "cancelled")


class _Job:
    """A row's first columns: the job's outcome, what it was, what the runner measured."""

    schema_version: int = SCHEMA_VERSION
    written_schema_version: int = SCHEMA_VERSION   # kept through upgrades
    run_id: str
    job_id: str
    status: str
    error: str | None = None
    exit_code: int | None = None
    log_tail: str | None = None
    # what the job was
    campaign: str | None = None
    framework: str
    dataset: str
    model: str
    profile: str
    hyperparameters: str          # JSON, sorted keys
    overrides: str | None = None  # the keys the job was asked to change, JSON as hyperparameters
    settings_from: str | None = None   # another framework's defaults (None: its own)
    blas: str | None = None            # the BLAS library asked for (None: the image's default)
    onednn: str | None = None          # oneDNN kernels asked on or off (None: the default)
    workers: int | None = None         # trained data-parallel over this many (None: one process)
    nodes: int | None = None           # the hosts the workers ran on (None: one process)
    batch_size: int | None = None
    learning_rate: float | None = None
    device: str                                # cpu or cuda, as the job spec says (no index)
    gpu: str | None = None                     # the plan's GPU index (--gpu N); empty on the CPU
    gpu_name: str | None = None                # the GPU's model, as its driver names it
    gpu_driver: str | None = None              # the NVIDIA driver's version
    gpu_memory_total_bytes: int | None = None
    seed: int
    repeat: int = 0
    threads: int | None = None
    cpus: float | None = None
    cpuset: str | None = None
    # what the runner measured
    setup_time_s: float | None = None
    compile_time_s: float | None = None        # of setup: the training step compiled ahead
    train_time_s: float | None = None
    test_time_s: float | None = None
    total_time_s: float | None = None
    paper_train_time_s: float | None = None   # the span GTDLBench's method timed
    paper_test_time_s: float | None = None
    accuracy: float | None = None
    test_loss: float | None = None
    train_images_per_s: float | None = None
    test_images_per_s: float | None = None
    train_samples: int | None = None
    test_samples: int | None = None
    param_count: int | None = None
    param_bytes: int | None = None       # parameters times their element size
    model_size_bytes: int | None = None  # the trained model saved as its framework's users save it
    # a job of several workers: worker 0's share of each batch, the engine, each one's time
    worker_batch_size: int | None = None
    dist_engine: str | None = None
    dist_backend: str | None = None
    worker_train_time_s: list[float] | None = None


class _Host:
    """A row's last columns: its epochs, what the runner saw, what the host adds."""

    epoch_loss: list[float] = []
    epoch_accuracy: list[float] = []
    epoch_time_s: list[float] = []
    # what the runner saw
    framework_version: str | None = None
    python_version: str | None = None
    device_name: str | None = None
    blas_loaded: str | None = None        # the BLAS libraries training ran on, by name, ";"
    threads_env: str | None = None        # JSON
    threads_framework: str | None = None  # JSON
    libraries: str | None = None          # JSON
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    # what the host adds
    wall_time_s: float | None = None
    memory_limit_bytes: int | None = None
    timeout_s: float | None = None
    builds_alongside: int | None = None           # image builds running at any point during it
    # the resource trace, summarised (the samples are in RESULTS/traces/)
    cpu_percent_mean: float | None = None         # 100 = one CPU busy
    memory_peak_bytes: int | None = None          # as the kernel charges the container
    memory_peak_cgroup_bytes: int | None = None   # read from the host's cgroup files
    gpu_util_mean: float | None = None            # percent
    gpu_memory_peak_bytes: int | None = None
    trace_samples: int | None = None
    runtime: str = "docker"
    image: str | None = None
    image_id: str | None = None
    dlbench_version: str
    docker_version: str | None = None
    host_name: str | None = None
    host_cpu_model: str | None = None
    host_cpus: int | None = None
    host_memory_gb: float | None = None
    host_os: str | None = None
    host_cpu_governor: str | None = None    # e.g. performance; None: no cpufreq on this host
    host_turbo: bool | None = None
    host_load_avg: float | None = None      # 1-minute, when the job started (before 13: the run)
    host_load_end: float | None = None      # 1-minute, when the job ended
    host_load_max: float | None = None      # the highest of those and of the trace's samples
    other_cpu_s: float | None = None        # CPU seconds the host's other processes used meanwhile
    other_cpu_share: float | None = None    # that over the job's wall time times its CPUs
    host_isolated_cpus: str | None = None   # e.g. "2-3"; "" for none
    dataset_sha256: str | None = None
    # where a job of a Slurm campaign ran (empty for local runs)
    node: str | None = None
    slurm_job_id: str | None = None          # the array's job id
    slurm_array_task_id: int | None = None
    recorded_at: dt.datetime


def _columns(declared: type) -> dict[str, tuple]:
    """A class's columns in their order: (type, default) each, as the checks declare theirs
    (``...``: none, the column is required)."""
    return {name: (kind, vars(declared).get(name, ...)) for name, kind in typing.get_type_hints(declared).items()}


# One stored row: one job's outcome, the runner's measurements, the after-training checks'
# columns (``checks.row_fields``: each check declares its own), host provenance.  The row's
# model (``records.RunRecord``) and its Parquet schema are both made of them.
CHECK_COLUMNS = tuple(row_fields())     # empty in a row written without that check (store.upgrade)
COLUMNS = {**_columns(_Job), **row_fields(), **_columns(_Host)}


def dumps(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


_ARROW = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_(),
          dt.datetime: pa.timestamp("us", tz="UTC")}


def _arrow_type(annotation) -> pa.DataType:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return _arrow_type(args[0])
    if origin is list:
        return pa.list_(_arrow_type(args[0]))
    return _ARROW[annotation]


def _pandas_metadata(fields: list[pa.Field]) -> bytes:
    """What pandas reads a Parquet file with: its integer columns as nullable ``Int64``
    (an exit code 137, not 137.0), the others as it would anyway."""
    return json.dumps({"index_columns": [], "column_indexes": [], "columns": [
        {"name": f.name, "field_name": f.name, "pandas_type": "int64", "numpy_type": "Int64",
         "metadata": None} for f in fields if f.type == pa.int64()]}).encode()


_FIELDS = [pa.field(name, _arrow_type(kind)) for name, (kind, _) in COLUMNS.items()]
ARROW_SCHEMA = pa.schema(_FIELDS, metadata={b"dlbench.schema_version": str(SCHEMA_VERSION).encode(),
                                            b"pandas": _pandas_metadata(_FIELDS)})

# Columns each version added: store.upgrade fills them with nulls when it reads
# older rows (4's with the version the row was written with).
ADDED_IN = {
    2: ["campaign", "memory_limit_bytes", "timeout_s", "cpu_percent_mean", "memory_peak_bytes",
        "memory_peak_cgroup_bytes", "gpu_util_mean", "gpu_memory_peak_bytes", "trace_samples"],
    3: ["settings_from"],
    4: ["written_schema_version", "host_cpu_governor", "host_turbo", "host_load_avg",
        "host_isolated_cpus", "node", "slurm_job_id", "slurm_array_task_id",
        "script_train_time_s", "script_test_time_s"],
    6: ["gpu_name", "gpu_driver", "gpu_memory_total_bytes"],
    7: ["builds_alongside"],
    8: ["param_bytes", "model_size_bytes", "robustness_time_s", "gradient_error"],
    9: ["migrated_accuracy", "migration_mismatches", "migration_max_logit_error", "migration_reason",
        "migration_model_bytes", "migration_time_s"],
    10: ["migration_host_time_s"],
    11: ["blas", "onednn"],
    12: ["fair_weights_sha256", "fair_logit_error"],
    13: ["host_load_end", "host_load_max", "other_cpu_s", "other_cpu_share"],
    14: ["transfer_reason"],
    15: ["overrides"],
    16: ["platforms", "platforms_time_s", "platforms_reason"],
    17: ["workers", "worker_batch_size", "dist_engine", "dist_backend", "worker_train_time_s"],
    18: ["nodes"],
    19: ["compile_time_s"],
}
# Columns a version renamed, old name -> new name.
RENAMED_IN = {5: {"script_train_time_s": "paper_train_time_s",
                  "script_test_time_s": "paper_test_time_s"},
              11: {"blas": "blas_loaded"}}

TRACE_SCHEMA = pa.schema(
    [pa.field("run_id", pa.string()), pa.field("t_s", pa.float64()),
     pa.field("cpu_percent", pa.float64()), pa.field("memory_bytes", pa.int64()),
     pa.field("gpu_util", pa.float64()), pa.field("gpu_memory_bytes", pa.int64())],
    metadata={b"dlbench.trace_schema_version": str(TRACE_SCHEMA_VERSION).encode()},
)

ROBUSTNESS_SCHEMA = pa.schema(
    [pa.field("run_id", pa.string()), pa.field("attack", pa.string()),
     pa.field("epsilon", pa.float64()), pa.field("steps", pa.int64()),
     pa.field("images", pa.int64()), pa.field("accuracy", pa.float64()),
     pa.field("time_s", pa.float64()), pa.field("reason", pa.string()),
     pa.field("attack_loss", pa.string()), pa.field("vanished_gradients", pa.int64())],
    metadata={b"dlbench.robustness_schema_version": str(ROBUSTNESS_SCHEMA_VERSION).encode()},
)


def upgrade_robustness(table: pa.Table, version: int) -> pa.Table:
    """Robustness rows of an older version, brought to the current one: version 2 added
    attack_loss (older attacks' rows: ``OLD_ATTACK_LOSS``; their clean rows and those
    without an accuracy: empty, as a current runner writes them) and vanished_gradients
    (empty: not counted)."""
    if version < 2:
        attacked = [a != "none" and acc is not None
                    for a, acc in zip(table["attack"].to_pylist(), table["accuracy"].to_pylist())]
        table = table.append_column(ROBUSTNESS_SCHEMA.field("attack_loss"), pa.array(
            [OLD_ATTACK_LOSS if a else None for a in attacked], pa.string()))
        table = table.append_column(ROBUSTNESS_SCHEMA.field("vanished_gradients"),
                                    pa.nulls(len(table), pa.int64()))
    return table

OPS_SCHEMA = pa.schema(
    [pa.field("run_id", pa.string()), pa.field("layer", pa.string()), pa.field("index", pa.int64()),
     pa.field("kind", pa.string()), pa.field("pass", pa.string()), pa.field("shape", pa.string()),
     pa.field("output_shape", pa.string()), pa.field("flops", pa.int64()),
     pa.field("time_s", pa.float64()), pa.field("spread_s", pa.float64()),
     pa.field("repeats", pa.int64())],
    metadata={b"dlbench.ops_schema_version": str(OPS_SCHEMA_VERSION).encode()},
)

STEPS_SCHEMA = pa.schema(
    [pa.field("run_id", pa.string()), pa.field("step", pa.int64()), pa.field("loss", pa.float64())],
    metadata={b"dlbench.steps_schema_version": str(STEPS_SCHEMA_VERSION).encode()},
)

PLATFORMS_SCHEMA = pa.schema(
    [pa.field("run_id", pa.string()), pa.field("platform", pa.string()), pa.field("status", pa.string()),
     pa.field("reason", pa.string()), pa.field("runtime", pa.string()), pa.field("images", pa.int64()),
     pa.field("accuracy", pa.float64()), pa.field("mismatches", pa.int64()),
     pa.field("max_logit_error", pa.float64()), pa.field("conversion_s", pa.float64()),
     pa.field("model_bytes", pa.int64()), pa.field("converter_layout", pa.string()),
     pa.field("conversion_shared", pa.bool_()), pa.field("latency_ms", pa.float64()),
     pa.field("latency_iqr_ms", pa.float64()), pa.field("throughput", pa.float64()),
     pa.field("throughput_batch", pa.int64()), pa.field("peak_memory_bytes", pa.int64()),
     pa.field("adversarial_images", pa.int64()), pa.field("adversarial_accuracy", pa.float64())],
    metadata={b"dlbench.platforms_schema_version": str(PLATFORMS_SCHEMA_VERSION).encode()},
)
