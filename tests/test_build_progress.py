"""A build's progress read from its output: the step, the time left, the downloads, and each
image's last build time kept per machine.  A fake clock makes the times exact; the lines are
the legacy builder's, apt's and pip's own."""

from __future__ import annotations

import json
import shlex

import pytest

from orchestrator import build, catalog
from orchestrator.build import progress as build_progress
from orchestrator.build.progress import BuildProgress, Step, Times, duration


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


LAST = [Step("FROM base", 1.0), Step("RUN apt-get install -y python3-numpy", 100.0),
        Step("COPY runner /opt/dlbench", 2.0)]


def at_step(progress: BuildProgress, clock: Clock, step: int, steps: int, after: float, text="RUN x"):
    clock.now += after
    assert progress.line(f"Step {step}/{steps} : {text}")


def test_the_time_left_is_the_last_builds_from_this_step_on():
    clock = Clock()
    progress = BuildProgress(LAST, clock)
    assert progress.eta_s() is None                     # no step yet
    at_step(progress, clock, 1, 3, 0.5)
    assert progress.eta_s() == pytest.approx(103.0)     # every step of the last build
    at_step(progress, clock, 2, 3, 0.1)
    clock.now += 10
    assert progress.eta_s() == pytest.approx(92.0)      # 100 - 10 of this step, then 2
    clock.now += 500                                    # slower than last time:
    assert progress.eta_s() == pytest.approx(2.0)       # never less than the steps after it
    at_step(progress, clock, 3, 3, 0)
    assert progress.eta_s() == pytest.approx(2.0)


def test_without_a_last_build_the_time_left_is_the_pace_so_far():
    clock = Clock()
    progress = BuildProgress(None, clock)
    at_step(progress, clock, 1, 5, 0)
    clock.now += 5
    assert progress.eta_s() is None                     # nothing done yet to go by
    at_step(progress, clock, 3, 5, 15)                  # 20 s for 2 steps: 10 s a step
    assert progress.eta_s() == pytest.approx(30.0)      # 3 steps left
    clock.now += 4
    assert progress.eta_s() == pytest.approx(26.0)
    clock.now += 100
    assert progress.eta_s() == 0.0


def test_a_last_build_of_another_number_of_steps_is_not_used():
    clock = Clock()
    progress = BuildProgress(LAST, clock)
    at_step(progress, clock, 1, 4, 0)
    at_step(progress, clock, 2, 4, 8)
    assert progress.eta_s() == pytest.approx(24.0)      # 8 s a step, 3 left


def test_apt_and_pip_downloads_are_read_from_their_own_lines():
    progress = BuildProgress()
    progress.line("Step 2/3 : RUN apt-get update && apt-get install -y python3-numpy")
    progress.line("Get:1 http://deb.debian.org/debian bullseye InRelease [116 kB]")   # the index
    assert progress.downloads() == ""
    progress.line("Need to get 45.3 MB of archives.")
    progress.line("After this operation, 200 MB of additional disk space will be used.")
    progress.line("Get:1 http://deb.debian.org/debian bullseye/main amd64 libgfortran5 amd64 "
                  "10.2.1-6 [1,234 kB]")
    progress.line("Get:2 http://deb.debian.org/debian bullseye/main amd64 python3-numpy amd64 "
                  "1:1.19.5-1 [3,567 kB]")
    assert progress.downloads() == "apt 4.8/45.3 MB"
    progress.line("Need to get 1,024 kB/2,048 kB of archives.")    # partly fetched before
    assert progress.downloads() == "apt 0.0/1.0 MB"
    progress.line("Step 3/3 : RUN pip install torch")             # a new step: apt's count ends
    progress.line("Collecting torch==1.13.1")
    progress.line("  Downloading torch-1.13.1-cp39-cp39-manylinux1_x86_64.whl (887.5 MB)")
    progress.line("Downloading numpy-1.24.4-cp39-cp39-manylinux_2_17_x86_64.whl (17.3 MB)")
    assert progress.downloads() == "pip 905 MB"


def test_one_line_says_the_step_the_time_left_and_the_downloads():
    clock = Clock()
    progress = BuildProgress(LAST, clock)
    at_step(progress, clock, 2, 3, 1, "RUN apt-get   update  && apt-get install -y python3-numpy")
    progress.line("Need to get 12.5 MB of archives.")
    assert progress.text() == ("step 2/3 RUN apt-get update && apt-get install -y, "
                               "about 2 min left, apt 0.0/12.5 MB")
    assert [duration(s) for s in (4, 59.4, 61, 3600, 3 * 3600 + 300)] == [
        "4 s", "59 s", "1 min", "1 h 00 min", "3 h 05 min"]


def test_each_images_last_build_is_kept_per_machine(tmp_path):
    path = tmp_path / "times.json"
    here, there = Times(path, host="here"), Times(path, host="there")
    assert here.last("dlbench/caffe:cpu") is None
    clock = Clock()
    progress = BuildProgress(None, clock)
    at_step(progress, clock, 1, 2, 0, "FROM base")
    progress.line(" ---> Using cache")
    at_step(progress, clock, 2, 2, 3, "RUN make")
    clock.now += 40
    here.keep("dlbench/caffe:cpu", progress.finish())
    assert here.last("dlbench/caffe:cpu") == [Step("FROM base", 3.0, True), Step("RUN make", 40.0)]
    assert there.last("dlbench/caffe:cpu") is None       # another machine's builds are its own

    # Rebuilt with both steps taken from Docker's layer cache: a cached step keeps the time
    # it took when it last ran, so the next cold build is not promised a cached one's speed.
    here.keep("dlbench/caffe:cpu", [Step("FROM base", 0.1, True), Step("RUN make", 0.2, True)])
    assert [s.seconds for s in here.last("dlbench/caffe:cpu")] == [3.0, 40.0]
    here.keep("dlbench/caffe:cpu", [Step("FROM base", 0.1, True), Step("RUN make -j2", 0.2, True)])
    assert [s.seconds for s in here.last("dlbench/caffe:cpu")] == [3.0, 0.2]   # another step


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"here": []}',
                                     '{"here": {"dlbench/caffe:cpu": [["FROM", "x", 1]]}}'])
def test_a_file_that_cannot_be_read_gives_no_estimate_and_is_written_anew(tmp_path, content):
    path = tmp_path / "times.json"
    path.write_text(content)
    times = Times(path, host="here")
    assert times.last("dlbench/caffe:cpu") is None
    times.keep("dlbench/caffe:cpu", [Step("FROM base", 1.5)])
    assert times.last("dlbench/caffe:cpu") == [Step("FROM base", 1.5)]
    assert json.loads(path.read_text())["here"]["dlbench/caffe:cpu"] == [["FROM base", 1.5, False]]


def test_a_cache_that_cannot_be_written_costs_only_the_estimate(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("")
    times = Times(host="here")
    times.keep("dlbench/caffe:cpu", [Step("FROM base", 1.5)])
    assert times.last("dlbench/caffe:cpu") is None


def test_a_job_counts_the_builds_running_as_it_starts_and_those_begun_after():
    activity = build.Activity()
    activity.begin()
    mark = activity.mark()                  # one build running as the job starts
    activity.end()
    activity.begin()                        # two more begin while it runs
    activity.begin()
    activity.end()
    assert activity.since(mark) == 3
    assert activity.since(activity.mark()) == 1     # one still running
    activity.end()
    assert activity.since(activity.mark()) == 0


def test_side_by_side_the_images_that_compile_start_first_and_the_rest_shortest_first():
    plan = [("caffe", "cpu"), ("tensorflow", "cpu"), ("torch", "cpu"), ("pytorch", "cpu")]
    assert build.start_order(plan, jobs=2) == [("torch", "cpu"), ("caffe", "cpu"),
                                               ("tensorflow", "cpu"), ("pytorch", "cpu")]
    # the web image compiles its crates: beside Lua Torch7's sources, the longer first
    tools = plan + [("deploy", "cpu"), ("web", "cpu")]
    expected = {"caffe": 300, "tensorflow": 200, "torch": 760, "pytorch": 250, "deploy": 160, "web": 630}.get
    assert build.start_order(tools, 2, lambda image: expected(image[0])) == [
        ("torch", "cpu"), ("web", "cpu"), ("deploy", "cpu"), ("tensorflow", "cpu"), ("pytorch", "cpu"),
        ("caffe", "cpu")]
    assert build.start_order(tools, 1, lambda image: expected(image[0]))[-1] == ("torch", "cpu")
    assert build.start_order(plan, jobs=1) == plan      # nothing known: the plan's order
    expected = {"caffe": 300, "tensorflow": 200, "torch": 900}.get     # pytorch's unknown: last
    assert build.start_order(plan, 2, lambda image: expected(image[0])) == [
        ("torch", "cpu"), ("tensorflow", "cpu"), ("caffe", "cpu"), ("pytorch", "cpu")]
    assert build.start_order(plan, 1, lambda image: expected(image[0])) == [   # the first rows soonest
        ("tensorflow", "cpu"), ("caffe", "cpu"), ("torch", "cpu"), ("pytorch", "cpu")]


def test_the_expected_build_time_is_the_last_one_here_else_the_frameworks_own(tmp_path, monkeypatch):
    times = build_progress.Times(tmp_path / "times.json", host="h")
    builder = build.Builder(None, times=times)
    assert builder.expected_seconds(("mxnet", "cpu")) == catalog.models("mxnet")["build_s"] > 0
    assert builder.expected_seconds(("mxnet", "gpu")) is None
    times.keep(build.image_tag("mxnet"), [build_progress.Step("RUN a", 20.0, False),
                                          build_progress.Step("COPY b", 1.5, False)])
    assert builder.expected_seconds(("mxnet", "cpu")) == 21.5


def test_the_labels_are_one_instruction_quoted_as_a_dockerfile_reads_it():
    """Docker reads a LABEL's double-quoted words as a POSIX shell does (a backslash escapes
    a quote or a backslash), so shlex reads them back; the images' own labels are checked
    by the framework tests."""
    labels = {"org.dlbench.sources.torch/nn": "200ae7d", "org.dlbench.framework-version":
              'torch7@3e9e141 LuaJIT 2.1.0-beta1 "quoted" \\ back', "org.dlbench.cuda": "none"}
    line = build.label_instruction(labels)
    assert line.startswith("LABEL ") and "\n" not in line
    assert dict(word.split("=", 1) for word in shlex.split(line[len("LABEL "):])) == labels
