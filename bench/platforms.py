"""Every stored ONNX model of a results folder through the deploy image's platforms, on its
data set's whole test split: a table per model and platform, printed, and the rows written
as Parquet (``--out``).

    .venv/bin/python bench/platforms.py RESULTS [--out FILE] [--images N]

For each ok row with a stored model (``RESULTS/models/<run id>.onnx``): the framework's
own classes are taken as onnxruntime's on the host (the migration check's run), which is
right where the row's ``migration_mismatches`` is 0 (the table says so for each); its
first 64 outputs likewise.  The calibration images are 200 of the training split
(``checks.platforms.calibration``).  Printed per model and platform: status, accuracy and
its change against the framework's own, mismatches, the largest logit difference, the file
size, the conversion time, the latency at batch 1 (median, interquartile range), the
throughput and the runtime's peak memory; a failed platform's reason.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dlbench_runner.contract import formats  # noqa: E402
from orchestrator import store  # noqa: E402
from orchestrator.checks import platforms, untrusted  # noqa: E402
from orchestrator.runtimes.docker import docker_client  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "datasets")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--images", type=int, default=0, help="test images (0: all)")
    args = parser.parse_args(argv)
    rows = store.load(args.results)
    rows = rows[rows["status"] == "ok"]
    client, table = docker_client(), []
    for row in rows.itertuples():
        model_path = args.results / "models" / f"{row.run_id}.onnx"
        if not model_path.is_file():
            continue
        model = model_path.read_bytes()
        images, labels = formats.test_split(row.dataset, str(args.data))
        if args.images:
            images, labels = images[:args.images], labels[:args.images]
        (classes, logits), = untrusted.classify(model, [images], 64)
        own_accuracy = float(np.mean(classes == labels))
        calibration = platforms.calibration(row.dataset, args.data)
        batch = int(json.loads(row.hyperparameters or "{}").get("test_batch_size") or row.batch_size or 100)
        batch = min(batch, len(images))
        with tempfile.TemporaryDirectory(prefix="dlbench-bench-") as tmp:
            folder = platforms.request(Path(tmp) / "in", model, images, labels, classes, logits,
                                       calibration, batch=batch)
            started = time.perf_counter()
            found = platforms.deploy(client, folder)
            seconds = time.perf_counter() - started
        print(f"{row.framework} {row.dataset} {row.run_id}: {len(images)} test images")
        print(f"  own accuracy {own_accuracy:.4f}, migration mismatches "
              f"{row.migration_mismatches}, {seconds:.0f} s for the platforms")
        for one in found:
            record = {"run_id": row.run_id, "framework": row.framework, "dataset": row.dataset,
                      "own_accuracy": own_accuracy, "images": len(images), **one.model_dump()}
            table.append(record)
            if one.status != "ok":
                print(f"  {one.platform:<12} failed:\n    " + "\n    ".join(textwrap.wrap(one.reason, 74)))
                continue
            print(f"  {one.platform:<12} acc {one.accuracy:.4f} ({one.accuracy - own_accuracy:+.4f})"
                  f"  mism {one.mismatches:>4}  logit {one.max_logit_error:.1e}"
                  f"  {one.model_bytes / 1e6:6.2f} MB")
            print(f"  {'':<12} conv {one.conversion_s:5.1f} s  {one.latency_ms:6.3f} ms"
                  f" (iqr {one.latency_iqr_ms:.3f})  {one.throughput:8.0f}/s @{one.throughput_batch}"
                  f"  {one.peak_memory_bytes / 2**20:5.0f} MiB")
    if args.out:
        import pandas as pd
        pd.DataFrame(table).to_parquet(args.out, index=False)
        print(f"wrote {len(table)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
