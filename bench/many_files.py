#!/usr/bin/env python3
"""How long, and in how much memory, dlbench reads a results directory of many one-row files.

A results directory is filled with N row files of one row each (default 10,000), as
``dlbench run`` leaves them when nothing compacts them (a campaign split over many runs
with ``--no-compact``, or an outside writer); the rows are the synthetic, realistic ones of
``store_scaling.py`` and each file is written as ``store.append`` writes it (without its
fsync, which only slows the filling).  Then ``store.load`` reads the directory, in a fresh
child process (multiprocessing "spawn") that reports its wall time and its peak resident
set size (``getrusage(RUSAGE_SELF).ru_maxrss``, the kernel's high-water mark), and the
peak after its imports alone, so the reading's own share shows.

Run it once with the code of a commit before a change and once after (each tree's own
``bench/many_files.py``, or this one with ``--repo``) to compare.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import multiprocessing
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import Parser, header, positive_int

HERE = Path(__file__).resolve().parent
TEMPLATES = 50                  # distinct synthetic rows, each written again under new ids


def fill(repo: str, folder: str, files: int, seed: int) -> None:
    """``files`` row files of one synthetic row each in ``folder``/runs/."""
    sys.path[:0] = [repo, str(HERE)]
    import pyarrow as pa
    import pyarrow.parquet as pq
    from store_scaling import make_job

    from orchestrator.schema import ARROW_SCHEMA

    rng, runs = random.Random(seed), Path(folder) / "runs"
    runs.mkdir(parents=True)
    shapes = [make_job(rng, index, 100)[0].model_dump() for index in range(TEMPLATES)]
    for index in range(files):        # making a row takes longer than writing it: vary a few
        row = dict(shapes[index % TEMPLATES], run_id=f"{rng.getrandbits(64):016x}",
                   job_id=f"{rng.getrandbits(64):016x}",
                   recorded_at=shapes[0]["recorded_at"] + dt.timedelta(seconds=index))
        table = pa.Table.from_pylist([row], schema=ARROW_SCHEMA)
        pq.write_table(table, runs / f"{index:08d}-{row['run_id']}.parquet")


def read(repo: str, folder: str) -> tuple[float, int, int, int, list[str]]:
    """Load the rows: (seconds, rows, peak RSS bytes, peak RSS after imports, warnings)."""
    sys.path.insert(0, repo)
    import warnings

    import pandas  # noqa: F401  (imported before the clock starts, as the readers import it)
    import pyarrow.dataset  # noqa: F401

    from orchestrator import store
    imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = len(store.load(Path(folder)))
    seconds = time.perf_counter() - start
    return (seconds, rows, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, imported,
            [str(w.message) for w in caught])


def in_child(function, *args):
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=positive_int, default=10_000,
                        help="one-row files to read (default 10000)")
    parser.add_argument("--repo", type=Path, default=HERE.parent,
                        help="the dlbench tree whose store reads them (default: this one)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to make the temporary results directory (default: $TMPDIR)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the synthetic rows (default 1)")
    args = parser.parse_args()
    for given, what in ((args.dir, "--dir"), (args.repo / "orchestrator", "--repo")):
        if given is not None and not given.is_dir():
            parser.error(f"{what} {given}: no such directory")
    sys.path.insert(0, str(HERE.parent))

    header()
    folder = Path(tempfile.mkdtemp(prefix="dlbench-many-files-", dir=args.dir))
    try:
        start = time.perf_counter()
        in_child(fill, str(args.repo.resolve()), str(folder), args.files, args.seed)
        size = sum(f.stat().st_size for f in (folder / "runs").iterdir())
        print(f"fill     {args.files:,} one-row files, {size / 2**20:.1f} MiB, "
              f"in {time.perf_counter() - start:.1f} s")
        seconds, rows, peak, imported, said = in_child(read, str(args.repo.resolve()), str(folder))
        print(f"load     {rows:,} rows in {seconds:.2f} s ({1000 * seconds / args.files:.2f} ms a file); "
              f"peak RSS {peak / 2**20:.0f} MiB, {(peak - imported) / 2**20:.0f} MiB above the "
              f"{imported / 2**20:.0f} MiB of the imports")
        for message in said:
            print(f"warning  {message}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
