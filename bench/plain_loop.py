"""Way (a) of bench/overhead.py: a framework's training loop with no dlbench runner around it.

Run inside a framework image (``python3 /bench/plain_loop.py``): it loads the
image's adapter -- the framework's own model and training loop -- and drives it
with the runner's job context, its progress and epoch reports made to do nothing:
no events, no per-epoch clocks, no result file, no runner.  It times ``train()``
alone (less ``ctx.train_excluded_s``, the loop's work that is not training) and
prints one JSON line: training time and images per second, counted as the runner
counts them.  Standard library only, like the runner.
"""

import argparse
import json
import os
import sys
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework-dir", default="/opt/dlbench/framework")
    parser.add_argument("--data", default="/data")
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    # Configuration only (thread variables, hyper-parameters, the adapter and the data
    # reader), read as the runner reads it; none of it runs while training is timed.
    sys.path.insert(0, os.path.dirname(args.framework_dir.rstrip("/")))
    from dlbench_runner import runner, spec as specs

    class BareContext(runner.Context):
        """The job as an adapter reads it; its reports are dropped (only counted)."""

        def __init__(self, spec, data_dir):
            super().__init__(spec, data_dir)
            self.trained = []          # samples of each finished epoch

        def epoch_start(self):
            pass

        def progress(self, epoch, fraction, loss, step=None):
            pass

        def epoch_done(self, epoch, loss, accuracy, samples=None):
            self.trained.append(samples)

    catalog = specs.load_catalog(args.framework_dir)
    spec = specs.complete({"framework": catalog["framework"], "dataset": args.dataset,
                           "profile": args.profile, "threads": args.threads, "device": "cpu",
                           "seed": args.seed}, catalog)
    runner.apply_threads(args.threads, spec["hyperparameters"])
    ctx = BareContext(spec, args.data)
    adapter = runner.load_adapter(args.framework_dir)(ctx)
    adapter.setup()
    start = time.perf_counter()
    adapter.train()
    # less the loop's work that is not training, as the runner counts it (train_time_s)
    train_time = time.perf_counter() - start - ctx.train_excluded_s
    trained = sum(s or ctx.train_samples for s in ctx.trained) or ctx.train_samples
    print(json.dumps({"train_time_s": train_time, "train_images_per_s": trained / train_time,
                      "epochs": len(ctx.trained)}))
    sys.stdout.flush()
    os._exit(0)     # as the runner does: some builds abort in their exit handlers


if __name__ == "__main__":
    main()
