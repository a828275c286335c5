#!/usr/bin/env python3
"""How long `dlbench build-images` takes when nothing changed (goal: under 10 s).

With every image built and up to date, build-images only hashes each image's inputs and
compares the hash with the image's label.  This script first checks, building nothing,
that the five CPU images exist and are up to date: it runs the project's own Builder
against a Docker client that refuses to build, pull or import (--wait polls while another
process builds them).  Then it runs the real command --repeats times and prints the
seconds of each run, the median, and what `dlbench --help` takes (start-up alone).
"""

from __future__ import annotations

import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

from _common import Parser, header

FRAMEWORKS = ("caffe", "tensorflow", "torch", "pytorch", "mxnet", "theano")
GOAL_S = 10.0


class WouldBuild(Exception):     # raised by the refusing client: build-images would build here
    pass


def find_dlbench(explicit: str | None) -> str:
    candidates = [explicit] if explicit else [shutil.which("dlbench"),
                                              str(Path(sys.executable).with_name("dlbench"))]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    sys.exit(f"build_cache.py: error: no dlbench executable at {explicit}" if explicit else
             "build_cache.py: error: dlbench not found on PATH nor next to this Python (use --dlbench)")


def check_images(frameworks: list[str]) -> tuple[str | None, str]:
    """(why build-images would build rather than only check, or None; Docker's version)."""
    from orchestrator.build import Builder, image_tag
    from orchestrator.errors import DlbenchError
    from orchestrator.runtimes.docker import docker_client

    said = []
    try:
        client = docker_client()
        missing = [image_tag(fw) for fw in frameworks if not client.images.list(name=image_tag(fw))]
        if missing:
            return f"missing {', '.join(missing)}: build them first with `dlbench build-images`", ""

        def refuse(*args, **kwargs):
            raise WouldBuild
        dry = types.SimpleNamespace(images=types.SimpleNamespace(get=client.images.get, pull=refuse),
                                    api=types.SimpleNamespace(build=refuse, import_image_from_stream=refuse))
        builder = Builder(dry, say=said.append)     # the CLI's defaults, so the same hashes
        builder.base()
        for fw in frameworks:
            builder.framework(fw)
        return None, client.version().get("Version", "?")
    except WouldBuild:          # Builder says "<tag>: building" before it builds, else it pulls
        tag = said[-1].rsplit(": ", 1)[0] if said and said[-1].endswith(": building") else "the root image"
        return (f"{tag} is out of date (an input changed since it was built): run `dlbench "
                "build-images` first; timing it now would time a build"), ""
    except DlbenchError as exc:
        sys.exit(f"build_cache.py: error: {exc}")


def timed(command: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    return time.perf_counter() - start, done


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs to time (default 3)")
    parser.add_argument("--dlbench", help="the dlbench executable (default: on PATH, else beside this Python)")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="comma-separated (default: all)")
    parser.add_argument("--wait", type=int, default=0, metavar="MINUTES",
                        help="poll each minute, this long at most, until the images are up to date")
    args = parser.parse_args()
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    if args.repeats < 1 or args.wait < 0:
        parser.error("--repeats is 1 or more, --wait 0 minutes or more")
    if not frameworks or set(frameworks) - set(FRAMEWORKS):
        parser.error(f"--frameworks {args.frameworks!r}: choose from {', '.join(FRAMEWORKS)}")
    dlbench = find_dlbench(args.dlbench)
    problem, docker_version = check_images(frameworks)
    for waited in range(args.wait):                 # images being built elsewhere
        if not problem:
            break
        print(f"waiting ({waited} of {args.wait} min): {problem}", flush=True)
        time.sleep(60)
        problem, docker_version = check_images(frameworks)
    if problem:
        sys.exit(problem)

    from orchestrator import __version__
    header(f"Docker {docker_version}, dlbench {__version__}")
    command = [dlbench, "build-images", "--frameworks", ",".join(frameworks)]
    print(f"timing   {shlex.join(command)}\n")
    seconds = []
    for run in range(1, args.repeats + 1):
        spent, done = timed(command)
        output = done.stdout + done.stderr
        if done.returncode != 0:
            last = (output.strip().splitlines() or ["no output"])[-1]
            sys.exit(f"build_cache.py: error: run {run} exited {done.returncode}: {last}")
        if ": building" in output:                  # an input changed meanwhile
            print(f"  warning: run {run} built an image, so it does not time the check alone")
        seconds.append(spent)
        print(f"  run {run}: {spent:6.2f} s", flush=True)
    startup, _ = timed([dlbench, "--help"])
    median = statistics.median(seconds)
    print(f"\n  median  {median:6.2f} s   (min {min(seconds):.2f}, max {max(seconds):.2f}; "
          f"{len(frameworks)} framework images and the base)")
    print(f"  start-up alone (`dlbench --help`): {startup:.2f} s")
    print(f"  goal under {GOAL_S:g} s: {'met' if median < GOAL_S else 'MISSED'}")


if __name__ == "__main__":
    main()
