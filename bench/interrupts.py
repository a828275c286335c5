#!/usr/bin/env python3
"""Interrupt `dlbench run` at random moments, many times, and check each stop was clean.

Each round starts `dlbench run` (a short campaign: --repeats jobs of one framework's
quick MNIST job, a campaign name of its own) on one shared results directory, waits a
random time drawn uniformly from [0, --max-delay] seconds, and sends SIGINT, SIGTERM or
SIGHUP (chosen at random; SIGINT to a process started with SIGINT ignored, as a shell
starts a background job, every other time).  A round whose process ended before the
signal went out is counted apart and not as an interruption.  An interruption is clean
when:

- the process exited within --grace seconds of the signal, with 128 + the signal's
  number (130, 143, 129) and the one-line message;
- no container of the round's campaign is left (running or stopped);
- every row file stored before the round is byte-identical afterwards, and the whole
  directory still loads, every row ok.

Rounds go on until --count interruptions were sent.  Prints each round, then the tally:
how many were clean, the exit codes, and the time from signal to exit (median, max).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import Parser

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def row_files(results: Path) -> dict[str, str]:
    return {str(p.relative_to(results)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in results.rglob("*.parquet") if not p.name.startswith(".")}


def campaign_containers(client, name: str) -> list:
    return client.containers.list(all=True, filters={
        "label": ["org.dlbench.role=job", f"org.dlbench.campaign={name}"]})


def one_round(index: int, args, results: Path, rng: random.Random, client) -> dict:
    from dlbench_runner.contract import QUICK_PROFILE
    from orchestrator import store

    name = f"interrupts-{os.getpid()}-{index}"
    signum = rng.choice(SIGNALS)
    ignored = signum == signal.SIGINT and index % 2 == 1
    delay = rng.uniform(0.0, args.max_delay)
    before = row_files(results)
    command = [sys.executable, "-m", "orchestrator", "run", "--frameworks", args.framework,
               "--datasets", "mnist", "--profile", QUICK_PROFILE, "--repeats", str(args.repeats),
               "--name", name, "--results", str(results), "--data-dir", str(args.data_dir)]
    proc = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None)
    time.sleep(delay)
    if proc.poll() is not None:
        proc.communicate()
        return dict(round=index, delay=delay, signal=signum.name, sent=False)
    proc.send_signal(signum)
    sent = time.monotonic()
    try:
        _, stderr = proc.communicate(timeout=args.grace)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
        code = None
    stopped = time.monotonic() - sent
    early = code is not None and code < 0  # killed by the signal before dlbench's first line
    if early:
        code = 128 - code
    problems = []
    if code != 128 + signum:
        problems.append(f"exit code {code}, expected {128 + signum}")
    elif not early and "interrupted; the rows stored so far are kept" not in stderr:
        problems.append("no 'interrupted' line: " + " | ".join(stderr.strip().splitlines()[-2:]))
    left = campaign_containers(client, name)
    if left:
        problems.append(f"{len(left)} container(s) left")
        for container in left:
            container.remove(force=True)
    after = row_files(results)
    changed = [f for f, digest in before.items() if after.get(f) != digest]
    if changed:
        problems.append(f"row files changed or gone: {changed}")
    try:
        frame = store.load(results)
        if len(frame) and not (frame["status"] == "ok").all():
            problems.append("a stored row is not ok")
    except Exception as exc:  # noqa: BLE001 - reported, not raised: the tally goes on
        problems.append(f"the results no longer load: {exc}")
    return dict(round=index, delay=delay, signal=signum.name, ignored=ignored, sent=True,
                code=code, stopped_s=stopped, new_rows=len(after) - len(before), problems=problems)


def main(argv=None) -> int:
    parser = Parser(prog="interrupts.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="local copy of the data sets")
    parser.add_argument("--count", type=int, default=50, help="interruptions to send (default 50)")
    parser.add_argument("--framework", default="mxnet", help="the framework whose quick MNIST job runs")
    parser.add_argument("--repeats", type=int, default=2, help="jobs per round (default 2)")
    parser.add_argument("--max-delay", type=float, default=15.0,
                        help="longest wait before the signal, seconds (default 15)")
    parser.add_argument("--grace", type=float, default=10.0,
                        help="how long a stop may take before it counts as hung (default 10 s)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.count < 1 or args.repeats < 1 or args.max_delay <= 0 or args.grace <= 0:
        parser.error("--count, --repeats, --max-delay and --grace must be positive")
    if not (args.data_dir / "mnist").is_dir():
        parser.error(f"{args.data_dir}: no mnist folder in it")
    import docker

    client = docker.from_env()
    rng = random.Random(args.seed)
    print(f"# {dt.datetime.now().isoformat(timespec='seconds')}  {platform.node()}  "
          f"{os.cpu_count()} CPUs  python {platform.python_version()}")
    print("# " + " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]))
    rounds = []
    with tempfile.TemporaryDirectory(prefix="dlbench-interrupts-") as tmp:
        results = Path(tmp) / "results"
        index = 0
        while sum(r["sent"] for r in rounds) < args.count:
            index += 1
            r = one_round(index, args, results, rng, client)
            rounds.append(r)
            if not r["sent"]:
                print(f"round {index:3d}: finished before the signal ({r['delay']:.1f} s)")
                continue
            verdict = "clean" if not r["problems"] else "NOT CLEAN: " + "; ".join(r["problems"])
            print(f"round {index:3d}: {r['signal']:7s}{' (SIGINT ignored at start)' if r['ignored'] else ''} "
                  f"after {r['delay']:5.2f} s -> exit {r['code']} in {r['stopped_s']:.2f} s, "
                  f"{r['new_rows']} new row(s): {verdict}", flush=True)
    sent = [r for r in rounds if r["sent"]]
    clean = [r for r in sent if not r["problems"]]
    codes = {}
    for r in sent:
        codes[r["code"]] = codes.get(r["code"], 0) + 1
    stops = [r["stopped_s"] for r in sent]
    print(f"\n{len(clean)} of {len(sent)} interruptions clean "
          f"({len(rounds) - len(sent)} round(s) finished before their signal); exit codes "
          + ", ".join(f"{c}: {n}" for c, n in sorted(codes.items(), key=lambda kv: str(kv[0])))
          + f"; signal to exit: median {statistics.median(stops):.2f} s, max {max(stops):.2f} s")
    return 0 if len(clean) == len(sent) else 1


if __name__ == "__main__":
    sys.exit(main())
