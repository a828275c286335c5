"""Rows on disk: atomic Parquet files, schema versions, and untrusted runner output."""

from __future__ import annotations

import datetime as dt
import json
import os

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator import plan, store
from orchestrator.collect import Outcome, collect
from orchestrator.errors import StoreError
from orchestrator.schema import ARROW_SCHEMA, SCHEMA_VERSION

JOB, = plan.make_plan(["torch"], ["mnist"], "quick", host_cpus=2).jobs


def good_result(**changes):
    result = {"schema_version": 1, "status": "ok", "error": None, "framework": "torch",
              "dataset": "mnist", "model": "torch7-mnist-convnet", "profile": "quick",
              "hyperparameters": JOB.hyperparameters, "device": "cpu", "seed": 1,
              "setup_time_s": 1.5, "train_time_s": 60.0, "test_time_s": 4.0, "total_time_s": 66.0,
              "accuracy": 0.98, "param_count": 169506, "blas": ["/usr/lib/libopenblas.so.0"],
              "threads": {"env": {"OMP_NUM_THREADS": "2"}, "framework": {"n": 2}},
              "epochs": [{"epoch": 1, "loss": 0.12, "accuracy": 0.96, "time_s": 60.0}],
              "started_at": "2026-01-01T00:00:00+00:00", "surprise": "ignored"}
    result.update(changes)
    return result


def record_for(tmp_path, result=None, raw=None, **outcome):
    job_dir = tmp_path / "job"
    job_dir.mkdir(exist_ok=True)
    if result is not None:
        (job_dir / "result.json").write_text(json.dumps(result))
    if raw is not None:
        (job_dir / "result.json").write_bytes(raw)
    outcome = Outcome(**{"exit_code": 0, "wall_time_s": 70.0, "log_tail": ["last line"], **outcome})
    return collect(JOB, "run1", "job1", job_dir, outcome, {"image": "dlbench/torch:cpu"})


def test_a_good_result_becomes_an_ok_row(tmp_path):
    record = record_for(tmp_path, good_result())
    assert record.status == "ok" and record.accuracy == 0.98 and record.epoch_loss == [0.12]
    assert record.blas == "/usr/lib/libopenblas.so.0" and record.wall_time_s == 70.0
    assert json.loads(record.hyperparameters)["batch_size"] == 10


@pytest.mark.parametrize("kwargs, status, message", [
    (dict(), "no_result", "wrote no result.json"),
    (dict(raw=b"\x00garbage{"), "no_result", "invalid"),
    (dict(result=good_result(accuracy=7.0)), "no_result", "invalid"),
    (dict(result=good_result(schema_version=99)), "no_result", "invalid"),
    (dict(result=["not", "an", "object"]), "no_result", "invalid"),
    (dict(raw=b" " * (5 << 20)), "no_result", "limit"),
    (dict(result=good_result(status="failed", error="boom during train"), exit_code=1), "failed", "boom"),
    (dict(exit_code=137), "failed", "exited with code 137"),
    (dict(exit_code=137, oom_killed=True), "oom", "out of memory"),
    (dict(result=good_result(), exit_code=139), "failed", "after a result"),
    (dict(exit_code=None, error="running torch/mnist/quick: Docker said: no such device"), "failed",
     "Docker said: no such device"),
])
def test_every_outcome_is_exactly_one_row_with_a_status(tmp_path, kwargs, status, message):
    record = record_for(tmp_path, **kwargs)
    assert record.status == status
    assert message in record.error


def test_rows_round_trip_and_pandas_reads_the_directory(tmp_path):
    first = record_for(tmp_path, good_result())
    second = record_for(tmp_path, exit_code=1).model_copy(update={"run_id": "run2"})
    store.append(tmp_path / "results", [first])
    store.append(tmp_path / "results", [second])
    (tmp_path / "results" / "_jobs" / "x").mkdir(parents=True)
    (tmp_path / "results" / "_jobs" / "x" / "result.json").write_text("{}")
    frame = store.load(tmp_path / "results")
    assert sorted(frame["status"]) == ["failed", "ok"]
    direct = pd.read_parquet(tmp_path / "results")
    assert len(direct) == 2 and list(direct.columns) == ARROW_SCHEMA.names
    files = list((tmp_path / "results").glob("runs-*.parquet"))
    meta = pq.read_schema(files[0]).metadata
    assert meta[b"dlbench.schema_version"] == str(SCHEMA_VERSION).encode()
    assert not list((tmp_path / "results").glob(".*tmp"))


def test_rows_from_a_newer_dlbench_are_refused(tmp_path):
    record = record_for(tmp_path, good_result()).model_copy(update={"schema_version": SCHEMA_VERSION + 1})
    store.append(tmp_path / "results", [record])
    with pytest.raises(StoreError, match="upgrade dlbench"):
        store.load(tmp_path / "results")


def test_an_empty_or_missing_results_directory(tmp_path):
    with pytest.raises(StoreError, match="no such results directory"):
        store.load(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    assert store.load(tmp_path / "empty").empty


def test_rows_of_schema_version_1_are_read_upgraded(tmp_path):
    """Golden files written by dlbench 0.1.0 (schema version 1), beside a current row."""
    import shutil

    from orchestrator.schema import ADDED_IN

    results = tmp_path / "results"
    shutil.copytree(os.path.join(os.path.dirname(__file__), "fixtures", "results-v1"), results)
    assert {pq.read_schema(f).metadata[b"dlbench.schema_version"] for f in results.iterdir()} == {b"1"}
    store.append(results, [record_for(tmp_path, good_result()).model_copy(update={"campaign": "new"})])
    frame = store.load(results)
    assert list(frame.columns) == ARROW_SCHEMA.names and (frame["schema_version"] == SCHEMA_VERSION).all()
    old = frame[frame["run_id"].str.startswith("v1")].set_index("run_id")
    assert old.loc["v1okrun000000001", "accuracy"] == 0.9812
    assert old.loc["v1badrun00000001", "exit_code"] == 137
    assert old[ADDED_IN[2] + ADDED_IN[3]].isna().all().all()   # what version 1 did not record
    assert list(frame.loc[frame["campaign"].notna(), "campaign"]) == ["new"]
    assert store.ok_job_ids(results) == {"v1job00000000001", "job1"}
    assert store.ok_job_ids(results, "new") == {"job1"}


def test_rows_of_schema_version_2_are_read_upgraded(tmp_path):
    """A golden file written with schema version 2: its campaign and resource summary kept,
    the cross-settings source (added in version 3) empty, as its own defaults were."""
    import shutil

    results = tmp_path / "results"
    shutil.copytree(os.path.join(os.path.dirname(__file__), "fixtures", "results-v2"), results)
    assert {pq.read_schema(f).metadata[b"dlbench.schema_version"] for f in results.iterdir()} == {b"2"}
    store.append(results, [record_for(tmp_path, good_result()).model_copy(update={"settings_from": "caffe"})])
    frame = store.load(results).set_index("run_id")
    assert (frame["schema_version"] == SCHEMA_VERSION).all()
    old = frame.loc["v2okrun000000001"]
    assert old["campaign"] == "v2-campaign" and old["accuracy"] == 0.9731
    assert old["memory_peak_bytes"] == 412_000_000 and old["trace_samples"] == 44
    assert pd.isna(old["settings_from"])
    assert list(frame["settings_from"].dropna()) == ["caffe"]


# -- compaction -----------------------------------------------------------------------------
def fill(results, tmp_path, names, samples=3):
    record = record_for(tmp_path, good_result())
    for name in names:
        store.append(results, [record.model_copy(update={"run_id": name})])
        store.write_trace(results, name, [{"t_s": float(t), "cpu_percent": 100.0 + t,
                                           "memory_bytes": 2**20 * (t + 1)} for t in range(samples)])


def test_compaction_merges_files_and_keeps_every_row_and_sample(tmp_path):
    import shutil

    results = tmp_path / "results"
    shutil.copytree(os.path.join(os.path.dirname(__file__), "fixtures", "results-v1"), results)
    fill(results, tmp_path, [f"run{i}" for i in range(6)])
    rows_before, written_before = store.read(results)
    traces_before = store.load_traces(results)
    assert store.compact(results) == (6, 6)
    files = sorted(p.name for p in results.glob("runs-*.parquet"))
    assert len(files) == 3 and sum("compacted" in f for f in files) == 1   # the v1 files stay as written
    assert len(list((results / store.TRACES).glob("*.parquet"))) == 1
    rows_after, written_after = store.read(results)
    key = ["run_id"]
    pd.testing.assert_frame_equal(rows_after.sort_values(key, ignore_index=True),
                                  rows_before.sort_values(key, ignore_index=True))
    assert written_after == written_before == {"v1okrun000000001": 1, "v1badrun00000001": 1}
    pd.testing.assert_frame_equal(store.load_traces(results), traces_before)
    assert len(store.load_traces(results, ["run2"])) == 3
    assert store.compact(results) == (0, 0)                 # nothing left to merge
    fill(results, tmp_path, ["run6"])
    assert store.compact(results) == (2, 2) and len(store.load(results)) == 9


def test_compaction_beside_a_writer_and_a_reader_loses_nothing(tmp_path):
    """A process appends rows and traces while this one compacts and reads, again and again."""
    import subprocess
    import sys

    results = tmp_path / "results"
    (tmp_path / "w").mkdir()
    code = ("import sys; from pathlib import Path; from test_store import fill;"
            "fill(Path(sys.argv[2]), Path(sys.argv[1]), [f'w{i:04d}' for i in range(300)])")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
    writer = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "w"), str(results)], env=env)
    compactions = 0
    while writer.poll() is None:
        if results.is_dir():
            compactions += sum(store.compact(results)) > 0
            frame = store.load(results)
            assert frame["run_id"].is_unique             # never a row twice, never a torn file
    assert writer.wait(timeout=300) == 0 and compactions > 0
    store.compact(results)
    frame = store.load(results)
    assert sorted(frame["run_id"]) == [f"w{i:04d}" for i in range(300)]
    traces = store.load_traces(results)
    assert len(traces) == 900 and traces.groupby("run_id").size().eq(3).all()


def test_dlbench_compact_on_the_command_line(tmp_path):
    from conftest import dlbench

    results = tmp_path / "results"
    fill(results, tmp_path, ["a", "b", "c"])
    proc = dlbench("compact", "--results", results, check=True)
    assert proc.stdout.strip() == f"{results}: merged 3 row files and 3 trace files"
    assert sorted(store.load(results)["run_id"]) == ["a", "b", "c"]
    proc = dlbench("compact", "--results", tmp_path / "missing")
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"dlbench: error: {tmp_path / 'missing'}: no such results directory"


def test_torch_rows_of_schema_version_3_are_read_as_pytorch(tmp_path):
    """Golden files written with schema version 3, when framework torch was the PyTorch port:
    its rows (ok, and failed without a version) read as pytorch; a Lua Torch7 row written
    now stays torch; the script's own times (added in version 4) are empty for old rows."""
    import shutil

    results = tmp_path / "results"
    shutil.copytree(os.path.join(os.path.dirname(__file__), "fixtures", "results-v3"), results)
    assert {pq.read_schema(f).metadata[b"dlbench.schema_version"] for f in results.iterdir()} == {b"3"}
    lua = record_for(tmp_path, good_result()).model_copy(update={
        "framework": "torch", "framework_version": "torch7@3e9e141ced1afd0cad451e69f90e6e53503647ca LuaJIT 2.1.0-beta1",
        "script_train_time_s": 30.5})
    store.append(results, [lua])
    frame = store.load(results).set_index("run_id")
    assert frame.loc["v3okrun000000001", "framework"] == "pytorch"
    assert frame.loc["v3okrun000000001", "accuracy"] == 0.9848
    assert frame.loc["v3badrun00000001", "framework"] == "pytorch"
    assert frame.loc[lua.run_id, "framework"] == "torch" and frame.loc[lua.run_id, "script_train_time_s"] == 30.5
    assert frame.loc[["v3okrun000000001", "v3badrun00000001"], ["script_train_time_s", "script_test_time_s"]].isna().all().all()
