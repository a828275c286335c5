"""What a stored value may be: the rules every row is checked by, when a job's row is made
(``collect``: the runner's result is hostile input) and whenever rows are read (``store``:
a results directory is as untrusted as a job's out/, since anyone, an older dlbench or
another tool, may have written its files).

A row breaking a rule is never shown: a time of -inf or NaN, an accuracy of 150 %, made a
report say "3/3 ok" and "trained -inf× as long as the fastest run".  The rules:

    times       finite and 0 or more (seconds; also a job's rates, limits and figures
                that cannot be negative, such as CPU percentages and errors)
    fractions   in [0, 1] (accuracies, epsilon)
    counts      0 or more
    strings     at most ``STRING_BYTES`` bytes: no string a job can make is longer than
                its whole result.json (``MAX_RESULT_BYTES``), and the host's own (a log
                tail of 50 lines of 10,000 characters) are shorter
    status      one of ``STATUSES``

Empty values are allowed everywhere (an older row, a job that never measured).  The checks
are vectorised with pyarrow's compute functions: a row costs nothing unless it breaks one.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .schema import MAX_RESULT_BYTES, STATUSES

STRING_BYTES = MAX_RESULT_BYTES

TIME, FRACTION, COUNT, NOT_NEGATIVE, STATUS = "time", "fraction", "count", "not negative", "status"
WORDS = {TIME: "not a finite number of 0 or more", FRACTION: "not in [0, 1]",
         COUNT: "negative", NOT_NEGATIVE: "negative", STATUS: "not a status"}

# Per table, column -> rule; a column a table lacks (an older version's) is not checked.
ROWS = {
    **dict.fromkeys(["setup_time_s", "compile_time_s", "train_time_s", "test_time_s", "total_time_s",
                     "paper_train_time_s", "paper_test_time_s", "robustness_time_s",
                     "migration_time_s", "migration_host_time_s", "wall_time_s", "timeout_s",
                     "epoch_time_s", "train_images_per_s", "test_images_per_s", "learning_rate",
                     "cpus", "cpu_percent_mean", "gpu_util_mean", "host_memory_gb",
                     "host_load_avg", "host_load_end", "host_load_max", "other_cpu_s",
                     "platforms_time_s", "worker_train_time_s"], TIME),
    **dict.fromkeys(["accuracy", "migrated_accuracy", "epoch_accuracy", "other_cpu_share"], FRACTION),
    **dict.fromkeys(["train_samples", "test_samples", "param_count", "param_bytes",
                     "model_size_bytes", "migration_mismatches", "migration_model_bytes",
                     "batch_size", "repeat", "threads", "memory_limit_bytes",
                     "gpu_memory_total_bytes", "memory_peak_bytes", "memory_peak_cgroup_bytes",
                     "gpu_memory_peak_bytes", "trace_samples", "builds_alongside", "host_cpus",
                     "workers", "worker_batch_size", "nodes"],
                    COUNT),
    # an error's figure may be +inf or NaN where the model gave no finite output: a true answer
    **dict.fromkeys(["gradient_error", "migration_max_logit_error", "fair_logit_error"], NOT_NEGATIVE),
    "status": STATUS,
}
TRACE = {"t_s": TIME, "cpu_percent": TIME, "gpu_util": TIME, "memory_bytes": COUNT,
         "gpu_memory_bytes": COUNT}
ROBUSTNESS = {"epsilon": FRACTION, "accuracy": FRACTION, "time_s": TIME, "steps": COUNT,
              "images": COUNT, "vanished_gradients": COUNT}
STEPS = {"step": COUNT}       # a loss may be NaN or inf: a diverging step, told as it is
OPS = {"spread_s": TIME, "flops": COUNT, "repeats": COUNT}   # time_s: a difference, maybe < 0
PLATFORMS = {**dict.fromkeys(["conversion_s", "latency_ms", "latency_iqr_ms", "throughput"], TIME),
             **dict.fromkeys(["accuracy", "adversarial_accuracy"], FRACTION),
             **dict.fromkeys(["images", "mismatches", "model_bytes", "throughput_batch",
                              "peak_memory_bytes", "adversarial_images"], COUNT),
             "max_logit_error": NOT_NEGATIVE}


def _broken(values: pa.Array, rule: str) -> pa.Array:
    """Where ``values`` (one column, nulls allowed) break ``rule``: true, else false or null."""
    if rule == STATUS:
        return pc.invert(pc.is_in(values, pa.array(STATUSES)))
    if rule == TIME:
        return pc.or_(pc.invert(pc.is_finite(values)), pc.less(values, 0))
    if rule == FRACTION:        # NaN is in no interval: not (0 <= x <= 1)
        return pc.invert(pc.and_(pc.greater_equal(values, 0), pc.less_equal(values, 1)))
    return pc.less(values, 0)


def problems(table: pa.Table, rules: dict[str, str]) -> dict[int, str]:
    """The rows of ``table`` that break a rule: row index -> the first reason, in words
    ("train_time_s is -inf: not a finite number of 0 or more")."""
    found: dict[int, str] = {}
    for name in table.column_names:
        column = table[name]
        rule = rules.get(name)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            broken = pc.greater(pc.binary_length(column), STRING_BYTES)
            rule = "string"
        elif rule is None:
            continue
        else:
            values, rows = column, None
            if pa.types.is_list(column.type):
                flat = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
                values, rows = pc.list_flatten(flat), pc.list_parent_indices(flat)
            broken = _broken(values, rule)
        where = np.flatnonzero(pc.fill_null(broken, False).to_numpy(zero_copy_only=False))
        if not len(where):
            continue
        if rule == "string":
            lengths = pc.binary_length(column)
            for row in where:
                found.setdefault(int(row), f"{name} is {lengths[int(row)].as_py():,} bytes long: "
                                            f"more than {STRING_BYTES:,}")
            continue
        flat_values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        for index in where:
            row = int(index) if rows is None else rows[int(index)].as_py()
            value = flat_values[int(index)].as_py()
            shown = repr(value) if isinstance(value, str) else f"{value!r}"
            found.setdefault(row, f"{name} {'holds' if rows is not None else 'is'} {shown[:40]}: "
                                  f"{WORDS[rule]}")
    return found
