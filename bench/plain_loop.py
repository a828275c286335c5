"""Way (a) of bench/overhead.py: a framework's training loop with no dlbench runner around it.

Run inside a framework image (``python3 /bench/plain_loop.py``): it loads the
image's adapter -- the framework's own model and training loop -- and drives it
with a bare context whose progress and epoch reports do nothing: no events, no
per-epoch clocks, no result file, no runner.  It times ``train()`` alone and
prints one JSON line: training time and images per second, counted as the
runner counts them.  Standard library only, like the runner.
"""

import argparse
import importlib.util
import json
import os
import sys
import time


class BareContext:
    """What an adapter reads of its job; its reports are dropped (only counted)."""

    def __init__(self, spec, data_dir, load):
        self.spec, self.hp = spec, spec["hyperparameters"]
        self.dataset, self.device = spec["dataset"], spec["device"]
        self.seed, self.threads = spec["seed"], spec["threads"]
        self.data_dir, self.planned_epochs = data_dir, self.hp.get("epochs")
        self.train_samples = self.test_samples = 0
        self.trained = []          # samples of each finished epoch
        self._load = load

    def load_data(self):
        arrays = self._load(self.dataset, self.data_dir)
        self.train_samples = len(arrays["train_labels"])
        self.test_samples = len(arrays["test_labels"])
        return arrays

    def epoch_start(self):
        pass

    def progress(self, epoch, fraction, loss):
        pass

    def epoch_done(self, epoch, loss, accuracy, samples=None):
        self.trained.append(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework-dir", default="/opt/dlbench/framework")
    parser.add_argument("--data", default="/data")
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, str(args.threads))
    # Configuration only (the model's hyper-parameters and the data reader), as the
    # runner would read it; none of it runs while training is timed.
    sys.path.insert(0, os.path.dirname(args.framework_dir.rstrip("/")))
    from dlbench_runner import data, spec as specs

    catalog = specs.load_catalog(args.framework_dir)
    spec = specs.complete({"framework": catalog["framework"], "dataset": args.dataset,
                           "profile": args.profile, "threads": args.threads, "device": "cpu",
                           "seed": args.seed}, catalog)
    module_spec = importlib.util.spec_from_file_location(
        "plain_adapter", os.path.join(args.framework_dir, "adapter.py"))
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    ctx = BareContext(spec, args.data, data.load)
    adapter = module.Adapter(ctx)
    adapter.setup()
    start = time.perf_counter()
    adapter.train()
    train_time = time.perf_counter() - start
    trained = sum(s or ctx.train_samples for s in ctx.trained) or ctx.train_samples
    print(json.dumps({"train_time_s": train_time, "train_images_per_s": trained / train_time,
                      "epochs": len(ctx.trained)}))
    sys.stdout.flush()
    os._exit(0)     # as the runner does: some builds abort in their exit handlers


if __name__ == "__main__":
    main()
