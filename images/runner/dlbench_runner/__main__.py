"""Command line of the runner.

In a container dlbench mounts the data at /data and the job spec at /job.json
(both read-only, passed as ``--spec /job.json``) and the job's only writable
directory at /out; the result goes to /out/result.json.
Stand-alone use needs no spec file::

    python3 -m dlbench_runner --framework-dir images/torch --data DIR --out DIR \\
        --dataset mnist --profile quick --set epochs=2
"""

import argparse
import json
import os
import sys

from . import blas, contract, runner, spec as specs


def parse_value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(argv=None):
    parser = argparse.ArgumentParser(prog="dlbench_runner")
    parser.add_argument("--framework-dir", required=True)
    parser.add_argument("--data", default="/data")
    parser.add_argument("--out", default="/out")
    parser.add_argument("--spec", help="job spec JSON (default: OUT/job.json if present)")
    parser.add_argument("--dataset")
    parser.add_argument("--profile", default=contract.PAPER_PROFILE)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    catalog = specs.load_catalog(args.framework_dir)
    spec_path = args.spec or os.path.join(args.out, "job.json")
    if args.spec or (os.path.exists(spec_path) and not args.dataset):
        with open(spec_path) as f:
            spec = json.load(f)
    else:
        overrides = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                parser.error("--set takes KEY=VALUE, not %r" % item)
            overrides[key] = parse_value(value)
        spec = {"framework": catalog["framework"], "dataset": args.dataset,
                "profile": args.profile, "threads": args.threads, "device": args.device,
                "seed": args.seed, "overrides": overrides}
    if spec.get("fair_weights"):    # a file beside the spec (the host's /weights.npz)
        spec["fair_weights"] = os.path.join(os.path.dirname(os.path.abspath(spec_path)),
                                            spec["fair_weights"])
    try:
        spec = specs.complete(spec, catalog)
    except specs.SpecError as exc:
        runner.emit("done", status="failed", error=str(exc))
        sys.stderr.write("dlbench_runner: %s\n" % exc)
        return 2
    if spec["blas"] and argv is None and not blas.switched(spec["blas"]):
        # The dynamic loader reads LD_LIBRARY_PATH when a process starts: start again.
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", "dlbench_runner"] + sys.argv[1:],
                  dict(os.environ, **blas.environment(spec["blas"])))
    result = runner.run(spec, args.framework_dir, args.data, args.out)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave at once: some framework builds (Debian's torch 1.7) abort in their
    # exit handlers after training, which would turn a good run into a crash.
    os._exit(code)
