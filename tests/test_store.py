"""Rows on disk: atomic Parquet files, schema versions, and untrusted runner output."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import make_plan
from dlbench_runner import contract
from orchestrator import store
from orchestrator.collect import Outcome, collect
from orchestrator.errors import StoreError, StoreWarning
from orchestrator.schema import ARROW_SCHEMA, SCHEMA_VERSION

FIXTURES = Path(__file__).parent / "fixtures"
JOB, = make_plan(["torch"], ["mnist"], "quick", host_cpus=2).jobs


def good_result(**changes):
    result = {"schema_version": 1, "status": "ok", "error": None, "framework": "torch",
              "dataset": "mnist", "model": "torch7-mnist-convnet", "profile": "quick",
              "hyperparameters": JOB.hyperparameters, "device": "cpu", "seed": 1,
              "setup_time_s": 1.5, "train_time_s": 60.0, "test_time_s": 4.0, "total_time_s": 66.0,
              "accuracy": 0.98, "param_count": 169506,
              "blas": ["/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.13.so",
                       "/usr/lib/x86_64-linux-gnu/lapack/liblapack.so.3.9.0"],
              "threads": {"env": {"OMP_NUM_THREADS": "2"}, "framework": {"n": 2}},
              "epochs": [{"epoch": 1, "loss": 0.12, "accuracy": 0.96, "time_s": 60.0}],
              "started_at": "2026-01-01T00:00:00+00:00", "surprise": "ignored"}
    result.update(changes)
    return result


def record_for(tmp_path, result=None, raw=None, **outcome):
    job_dir = tmp_path / "job"
    (job_dir / "out").mkdir(parents=True, exist_ok=True)       # what the job may write
    if result is not None:
        (job_dir / "out" / "result.json").write_text(json.dumps(result))
    if raw is not None:
        (job_dir / "out" / "result.json").write_bytes(raw)
    outcome = Outcome(**{"exit_code": 0, "wall_time_s": 70.0, "log_tail": ["last line"], **outcome})
    return collect(JOB, "run1", "job1", job_dir, outcome, {"image": "dlbench/torch:cpu"})[0]


def test_a_good_result_becomes_an_ok_row(tmp_path):
    record = record_for(tmp_path, good_result())
    assert record.status == "ok" and record.accuracy == 0.98 and record.epoch_loss == [0.12]
    assert record.blas_loaded == "openblas-pthread" and record.blas is None and record.wall_time_s == 70.0
    assert json.loads(record.hyperparameters)["batch_size"] == 10


def test_the_model_size_reaches_the_row_and_an_older_runner_leaves_it_empty(tmp_path):
    record = record_for(tmp_path, good_result(schema_version=2, param_bytes=678024,
                                              model_size_bytes=680_000))
    assert (record.param_bytes, record.model_size_bytes) == (678024, 680_000)
    older = record_for(tmp_path / "older", good_result())
    assert older.status == "ok" and older.param_bytes is older.model_size_bytes is None
    bad = record_for(tmp_path / "bad", good_result(schema_version=2, model_size_bytes=-1))
    assert bad.status == "no_result" and "model_size_bytes" in bad.error


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
    second = record_for(tmp_path, exit_code=137).model_copy(update={"run_id": "run2"})
    store.append(tmp_path / "results", [first])
    store.append(tmp_path / "results", [second])
    (tmp_path / "results" / "_jobs" / "x").mkdir(parents=True)
    (tmp_path / "results" / "_jobs" / "x" / "result.json").write_text("{}")
    frame = store.load(tmp_path / "results")
    assert sorted(frame["status"]) == ["failed", "ok"]
    assert frame["exit_code"].dtype == "Int64" and list(frame["exit_code"].astype(object)) == [0, 137]
    direct = pd.read_parquet(tmp_path / "results" / store.RUNS)
    assert len(direct) == 2 and list(direct.columns) == ARROW_SCHEMA.names
    assert direct["exit_code"].dtype == "Int64"             # 137, not 137.0, with no options
    files = store.row_files(tmp_path / "results")
    assert [f.parent.name for f in files] == [store.RUNS] * 2
    meta = pq.read_schema(files[0]).metadata
    assert meta[b"dlbench.schema_version"] == str(SCHEMA_VERSION).encode()
    assert not list((tmp_path / "results" / store.RUNS).glob(".*tmp"))


def test_rows_from_a_newer_dlbench_are_refused(tmp_path):
    from conftest import dlbench

    results = tmp_path / "results"
    record = record_for(tmp_path, good_result()).model_copy(update={"schema_version": SCHEMA_VERSION + 1})
    store.append(results, [record])
    with pytest.raises(StoreError, match="upgrade dlbench"):
        store.load(results)
    older = copy_fixture("results-v1", tmp_path / "older")
    table = pq.read_table(next(older.glob("runs-*.parquet")))
    table = table.set_column(0, "schema_version", pa.array([SCHEMA_VERSION + 1], pa.int64()))
    pq.write_table(table.replace_schema_metadata({b"dlbench.schema_version": b"5"}),
                   results / store.RUNS / "20200101T000000000000-newer.parquet")
    for command in ("results", "report", "compact", "upgrade"):
        before = files_of(results)
        proc = dlbench(command, "--results", results)
        assert proc.returncode == 1 and proc.stdout == ""
        assert proc.stderr.splitlines() == [f"dlbench: error: {results}/runs: rows of schema version "
                                            f"{SCHEMA_VERSION + 1}; this dlbench reads up to "
                                            f"{SCHEMA_VERSION}: upgrade dlbench"], command
        assert files_of(results) == before                  # refused with nothing changed


def test_an_empty_or_missing_results_directory(tmp_path):
    with pytest.raises(StoreError, match="no such results directory"):
        store.load(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    assert store.load(tmp_path / "empty").empty


def copy_fixture(name: str, results):
    shutil.copytree(FIXTURES / name, results)
    return results


def files_of(results) -> dict[str, bytes]:
    return {str(p.relative_to(results)): p.read_bytes() for p in results.rglob("*") if p.is_file()}


def test_rows_of_schema_version_1_are_read_upgraded(tmp_path):
    """Golden files written by dlbench 0.1.0 (schema version 1), read as they are, then
    beside a current row (whose write rewrites the directory)."""
    from orchestrator.schema import ADDED_IN

    results = copy_fixture("results-v1", tmp_path / "results")
    assert {pq.read_schema(f).metadata[b"dlbench.schema_version"] for f in results.iterdir()} == {b"1"}
    before = files_of(results)
    read = store.load(results)
    assert files_of(results) == before                      # reading changes nothing
    store.append(results, [record_for(tmp_path, good_result()).model_copy(update={"campaign": "new"})])
    frame = store.load(results)
    pd.testing.assert_frame_equal(frame[frame["run_id"].str.startswith("v1")], read)
    assert list(frame.columns) == ARROW_SCHEMA.names and (frame["schema_version"] == SCHEMA_VERSION).all()
    old = frame[frame["run_id"].str.startswith("v1")].set_index("run_id")
    assert list(old["written_schema_version"]) == [1, 1]
    assert old.loc["v1okrun000000001", "accuracy"] == 0.9812
    assert old.loc["v1badrun00000001", "exit_code"] == 137
    assert old[ADDED_IN[2] + ADDED_IN[3]].isna().all().all()   # what version 1 did not record
    assert list(frame.loc[frame["campaign"].notna(), "campaign"]) == ["new"]
    assert store.ok_job_ids(results) == {"v1job00000000001", "job1"}
    assert store.ok_job_ids(results, "new") == {"job1"}


def test_a_row_stores_the_overrides_its_job_was_asked_for(tmp_path):
    job, = make_plan(["torch"], ["mnist"], "quick", overrides={"batch_size": 32}, host_cpus=2).jobs
    (tmp_path / "job" / "out").mkdir(parents=True)
    (tmp_path / "job" / "out" / "result.json").write_text(json.dumps(good_result()))
    record = collect(job, "run1", "job1", tmp_path / "job", Outcome(exit_code=0, wall_time_s=1.0,
                                                                    log_tail=[]), {})[0]
    assert record.overrides == '{"batch_size":32}'


def test_rows_of_schema_version_2_are_read_upgraded(tmp_path):
    """A golden file written with schema version 2: its campaign and resource summary kept,
    the cross-settings source (added in version 3) empty, as its own defaults were."""
    results = copy_fixture("results-v2", tmp_path / "results")
    assert {pq.read_schema(f).metadata[b"dlbench.schema_version"] for f in results.iterdir()} == {b"2"}
    store.append(results, [record_for(tmp_path, good_result()).model_copy(update={"settings_from": "caffe"})])
    frame = store.load(results).set_index("run_id")
    assert (frame["schema_version"] == SCHEMA_VERSION).all()
    old = frame.loc["v2okrun000000001"]
    assert old["campaign"] == "v2-campaign" and old["accuracy"] == 0.9731
    assert old["memory_peak_bytes"] == 412_000_000 and old["trace_samples"] == 44
    assert pd.isna(old["settings_from"]) and old["written_schema_version"] == 2
    assert list(frame["settings_from"].dropna()) == ["caffe"]
    assert pd.isna(old["overrides"])          # version 15's: not known for an older row
    assert frame.loc[frame["job_id"] == "job1", "overrides"].tolist() == ["{}"]
    assert frame.loc["job1" == frame["job_id"], "written_schema_version"].tolist() == [SCHEMA_VERSION]


V3_ROWS = {   # what the version-3 golden directory holds, as this dlbench reads it
    "v3okrun000000001": dict(status="ok", campaign="v3-campaign", settings_from="caffe",
                             accuracy=0.9905, train_time_s=300.5, batch_size=64, exit_code=pd.NA,
                             memory_limit_bytes=3 << 30, memory_peak_bytes=512_000_000,
                             memory_peak_cgroup_bytes=530_000_000, trace_samples=3,
                             host_name="v3host", epoch_loss=[0.3, 0.1]),
    "v3badrun00000001": dict(status="oom", campaign="v3-campaign", settings_from=None,
                             accuracy=None, train_time_s=None, batch_size=10, exit_code=137,
                             memory_limit_bytes=3 << 30, memory_peak_bytes=pd.NA,
                             memory_peak_cgroup_bytes=pd.NA, trace_samples=0,
                             host_name="v3host", epoch_loss=[]),
}


def assert_v3_rows(frame):
    rows = frame.set_index("run_id")
    assert sorted(rows.index) == sorted(V3_ROWS)
    assert (rows["schema_version"] == SCHEMA_VERSION).all() and (rows["written_schema_version"] == 3).all()
    for run_id, values in V3_ROWS.items():
        for column, value in values.items():
            got = rows.loc[run_id, column]
            if isinstance(value, list):
                assert list(got) == value, column
            elif value is None or value is pd.NA:
                assert pd.isna(got), column
            else:
                assert got == value, column
                assert isinstance(got, float) == isinstance(value, float), column   # 137, not 137.0
    assert rows["exit_code"].dtype == "Int64" and rows["trace_samples"].dtype == "Int64"


def test_version_3_golden_directory_read_then_upgraded_in_place(tmp_path):
    """The golden directory of schema version 3 (old layout: rows at the top, traces in
    _traces/): read as it is, then `dlbench upgrade` rewrites it with nothing lost."""
    from conftest import dlbench

    results = copy_fixture("results-v3", tmp_path / "results")
    assert {pq.read_schema(f).metadata[b"dlbench.schema_version"]
            for f in results.glob("runs-*.parquet")} == {b"3"}
    rows, traces = store.load(results), store.load_traces(results)
    assert_v3_rows(rows)
    assert list(traces["cpu_percent"]) == [190.0, 191.0, 192.0]
    proc = dlbench("upgrade", "--results", results, check=True)
    assert proc.stdout.strip() == (f"{results}: upgraded 2 row files, 1 trace files, 0 robustness files, 0 step loss files, 0 op time files and 0 platform files to schema "
                                   f"version {SCHEMA_VERSION}") and proc.stderr == ""
    assert sorted(p.relative_to(results).as_posix() for p in results.rglob("*.parquet")) == [
        "runs/20261124T100000000000-v3okrun000000001.parquet",
        "runs/20261124T100100000000-v3badrun00000001.parquet",
        "traces/v3okrun000000001.parquet"]
    assert not (results / "_traces").exists()
    for path in store.row_files(results):
        assert pq.read_schema(path).metadata[b"dlbench.schema_version"] == str(SCHEMA_VERSION).encode()
    pd.testing.assert_frame_equal(store.load(results), rows)
    pd.testing.assert_frame_equal(store.load_traces(results), traces)
    assert_v3_rows(pd.read_parquet(results / store.RUNS))
    proc = dlbench("upgrade", "--results", results, check=True)     # nothing left to do
    assert proc.stdout.strip().endswith(f"upgraded 0 row files, 0 trace files, 0 robustness files, 0 step loss files, 0 op time files and 0 platform files to schema version {SCHEMA_VERSION}")


def test_the_first_write_rewrites_an_old_directory(tmp_path):
    results = copy_fixture("results-v3", tmp_path / "results")
    rows = store.load(results)
    store.write_trace(results, "run1", [{"t_s": 0.0, "cpu_percent": 50.0, "memory_bytes": 1}])
    assert not list(results.glob("runs-*.parquet")) and not (results / "_traces").exists()
    assert len(store.row_files(results)) == 2 and len(store.trace_files(results)) == 2
    store.append(results, [record_for(tmp_path, good_result())])
    frame = store.load(results)
    pd.testing.assert_frame_equal(frame[frame["run_id"] != "run1"].reset_index(drop=True), rows)
    assert len(pd.read_parquet(results / store.RUNS)) == 3
    assert sorted(pd.read_parquet(results / store.TRACES)["run_id"].unique()) == ["run1", "v3okrun000000001"]


def three_readers(runs) -> dict[str, pa.Table]:
    """RESULTS/runs as pandas, DuckDB and polars read it with no options, as Arrow tables."""
    import duckdb
    import polars as pl

    frames = {"pandas": pa.Table.from_pandas(pd.read_parquet(runs), preserve_index=False),
              "duckdb": pa.table(duckdb.sql(f"SELECT * FROM read_parquet('{runs}/*.parquet')")),
              "polars": pl.read_parquet(f"{runs}/*.parquet").to_arrow()}
    assert pl.scan_parquet(f"{runs}/*.parquet").collect().to_arrow().num_rows == frames["polars"].num_rows
    return frames


@pytest.mark.parametrize("how", ["upgrade", "compact"])
def test_a_mixed_version_directory_reads_alike_in_pandas_duckdb_and_polars(tmp_path, how):
    """Rows of versions 1 to 8 (golden files) beside current ones written by this
    dlbench; after `dlbench upgrade` (or compaction) the three readers agree, row for row."""
    from conftest import dlbench

    results = tmp_path / "results"
    for version in (1, 2, 3, 4, 5, 6, 7, 8):
        shutil.copytree(FIXTURES / f"results-v{version}", results, dirs_exist_ok=True)
    old = store.load(results)                               # read as they are, upgraded
    assert sorted(old["written_schema_version"]) == [1, 1, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8]
    fill(results, tmp_path, ["now1", "now2"])                # the first write rewrites
    fill(results, tmp_path, ["now3"])
    expected = store.load(results)
    pd.testing.assert_frame_equal(expected[expected["run_id"].isin(old["run_id"])]
                                  .reset_index(drop=True), old)
    dlbench(how, "--results", results, check=True)
    assert len(store.row_files(results)) == (1 if how == "compact" else 13)
    stored = store.load(results)
    pd.testing.assert_frame_equal(stored, expected)
    assert dict(zip(stored["run_id"], stored["written_schema_version"])) == {
        "v1okrun000000001": 1, "v1badrun00000001": 1, "v2okrun000000001": 2,
        "v3okrun000000001": 3, "v3badrun00000001": 3, "v4luarun00000001": 4, "v4caffrun0000001": 4,
        "v5gpurun00000001": 5, "v5cpurun00000001": 5, "v6gpurun00000001": 6, "v6cpurun00000001": 6,
        "v7ptrun000000001": 7, "v7cafrun00000001": 7, "v8ptrun000000001": 8, "v8cafrun00000001": 8,
        **{now: SCHEMA_VERSION for now in ("now1", "now2", "now3")}}
    tables = three_readers(results / store.RUNS)
    for reader, table in tables.items():
        assert table.column_names == ARROW_SCHEMA.names, reader
        for field in ARROW_SCHEMA:
            if pa.types.is_integer(field.type):
                assert pa.types.is_integer(table.schema.field(field.name).type), (reader, field.name)
    rows = {reader: sorted(table.cast(ARROW_SCHEMA).to_pylist(), key=lambda r: r["run_id"])
            for reader, table in tables.items()}
    assert rows["pandas"] == rows["duckdb"] == rows["polars"]
    assert len(rows["pandas"]) == 18
    by_run = {r["run_id"]: r for r in rows["pandas"]}
    assert by_run["v1badrun00000001"]["exit_code"] == 137 and by_run["v3badrun00000001"]["exit_code"] == 137
    assert by_run["v1okrun000000001"]["written_schema_version"] == 1
    assert by_run["v4luarun00000001"]["paper_train_time_s"] == 1702.1
    assert all(r["schema_version"] == SCHEMA_VERSION for r in rows["pandas"])
    assert by_run == {r["run_id"]: r for r in pa.Table.from_pandas(stored, preserve_index=False)
                      .cast(ARROW_SCHEMA).to_pylist()}


# -- compaction -----------------------------------------------------------------------------
def fill(results, tmp_path, names, samples=3):
    record = record_for(tmp_path, good_result())
    for name in names:
        store.append(results, [record.model_copy(update={"run_id": name})])
        store.write_trace(results, name, [{"t_s": float(t), "cpu_percent": 100.0 + t,
                                           "memory_bytes": 2**20 * (t + 1)} for t in range(samples)])


def test_compaction_merges_files_and_keeps_every_row_and_sample(tmp_path):
    results = copy_fixture("results-v1", tmp_path / "results")
    fill(results, tmp_path, [f"run{i}" for i in range(6)])
    rows_before = store.load(results)
    traces_before = store.load_traces(results)
    assert store.compact(results) == (8, 6, 0, 0, 0, 0)
    files = store.row_files(results)
    assert len(files) == 1 and "compacted" in files[0].name     # the v1 rows too, upgraded
    assert pq.read_schema(files[0]).metadata[b"dlbench.schema_version"] == str(SCHEMA_VERSION).encode()
    assert len(store.trace_files(results)) == 1
    rows_after = store.load(results)
    pd.testing.assert_frame_equal(rows_after, rows_before)
    assert dict(zip(rows_after["run_id"], rows_after["written_schema_version"])) == {
        "v1okrun000000001": 1, "v1badrun00000001": 1, **{f"run{i}": SCHEMA_VERSION for i in range(6)}}
    pd.testing.assert_frame_equal(store.load_traces(results), traces_before)
    assert len(store.load_traces(results, ["run2"])) == 3
    assert store.compact(results) == (0, 0, 0, 0, 0, 0)          # nothing left to merge
    fill(results, tmp_path, ["run6"])
    assert store.compact(results) == (2, 2, 0, 0, 0, 0) and len(store.load(results)) == 9


def test_compaction_of_an_old_directory_upgrades_its_rows(tmp_path):
    results = copy_fixture("results-v1", tmp_path / "results")
    shutil.copytree(FIXTURES / "results-v3", results, dirs_exist_ok=True)
    rows, traces = store.load(results), store.load_traces(results)
    assert store.compact(results) == (4, 0, 0, 0, 0, 0)          # one trace: moved, nothing to merge
    assert [p.relative_to(results).parts[0] for p in store.row_files(results)] == [store.RUNS]
    assert [p.relative_to(results).as_posix() for p in store.trace_files(results)] == [
        "traces/v3okrun000000001.parquet"]
    pd.testing.assert_frame_equal(store.load(results), rows)
    pd.testing.assert_frame_equal(store.load_traces(results), traces)


def broken_files(results) -> dict[str, Path]:
    """Row files no reader can use, beside good ones: cut short, garbage, damaged pages
    behind a good footer, another table, and dlbench's own metadata on columns of the
    wrong types."""
    good = store.row_files(results)[0]
    runs = results / store.RUNS
    broken = {kind: runs / f"20200101T00000000000{i}-{kind}.parquet"
              for i, kind in enumerate(["truncated", "garbage", "damaged", "foreign", "mistyped"])}
    data = good.read_bytes()
    broken["truncated"].write_bytes(data[: len(data) // 2])
    damaged, group = bytearray(data), pq.ParquetFile(good).metadata.row_group(0)
    for chunk in map(group.column, range(group.num_columns)):
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        damaged[start:start + chunk.total_compressed_size] = b"\xab" * chunk.total_compressed_size
    broken["damaged"].write_bytes(bytes(damaged))
    broken["garbage"].write_bytes(b"\x00garbage{" * 100)
    pq.write_table(pa.table({"x": [1, 2]}), broken["foreign"])
    table = pq.read_table(good)
    table = table.set_column(table.schema.get_field_index("accuracy"), "accuracy", pa.array(["high"]))
    pq.write_table(table.replace_schema_metadata(ARROW_SCHEMA.metadata), broken["mistyped"])
    return broken


def test_unreadable_row_files_are_skipped_with_a_warning_naming_each(tmp_path):
    from conftest import dlbench

    results = tmp_path / "results"
    fill(results, tmp_path, ["a", "b"])
    broken = broken_files(results)
    bad_trace = store.trace_path(results, "a")
    bad_trace.write_bytes(b"PAR1 not really")
    with pytest.warns(StoreWarning) as caught:
        frame = store.load(results)
    assert sorted(frame["run_id"]) == ["a", "b"]
    messages = sorted(str(w.message) for w in caught)
    assert [m.split(":")[0] for m in messages] == sorted(str(p) for p in broken.values())
    assert all(m.endswith("; skipped") for m in messages)
    assert "not a dlbench row file" in next(m for m in messages if "foreign" in m)
    assert "do not match" in next(m for m in messages if "mistyped" in m)
    with pytest.warns(StoreWarning) as caught:
        assert store.ok_job_ids(results) == {"job1"}        # --resume
    assert len(caught) == len(broken)
    with pytest.warns(StoreWarning, match=f"{bad_trace}: unreadable trace file"):
        assert list(store.load_traces(results)["run_id"].unique()) == ["b"]

    def warnings_of(proc) -> list[str]:
        lines = proc.stderr.splitlines()
        assert all(line.startswith("dlbench: warning: ") for line in lines), proc.stderr
        return sorted(line.removeprefix("dlbench: warning: ").split(":")[0] for line in lines)

    proc = dlbench("results", "--results", results, "--format", "json", check=True)
    assert warnings_of(proc) == sorted(str(p) for p in broken.values())
    assert sorted(row["run_id"] for row in json.loads(proc.stdout)) == ["a", "b"]
    proc = dlbench("report", "--results", results, "--format", "json", check=True)
    assert warnings_of(proc) == sorted(str(p) for p in broken.values())
    assert [group["runs"] for group in json.loads(proc.stdout)["groups"]] == [2]
    for command in ("upgrade", "compact"):                  # left in place, and said so
        proc = dlbench(command, "--results", results, check=True)
        assert warnings_of(proc) == sorted([str(bad_trace)] + [str(p) for p in broken.values()])
        assert all(line.endswith("; left in place") for line in proc.stderr.splitlines())
        assert all(path.is_file() for path in [bad_trace, *broken.values()])
    assert proc.stdout.strip() == f"{results}: merged 2 row files, 0 trace files, 0 robustness files, 0 step loss files, 0 op time files and 0 platform files"   # 1 readable
    with pytest.warns(StoreWarning):
        assert sorted(store.load(results)["run_id"]) == ["a", "b"]


def warnings_in(proc) -> list[str]:
    lines = proc.stderr.splitlines()
    assert all(line.startswith("dlbench: warning: ") for line in lines), proc.stderr
    return [line.removeprefix("dlbench: warning: ") for line in lines]


def test_a_fifo_among_the_row_and_trace_files_is_ignored_with_one_warning(tmp_path):
    """pyarrow opens a file with a plain open(): a FIFO with no writer held every reader for
    good, deaf to Ctrl-C and SIGTERM."""
    from conftest import dlbench

    results = tmp_path / "results"
    fill(results, tmp_path, ["a", "b"])
    fifos = [results / store.RUNS / "x.parquet", results / store.TRACES / "y.parquet"]
    for fifo in fifos:
        os.mkfifo(fifo)
    said = sorted(f"{fifo}: not a regular file (a FIFO); ignored" for fifo in fifos)
    for command in (["results", "--format", "json"], ["report", "--format", "json"], ["compact"],
                    ["upgrade"]):
        proc = dlbench(*command, "--results", results, timeout=120)
        assert proc.returncode == 0, proc.stderr
        expected = said if command[0] in ("compact", "upgrade") else said[:1]   # the others read rows
        assert sorted(warnings_in(proc)) == expected
    with pytest.warns(StoreWarning):
        assert sorted(store.load(results)["run_id"]) == ["a", "b"]
    assert all(fifo.exists() for fifo in fifos)


def test_links_among_the_row_files_are_read_only_to_a_regular_file_inside_the_results(tmp_path):
    """A dangling link looked like a file compacted away, read again and again: `results`,
    `report` and `--resume` failed for good ("the row files kept changing") and `compact`
    and `upgrade` with a traceback."""
    from conftest import dlbench

    results = tmp_path / "results"
    fill(results, tmp_path, ["a", "b"])
    elsewhere = tmp_path / "elsewhere"
    fill(elsewhere, tmp_path, ["outside"])
    fill(tmp_path / "spare", tmp_path, ["inside"])
    shutil.copytree(tmp_path / "spare" / store.RUNS, results / "kept")
    runs = results / store.RUNS
    links = {runs / "dangling.parquet": runs / "gone.parquet",
             runs / "outside.parquet": store.row_files(elsewhere)[0],
             runs / "zero.parquet": Path("/dev/zero"),
             runs / "inside.parquet": next((results / "kept").iterdir())}
    for link, target in links.items():
        link.symlink_to(target)
    said = sorted([f"{runs / 'dangling.parquet'}: a symbolic link that leads nowhere; ignored",
                   f"{runs / 'outside.parquet'}: a symbolic link out of the results directory; ignored",
                   f"{runs / 'zero.parquet'}: a symbolic link out of the results directory; ignored"])
    with pytest.warns(StoreWarning) as caught:
        assert store.ok_job_ids(results) == {"job1"}              # --resume
    assert sorted({str(w.message) for w in caught}) == said
    proc = dlbench("results", "--results", results, "--format", "json", timeout=120)
    assert proc.returncode == 0 and sorted(warnings_in(proc)) == said
    assert sorted(row["run_id"] for row in json.loads(proc.stdout)) == ["a", "b", "inside"]
    for command in ("report", "upgrade", "compact"):
        proc = dlbench(command, "--results", results, timeout=120)
        assert proc.returncode == 0 and sorted(warnings_in(proc)) == said, proc.stderr
    assert proc.stdout.strip() == f"{results}: merged 3 row files, 2 trace files, 0 robustness files, 0 step loss files, 0 op time files and 0 platform files"
    with pytest.warns(StoreWarning):
        assert sorted(store.load(results)["run_id"]) == ["a", "b", "inside"]
    assert all(link.is_symlink() for link in links if link.name != "inside.parquet")


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


# -- compaction killed at any moment ----------------------------------------------------------
CRASH_AT = """\
import os, sys
from pathlib import Path
import pyarrow.parquet as pq
from orchestrator import store

steps, crash_at = 0, int(sys.argv[2])


def step(do, after=False):
    def stepped(*args, **kwargs):
        global steps
        steps += 1
        if steps == crash_at and not after:
            os._exit(137)
        done = do(*args, **kwargs)
        if steps == crash_at:
            os._exit(137)
        return done
    return stepped


os.rename, os.replace, os.unlink = step(os.rename), step(os.replace), step(os.unlink)
pq.write_table = step(pq.write_table, after=True)   # a file written whole, then the crash
store.compact(Path(sys.argv[1]))
"""


def outside_view(results: Path) -> tuple[list[str], list[str]]:
    """The run ids of the rows and of the samples, as pandas reads the folders, each
    time it reads one."""
    return (sorted(pd.read_parquet(results / store.RUNS)["run_id"]),
            sorted(pd.read_parquet(results / store.TRACES)["run_id"]))


def leftovers(results: Path) -> list[str]:
    return sorted(p.name for folder in (results, results / store.RUNS, results / store.TRACES)
                  for p in folder.glob(".*") if p.name not in (".compact.lock", ".schema_version"))


def test_compaction_killed_at_each_step_loses_nothing_and_the_next_start_finishes_it(tmp_path):
    """A child compacts and dies (os._exit) at its n-th rename, replacement, removal or
    Parquet write, for every n; pandas then reads every row at least once, and exactly once
    after the next dlbench command started, which leaves no temporary file behind."""
    import subprocess
    import sys

    template = tmp_path / "template"
    names = [f"run{i}" for i in range(5)]
    fill(template, tmp_path, names)
    exactly = (sorted(names), sorted(names * 3))
    seen_twice = 0
    for crash_at in range(1, 100):
        results = tmp_path / f"crash{crash_at}"
        shutil.copytree(template, results)
        child = subprocess.run([sys.executable, "-c", CRASH_AT, str(results), str(crash_at)],
                               capture_output=True, text=True, timeout=120)
        rows, samples = outside_view(results)
        assert set(rows) == set(names) and set(samples) == set(names), crash_at    # nothing lost
        if (rows, samples) != exactly:
            # only in the window between the rename and the last removal: the journal
            # is there for the next start to finish it
            assert (results / store.JOURNAL).is_file(), crash_at
            seen_twice += 1
        assert sorted(store.load(results)["run_id"]) == sorted(names)             # a reader
        assert sorted(store.load_traces(results)["run_id"]) == sorted(names * 3)
        assert outside_view(results) == exactly, crash_at
        store.check_results(results)                                               # a run starts
        assert leftovers(results) == [], crash_at
        assert outside_view(results) == exactly
        store.compact(results)
        assert outside_view(results) == exactly
        if child.returncode == 0:
            break                   # every step was a crash point once
        assert child.returncode == 137, child.stderr
    assert crash_at > 2 * len(names) and seen_twice > 0      # each removal was a crash point


def test_dlbench_compact_killed_at_random_moments(tmp_path):
    """SIGKILL to `dlbench compact` at random moments: pandas, DuckDB and polars read every
    row exactly once after the next dlbench command (here `dlbench results`)."""
    import random
    import signal
    import subprocess
    import sys
    import time

    import duckdb
    import polars as pl
    from conftest import dlbench

    template = tmp_path / "template"
    names = [f"run{i:03d}" for i in range(100)]
    fill(template, tmp_path, names, samples=2)
    started = time.monotonic()
    dlbench("compact", "--results", shutil.copytree(template, tmp_path / "timed"), check=True)
    whole = time.monotonic() - started
    chance = random.Random(33)
    for round_ in range(10):
        results = shutil.copytree(template, tmp_path / f"round{round_}")
        child = subprocess.Popen([sys.executable, "-m", "orchestrator", "compact", "--results",
                                  str(results)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(chance.uniform(0.4, 1.0) * whole)
        child.send_signal(signal.SIGKILL)
        child.wait()
        proc = dlbench("results", "--results", results, "--format", "json", check=True)
        assert sorted(row["run_id"] for row in json.loads(proc.stdout)) == names
        glob = str(results / store.RUNS / "*.parquet")
        assert sorted(pd.read_parquet(results / store.RUNS)["run_id"]) == names
        assert sorted(r[0] for r in duckdb.sql(f"SELECT run_id FROM read_parquet('{glob}')").fetchall()) == names
        assert sorted(pl.read_parquet(glob)["run_id"].to_list()) == names
        dlbench("compact", "--results", results, check=True)
        assert sorted(pd.read_parquet(results / store.RUNS)["run_id"]) == names
        assert len(pd.read_parquet(results / store.TRACES)) == 2 * len(names)
        assert leftovers(results) == []


def test_a_run_starting_sweeps_dead_writers_temporary_files_and_empty_rescue_rooms(tmp_path):
    import fcntl

    results = tmp_path / "results"
    fill(results, tmp_path, ["a"])
    dead = [results / store.RUNS / ".x-compacted-1.parquet.99999.tmp",
            results / store.TRACES / ".y.parquet.99999.tmp", results / ".compaction.json.99999.tmp",
            results / ".schema_version.99999.tmp"]
    for path in dead:
        path.write_bytes(b"PAR1 half")
    room = store.Rescue(results, "0123456789abcdef")        # a live run's, locked
    (results / store.RESCUED / "fedcba9876543210.json").write_bytes(b" " * store.RESCUE_RESERVE)
    kept = results / store.RESCUED / "aaaaaaaaaaaaaaaa.json"
    kept.write_text('{"row": {}}')                           # a row kept for `recover`
    store.check_results(results)
    assert [p for p in dead if p.exists()] == []
    assert sorted(p.name for p in (results / store.RESCUED).iterdir()) == [
        "0123456789abcdef.json", "aaaaaaaaaaaaaaaa.json"]
    with open(room.path, "rb") as f:
        with pytest.raises(BlockingIOError):
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)    # still its run's
    room.release()
    assert sorted(store.load(results)["run_id"]) == ["a"]


def test_dlbench_compact_on_the_command_line(tmp_path):
    from conftest import dlbench

    results = tmp_path / "results"
    fill(results, tmp_path, ["a", "b", "c"])
    proc = dlbench("compact", "--results", results, check=True)
    assert proc.stdout.strip() == f"{results}: merged 3 row files, 3 trace files, 0 robustness files, 0 step loss files, 0 op time files and 0 platform files"
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
    shutil.copytree(os.path.join(os.path.dirname(__file__), "fixtures", "results-v3-torch"), results)
    assert {pq.read_schema(f).metadata[b"dlbench.schema_version"] for f in results.iterdir()} == {b"3"}
    lua = record_for(tmp_path, good_result()).model_copy(update={
        "framework": "torch", "framework_version": "torch7@3e9e141ced1afd0cad451e69f90e6e53503647ca LuaJIT 2.1.0-beta1",
        "paper_train_time_s": 30.5})
    store.append(results, [lua])
    frame = store.load(results).set_index("run_id")
    assert frame.loc["v3okrun000000001", "framework"] == "pytorch"
    assert frame.loc["v3okrun000000001", "accuracy"] == 0.9848
    assert frame.loc["v3badrun00000001", "framework"] == "pytorch"
    assert frame.loc[lua.run_id, "framework"] == "torch" and frame.loc[lua.run_id, "paper_train_time_s"] == 30.5
    assert frame.loc[["v3okrun000000001", "v3badrun00000001"], ["paper_train_time_s", "paper_test_time_s"]].isna().all().all()


def test_rows_of_schema_version_4_keep_the_scripts_times_as_the_paper_spans(tmp_path):
    """Golden files written with schema version 4: the Lua Torch7 row's script times
    (``script_*_time_s``) are read as ``paper_*_time_s``; ``dlbench upgrade`` rewrites the
    directory in place with every row and value kept."""
    from conftest import dlbench

    results = copy_fixture("results-v4", tmp_path / "results")
    before = pq.read_table(next((results / store.RUNS).iterdir())).to_pylist()
    assert {r["schema_version"] for r in before} == {4}
    frame = store.load(results).set_index("run_id")
    assert "script_train_time_s" not in frame.columns
    assert frame.loc["v4luarun00000001", ["paper_train_time_s", "paper_test_time_s"]].tolist() == [1702.1, 112.5]
    assert frame.loc["v4caffrun0000001", ["paper_train_time_s", "paper_test_time_s"]].isna().all()
    proc = dlbench("upgrade", "--results", results)
    assert proc.returncode == 0, proc.stderr
    after = pq.read_table(next((results / store.RUNS).iterdir()))
    assert after.schema.metadata[b"dlbench.schema_version"] == str(SCHEMA_VERSION).encode()
    rows = {r["run_id"]: r for r in after.to_pylist()}
    assert set(rows) == {"v4luarun00000001", "v4caffrun0000001"}
    for old in before:
        new = rows[old["run_id"]]
        assert new["written_schema_version"] == 4
        assert new["paper_train_time_s"] == old["script_train_time_s"]
        assert new["paper_test_time_s"] == old["script_test_time_s"]
        for name, value in old.items():
            if name not in ("schema_version", "script_train_time_s", "script_test_time_s", "blas"):
                assert new[name] == value, name
        assert_kept(old, new, skip=("script_train_time_s", "script_test_time_s"))


def assert_kept(old: dict, new: dict, skip=()) -> None:
    """Every value of an old row is in its upgraded row: ``blas`` (the mapped files' paths
    before version 11) as ``blas_loaded``, by name; ``blas`` now the library asked for."""
    for name, value in old.items():
        if name not in ("schema_version", "blas") + tuple(skip):
            assert new[name] == value, name
    paths = old.get("blas")
    assert new["blas_loaded"] == (";".join(contract.blas.loaded(paths.split(";"))) or None if paths else None)
    assert new["blas"] is None and new["onednn"] is None


def test_rows_of_schema_version_5_get_empty_gpu_facts(tmp_path):
    """Golden files written with schema version 5 (a GPU row of the PyTorch image and a
    CPU row): read with the GPU's model, driver and memory empty, which version 5 did not
    record; ``dlbench upgrade`` rewrites them in place with every value kept."""
    from conftest import dlbench

    results = copy_fixture("results-v5", tmp_path / "results")
    before = pq.read_table(next((results / store.RUNS).iterdir())).to_pylist()
    assert {r["schema_version"] for r in before} == {5} and "gpu_name" not in before[0]
    frame = store.load(results).set_index("run_id")
    added = ["gpu_name", "gpu_driver", "gpu_memory_total_bytes"]
    assert frame[added].isna().all().all()
    assert frame.loc["v5gpurun00000001", ["device", "gpu", "device_name"]].tolist() == \
        ["cuda", "0", "NVIDIA H100 80GB HBM3"]
    assert str(frame["gpu_memory_total_bytes"].dtype) == "Int64"
    proc = dlbench("upgrade", "--results", results)
    assert proc.returncode == 0, proc.stderr
    rows = {r["run_id"]: r for r in pq.read_table(next((results / store.RUNS).iterdir())).to_pylist()}
    for old in before:
        new = rows[old["run_id"]]
        assert new["written_schema_version"] == 5 and new["schema_version"] == SCHEMA_VERSION
        assert all(new[name] is None for name in added)
        assert_kept(old, new)


def test_rows_of_schema_version_6_get_no_count_of_builds_beside_them(tmp_path):
    """Golden files written with schema version 6 (a GPU row with its GPU's facts and a CPU
    row): read with ``builds_alongside`` empty (version 6 ran every job after every build
    and did not count them) and not marked disturbed for it; ``dlbench upgrade`` rewrites
    them in place with every value kept."""
    from conftest import dlbench

    from orchestrator.report import noise

    results = copy_fixture("results-v6", tmp_path / "results")
    before = pq.read_table(next((results / store.RUNS).iterdir())).to_pylist()
    assert {r["schema_version"] for r in before} == {6} and "builds_alongside" not in before[0]
    frame = store.load(results)
    assert frame["builds_alongside"].isna().all() and str(frame["builds_alongside"].dtype) == "Int64"
    assert not any("image build" in why for why in noise.reasons(frame, ["framework"]))
    proc = dlbench("upgrade", "--results", results)
    assert proc.returncode == 0, proc.stderr
    rows = {r["run_id"]: r for r in pq.read_table(next((results / store.RUNS).iterdir())).to_pylist()}
    assert set(rows) == {"v6gpurun00000001", "v6cpurun00000001"}
    for old in before:
        new = rows[old["run_id"]]
        assert new["written_schema_version"] == 6 and new["schema_version"] == SCHEMA_VERSION
        assert new["builds_alongside"] is None
        assert_kept(old, new)


def test_rows_of_schema_version_7_get_no_model_size(tmp_path):
    """Golden files written with schema version 7 (quick rows of the PyTorch and Caffe
    images): read with ``param_bytes`` and ``model_size_bytes`` empty, which version 7 did
    not record; ``dlbench upgrade`` rewrites them in place with every value kept."""
    from conftest import dlbench

    results = copy_fixture("results-v7", tmp_path / "results")
    before = pq.read_table(next((results / store.RUNS).iterdir())).to_pylist()
    assert {r["schema_version"] for r in before} == {7} and "model_size_bytes" not in before[0]
    frame = store.load(results).set_index("run_id")
    added = ["param_bytes", "model_size_bytes"]
    assert frame[added].isna().all().all() and (frame["param_count"] > 0).all()
    assert str(frame["model_size_bytes"].dtype) == "Int64"
    proc = dlbench("upgrade", "--results", results)
    assert proc.returncode == 0, proc.stderr
    rows = {r["run_id"]: r for r in pq.read_table(next((results / store.RUNS).iterdir())).to_pylist()}
    assert set(rows) == {r["run_id"] for r in before}
    for old in before:
        new = rows[old["run_id"]]
        assert new["written_schema_version"] == 7 and new["schema_version"] == SCHEMA_VERSION
        assert all(new[name] is None for name in added)
        assert_kept(old, new)


def test_rows_of_schema_version_8_get_no_migration_check(tmp_path):
    """Golden files written with schema version 8 (quick rows of the PyTorch and Caffe
    images, with their model sizes): read with the migration check's columns empty, which
    version 8 did not record; ``dlbench upgrade`` rewrites them in place with every value
    kept."""
    from conftest import dlbench

    results = copy_fixture("results-v8", tmp_path / "results")
    before = pq.read_table(next((results / store.RUNS).iterdir())).to_pylist()
    assert {r["schema_version"] for r in before} == {8} and "migrated_accuracy" not in before[0]
    frame = store.load(results).set_index("run_id")
    added = ["migrated_accuracy", "migration_mismatches", "migration_max_logit_error", "migration_reason",
             "migration_model_bytes", "migration_time_s"]
    assert frame[added].isna().all().all() and (frame["model_size_bytes"] > 0).all()
    assert str(frame["migration_mismatches"].dtype) == "Int64"
    proc = dlbench("upgrade", "--results", results)
    assert proc.returncode == 0, proc.stderr
    rows = {r["run_id"]: r for r in pq.read_table(next((results / store.RUNS).iterdir())).to_pylist()}
    assert set(rows) == {r["run_id"] for r in before}
    for old in before:
        new = rows[old["run_id"]]
        assert new["written_schema_version"] == 8 and new["schema_version"] == SCHEMA_VERSION
        assert all(new[name] is None for name in added)
        assert_kept(old, new)
    assert not (results / store.MODELS).exists()


def test_rows_of_schema_version_12_keep_the_runs_load_and_get_no_noise_facts_of_their_own(tmp_path):
    """Golden files written with schema version 12 (two fair rows of one run, which share the
    run's load average): read with the job's load at its end, the highest, and other
    processes' CPU time empty, which version 12 did not record, ``host_load_avg`` kept (the
    run's start: the report's load rule still judges them); ``dlbench upgrade`` rewrites them
    in place with every value kept."""
    from conftest import dlbench

    from orchestrator.report import noise
    from orchestrator.schema import ADDED_IN

    results = copy_fixture("results-v12", tmp_path / "results")
    files = sorted((results / store.RUNS).iterdir())
    before = [row for f in files for row in pq.read_table(f).to_pylist()]
    assert {r["schema_version"] for r in before} == {12} and "other_cpu_share" not in before[0]
    frame = store.load(results).set_index("run_id")
    added = ADDED_IN[13]
    assert frame[added].isna().all().all() and (frame["host_load_avg"] == 1.44).all()
    assert noise.reasons(frame.assign(host_load_avg=3.0), ["framework"]).str.startswith("load 3.00 at start").all()
    proc = dlbench("upgrade", "--results", results)
    assert proc.returncode == 0, proc.stderr
    rows = {r["run_id"]: r for f in sorted((results / store.RUNS).iterdir()) for r in pq.read_table(f).to_pylist()}
    assert set(rows) == {r["run_id"] for r in before}
    for old in before:
        new = rows[old["run_id"]]
        assert new["written_schema_version"] == 12 and new["schema_version"] == SCHEMA_VERSION
        assert all(new[name] is None for name in added)
        assert {k: v for k, v in old.items() if k != "schema_version"}.items() <= new.items()


ROBUST = [{"attack": "none", "epsilon": 0.0, "steps": 0, "images": 1000, "accuracy": 0.97, "time_s": 0.5},
          {"attack": "fgsm", "epsilon": 0.1, "steps": 1, "images": 1000, "accuracy": 0.61, "time_s": 1.5},
          {"attack": "pgd", "epsilon": 0.1, "steps": 10, "images": 1000, "accuracy": 0.2, "time_s": 9.0}]


def test_robustness_rows_come_from_an_ok_result_and_are_stored_beside_the_row(tmp_path):
    """The runner's robustness entries become one row per attack and epsilon in
    RESULTS/robustness/<run id>.parquet, read back in the runner's order; a failed job's
    are dropped, a bad one makes the result invalid, like any field."""
    result = good_result(schema_version=3, robustness=ROBUST + [
        {"attack": "fgsm", "epsilon": 0.3, "steps": 1, "images": 1000, "accuracy": None,
         "time_s": None, "reason": "no gradient"}])
    job_dir = tmp_path / "job"
    (job_dir / "out").mkdir(parents=True)
    (job_dir / "out" / "result.json").write_text(json.dumps(result))
    collected = collect(JOB, "run1", "job1", job_dir, Outcome(exit_code=0, wall_time_s=1.0, log_tail=[]),
                        {"image": "x"})
    record, robustness = collected.record, collected.sides["robustness"]
    assert record.status == "ok" and [r["attack"] for r in robustness] == ["none", "fgsm", "pgd", "fgsm"]
    results = tmp_path / "results"
    results.mkdir()
    store.store_row(results, record, [], store.Rescue(results, "run1"), {"robustness": robustness})
    assert (results / "robustness" / "run1.parquet").is_file()
    frame = store.load_robustness(results)
    assert list(frame.columns) == store.ROBUSTNESS.schema.names
    assert frame["attack"].tolist() == ["none", "fgsm", "pgd", "fgsm"] and (frame["run_id"] == "run1").all()
    assert frame["accuracy"].tolist()[:3] == [0.97, 0.61, 0.2] and pd.isna(frame["accuracy"][3])
    assert frame["reason"].tolist()[3] == "no gradient" and str(frame["steps"].dtype) == "Int64"
    assert len(store.load_robustness(results, ["other"])) == 0
    failed = good_result(schema_version=3, status="failed", error="boom", robustness=ROBUST)
    (job_dir / "out").mkdir()
    (job_dir / "out" / "result.json").write_text(json.dumps(failed))
    assert collect(JOB, "run2", "job2", job_dir, Outcome(exit_code=1, wall_time_s=1.0, log_tail=[]),
                   {}).sides == {}
    for bad in ({"epsilon": 1.5}, {"attack": "cw"}, {"accuracy": 1.2}, {"images": -1}):
        assert record_for(tmp_path / str(bad), good_result(schema_version=3,
                                                           robustness=[ROBUST[1] | bad])).status == "no_result"


def test_robustness_files_are_compacted_rescued_and_recovered_with_the_rows(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    record = record_for(tmp_path, good_result())
    for name in ("a", "b", "c"):
        store.store_row(results, record.model_copy(update={"run_id": name}), [],
                        store.Rescue(results, name), {"robustness": [dict(row, images=len(name)) for row in ROBUST]})
    before = store.load_robustness(results)
    assert store.compact(results) == (3, 3, 3, 0, 0, 0)
    assert len(store.side_files(results, store.ROBUSTNESS)) == 1
    pd.testing.assert_frame_equal(store.load_robustness(results), before)
    # a results directory that cannot take the robustness rows keeps them to recover (faked:
    # one folder of a directory that takes the rest cannot be filled, and root writes anyway)
    real = store.write_side

    def full(results_, side, run_id, rows):
        if side is store.ROBUSTNESS:
            raise OSError(28, "No space left on device")
        return real(results_, side, run_id, rows)
    monkeypatch.setattr(store.rescue, "write_side", full)
    rescue = store.Rescue(results, "d")
    with pytest.raises(StoreError, match="its robustness: No space left on device"):
        store.store_row(results, record.model_copy(update={"run_id": "d"}), [], rescue, {"robustness": ROBUST})
    monkeypatch.setattr(store.rescue, "write_side", real)
    assert store.recover(results) == (1, [])
    assert store.load_robustness(results, ["d"])["attack"].tolist() == ["none", "fgsm", "pgd"]
    assert len(store.load(results)) == 4                     # the row, stored once


def test_a_robustness_file_of_a_newer_version_is_refused(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    path = store.write_side(results, store.ROBUSTNESS, "run1", ROBUST)
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({b"dlbench.robustness_schema_version": b"3"}), path)
    with pytest.raises(StoreError, match="robustness schema version 3; this dlbench reads up to 2"):
        store.load_robustness(results)


def test_robustness_rows_of_version_1_say_what_they_attacked_along_and_count_nothing(tmp_path):
    """Version 2 added attack_loss and vanished_gradients: a version 1 file (written with
    its own columns and version) reads with the old attacks' loss named on its attack
    rows (never on the clean row, nor on a row without an accuracy) and no count, and
    ``dlbench upgrade`` rewrites it so."""
    from conftest import dlbench

    from orchestrator.schema import OLD_ATTACK_LOSS
    results = tmp_path / "results"
    (results / "robustness").mkdir(parents=True)
    old = ROBUST + [{"attack": "fgsm", "epsilon": 0.3, "steps": 1, "images": 1000, "accuracy": None,
                     "time_s": None, "reason": "no gradient"}]
    schema = pa.schema([store.ROBUSTNESS.schema.field(name) for name in
                        ("run_id", "attack", "epsilon", "steps", "images", "accuracy", "time_s", "reason")],
                       metadata={b"dlbench.robustness_schema_version": b"1"})
    pq.write_table(pa.Table.from_pylist([dict(row, run_id="run1") for row in old], schema=schema),
                   results / "robustness" / "run1.parquet")
    frame = store.load_robustness(results)
    assert list(frame.columns) == store.ROBUSTNESS.schema.names
    assert frame["attack_loss"].fillna("").tolist() == ["", OLD_ATTACK_LOSS, OLD_ATTACK_LOSS, ""]
    assert frame["vanished_gradients"].isna().all()
    proc = dlbench("upgrade", "--results", results)
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(results / "robustness" / "run1.parquet")
    assert table.schema.metadata[b"dlbench.robustness_schema_version"] == b"2"
    assert table["attack_loss"].to_pylist() == [None, OLD_ATTACK_LOSS, OLD_ATTACK_LOSS, None]
