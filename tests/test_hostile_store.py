"""Stored rows as hostile input: a results directory written by anyone (an older dlbench, an
outside tool, a hand) is read with every row checked, every file within bounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import dlbench
from orchestrator import store
from orchestrator.errors import StoreWarning
from orchestrator.schema import ARROW_SCHEMA, TRACE_SCHEMA
from test_store import good_result, record_for

UNTRUE = {"nan": {"train_time_s": float("nan")}, "inf": {"test_time_s": float("inf")},
          "minus-inf": {"train_time_s": float("-inf")}, "negative": {"total_time_s": -5.0},
          "150-percent": {"accuracy": 1.5}, "minus-20-percent": {"accuracy": -0.2},
          "epoch-over": {"epoch_accuracy": [0.5, 1.5]}, "count": {"train_samples": -1}}


def write_rows(results: Path, rows: dict[str, dict]) -> dict[str, Path]:
    """Each row written straight into runs/, one file each, as an outside writer would."""
    (results / "runs").mkdir(parents=True, exist_ok=True)
    paths = {}
    for run_id, row in rows.items():
        paths[run_id] = results / "runs" / f"20260101T000000-{run_id}.parquet"
        pq.write_table(pa.Table.from_pylist([row], schema=ARROW_SCHEMA), paths[run_id])
    return paths


def hostile_directory(tmp_path) -> tuple[Path, dict[str, Path]]:
    good = record_for(tmp_path, good_result()).model_dump()
    rows = {"good": dict(good, run_id="good", job_id="good")}
    for name, changes in UNTRUE.items():
        rows[name] = dict(good, run_id=name, job_id=name, **changes)
    results = tmp_path / "results"
    return results, write_rows(results, rows)


def test_rows_breaking_a_rule_are_left_out_of_every_view_with_the_reason(tmp_path):
    results, paths = hostile_directory(tmp_path)
    with pytest.warns(StoreWarning) as caught:
        frame = store.load(results)
    assert list(frame["run_id"]) == ["good"]
    said = {str(w.message).split(":")[0]: str(w.message) for w in caught}
    assert sorted(said) == sorted(str(paths[name]) for name in UNTRUE)
    for name, changes in UNTRUE.items():
        column, = changes
        message = said[str(paths[name])]
        assert f"run {name}: {column}" in message and message.endswith("; the row left out"), message
    assert "accuracy is 1.5: not in [0, 1]" in said[str(paths["150-percent"])]
    assert "train_time_s is -inf: not a finite number of 0 or more" in said[str(paths["minus-inf"])]

    proc = dlbench("results", "--results", results, "--format", "json", check=True)
    assert [row["run_id"] for row in json.loads(proc.stdout)] == ["good"]
    lines = proc.stderr.splitlines()
    assert len(lines) == len(UNTRUE) and all(line.startswith("dlbench: warning: ") for line in lines)
    assert all(f"run {name}:" in proc.stderr for name in UNTRUE)
    proc = dlbench("report", "--results", results, "--format", "json", check=True)
    groups = json.loads(proc.stdout)["groups"]
    assert [group["runs"] for group in groups] == [1]
    assert all(f"run {name}:" in proc.stderr for name in UNTRUE)
    proc = dlbench("report", "--results", results, check=True)     # the text a user reads
    assert "1/1 ok" in proc.stdout and "inf" not in proc.stdout and "150.00" not in proc.stdout


def test_compaction_leaves_a_file_with_a_row_breaking_a_rule_in_place(tmp_path):
    results, paths = hostile_directory(tmp_path)
    more = record_for(tmp_path, good_result()).model_dump()
    write_rows(results, {"good2": dict(more, run_id="good2", job_id="good2")})
    with pytest.warns(StoreWarning) as caught:
        counts = store.compact(results)
    assert counts[0] == 2                                  # the two good files only
    assert all(str(w.message).endswith("; left in place") for w in caught)
    assert all(path.is_file() for name, path in paths.items() if name != "good")
    with pytest.warns(StoreWarning):
        assert sorted(store.load(results)["run_id"]) == ["good", "good2"]


def test_side_table_rows_breaking_a_rule_are_left_out(tmp_path):
    results = tmp_path / "results"
    (results / "traces").mkdir(parents=True)
    samples = [{"run_id": "a", "t_s": 0.0, "cpu_percent": 50.0, "memory_bytes": 1},
               {"run_id": "a", "t_s": float("nan"), "cpu_percent": 50.0, "memory_bytes": 1},
               {"run_id": "a", "t_s": 2.0, "cpu_percent": -1.0, "memory_bytes": 1},
               {"run_id": "a", "t_s": 3.0, "cpu_percent": 50.0, "memory_bytes": -7}]
    path = results / "traces" / "a.parquet"
    pq.write_table(pa.Table.from_pylist(samples, schema=TRACE_SCHEMA), path)
    with pytest.warns(StoreWarning) as caught:
        frame = store.load_traces(results)
    assert list(frame["t_s"]) == [0.0]
    message, = [str(w.message) for w in caught]
    assert message.startswith(f"{path}: run a: t_s is nan") and "those 3 rows left out" in message


@pytest.mark.parametrize("changes, said", [
    ({"train_time_s": float("-inf")}, "train_time_s is -inf"),
    ({"test_time_s": float("nan")}, "test_time_s is nan"),
    ({"setup_time_s": -1.0}, "setup_time_s is -1.0"),
    ({"epochs": [{"epoch": 1, "loss": 0.1, "accuracy": 1.5, "time_s": 1.0}]}, "epoch_accuracy holds 1.5"),
    ({"robustness": [{"attack": "fgsm", "epsilon": 0.1, "steps": 1, "images": 10, "accuracy": 0.5,
                      "time_s": float("inf")}]}, "robustness: time_s is inf"),
])
def test_an_untrue_runner_result_is_never_stored_as_ok(tmp_path, changes, said):
    record = record_for(tmp_path, good_result(**changes))
    assert record.status == "no_result" and record.train_time_s is None
    assert record.error.startswith("result.json is invalid: ") and said in record.error


def test_a_loss_of_nan_is_a_true_answer_and_kept(tmp_path):
    """A diverging training's loss is NaN: a rule on it would hide the truth."""
    record = record_for(tmp_path, good_result(test_loss=float("nan")))
    assert record.status == "ok"


BOMB = textwrap.dedent("""
    import datetime as dt, sys
    import pyarrow as pa, pyarrow.parquet as pq
    from orchestrator.schema import ARROW_SCHEMA
    size, path, lie = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "lie"
    zeros = pa.py_buffer(bytearray(size))           # one buffer, written three times
    big = pa.StringArray.from_buffers(1, pa.array([0, size], pa.int32()).buffers()[1], zeros)
    values = dict(run_id="bomb", job_id="bomb", status="ok", framework="caffe", dataset="mnist",
                  model="m", profile="quick", hyperparameters="{}", device="cpu", seed=1,
                  dlbench_version="x", schema_version=12, written_schema_version=12,
                  recorded_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    columns = [big if f.name == "log_tail" else pa.array([values.get(f.name)], f.type)
               for f in ARROW_SCHEMA]
    table = pa.table(columns, schema=ARROW_SCHEMA)
    with pq.ParquetWriter(path, ARROW_SCHEMA, compression="zstd", use_dictionary=False,
                          write_statistics=False) as writer:
        for _ in range(3):
            writer.write_table(table)
    if lie:     # the footer's sizes rewritten small: the pages still hold what they hold
        import struct
        data = bytearray(open(path, "rb").read())
        length = struct.unpack("<I", data[-8:-4])[0]
        footer = bytes(data[-8 - length:-8])
        meta = pq.read_metadata(path)
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            for value in {group.total_byte_size, *(group.column(j).total_uncompressed_size
                                                   for j in range(group.num_columns))}:
                if value < 1 << 20:
                    continue
                def varint(n, width=None):
                    out = bytearray()
                    while True:
                        out.append(n & 0x7F)
                        n >>= 7
                        if not n and (width is None or len(out) == width):
                            break
                        out[-1] |= 0x80
                    return bytes(out)
                found = varint(2 * value)
                footer = footer.replace(found, varint(2 * 100, len(found)))
        data[-8 - length:-8] = footer
        open(path, "wb").write(data)
        assert pq.read_metadata(path).row_group(0).total_byte_size == 100
""")


def peak_mib(tmp_path, *args) -> tuple[subprocess.CompletedProcess, float]:
    """Run dlbench, as the user would; its output and its own peak resident set (wait4:
    this child's alone, its output in files so that nothing reaps it first)."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *map(str, args)],
                                stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return (subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text()),
            usage.ru_maxrss / 1024)


@pytest.mark.parametrize("lie", ["honest", "lie"])
def test_a_zstd_bomb_of_three_500_mb_strings_is_skipped_without_allocating_it(tmp_path, lie):
    results, paths = hostile_directory(tmp_path)
    # the same command on the same folder without the bomb: what dlbench itself takes
    alone = {command: peak_mib(tmp_path, command, "--results", results, "--format", "json")[1]
             for command in ("results", "report")}
    bomb = results / "runs" / "20260101T000001-bomb.parquet"
    subprocess.run([sys.executable, "-c", BOMB, str(500_000_000), str(bomb), lie], check=True,
                   cwd=Path(__file__).parent.parent)
    assert bomb.stat().st_size < 200_000
    for command in ("results", "report"):
        proc, peak = peak_mib(tmp_path, command, "--results", results, "--format", "json")
        assert proc.returncode == 0, proc.stderr
        assert f"{bomb}: row file " in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        # reading one file may add at most READ_MEMORY of address space, so of resident
        # memory too (the strings alone are 1430 MiB; read unbounded, the file took 12 GB)
        assert peak - alone[command] <= store.READ_MEMORY / 2**20, \
            f"dlbench {command} took {peak:.0f} MiB, {alone[command]:.0f} MiB without the file"
    said = [line for line in proc.stderr.splitlines() if str(bomb) in line]
    assert len(said) == 1
    if lie == "honest":
        assert "declaring 3 rows and 1,500,0" in said[0] and "past the bound of 128 MiB" in said[0]
    else:
        assert "needing more than 1,024 MiB of memory" in said[0]
    proc = dlbench("results", "--results", results, "--format", "json", check=True)
    assert [row["run_id"] for row in json.loads(proc.stdout)] == ["good"]


def test_a_few_hundred_one_row_files_are_read_and_compacting_is_suggested_past_the_count(tmp_path, monkeypatch):
    good = record_for(tmp_path, good_result()).model_dump()
    results = tmp_path / "results"
    write_rows(results, {f"run{i:04d}": dict(good, run_id=f"run{i:04d}", job_id=f"job{i}")
                         for i in range(store.BATCH_FILES + 44)})          # two batches
    frame = store.load(results)                     # no warning under the count
    assert sorted(frame["run_id"]) == [f"run{i:04d}" for i in range(store.BATCH_FILES + 44)]
    assert frame["train_time_s"].tolist() == [60.0] * len(frame)
    monkeypatch.setattr(store.read, "MANY_FILES", 100)
    with pytest.warns(StoreWarning, match=r"more than 100 files in one of its tables, each read on its "
                                          r"own: `dlbench compact --results .*` merges them"):
        assert len(store.load(results)) == store.BATCH_FILES + 44


def test_compaction_keeps_each_merged_file_within_half_the_readers_bound(tmp_path, monkeypatch):
    good = record_for(tmp_path, good_result()).model_dump()
    results = tmp_path / "results"
    paths = write_rows(results, {f"run{i}": dict(good, run_id=f"run{i}", job_id=f"job{i}") for i in range(6)})
    one = store.read._declared_size(pq.read_metadata(paths["run0"]))
    monkeypatch.setattr(store.read, "FILE_BYTES", 5 * one)      # two files a merged file, at most
    assert store.compact(results)[0] == 6
    merged = sorted((results / "runs").glob("*.parquet"))
    assert len(merged) == 3 and all("-compacted-" in path.name for path in merged)
    assert all(store.read._declared_size(pq.read_metadata(path)) <= store.read.FILE_BYTES // 2 for path in merged)
    assert sorted(store.load(results)["run_id"]) == [f"run{i}" for i in range(6)]
