"""A framework's jobs start as soon as its own image is ready, while other images still build,
with the real Docker runtime, builder and job loop.

The framework images are replaced by tiny test images on the base image (the builder's
recipe of a framework image is swapped for a fixture Dockerfile, ``EarlyBuilder``): one
present before the run, one whose build takes ``SLOW_S`` seconds, one whose build fails.
Their jobs run ``fixtures/early_start/job.py``, which writes a valid result in two seconds.
Every image made here is labelled as a test image and removed afterwards.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import threading
from pathlib import Path

import pytest

from conftest import immediate_result, make_plan
from orchestrator import build, run, runtimes, store
from orchestrator.display import NullDisplay
from orchestrator.report import noise
from orchestrator.runtimes import Outcome, Target

FIXTURE = Path(__file__).parent / "fixtures" / "early_start"
TEST_LABEL = "org.dlbench.test"
SLOW_S = 25
KINDS = {"caffe": "quick", "theano": "slow", "mxnet": "broken"}


def tag_of(framework: str) -> str:
    return f"dlbench-test/early-{framework}:{os.getpid()}"


class EarlyBuilder(build.Builder):
    """The real builder, but a framework's image is a tiny test image of the base image
    (never built here: a missing base skips the test)."""

    nonce = secrets.token_hex(8)

    def base(self, rebuild: bool = False, suite: str | None = None):
        image = build.find_image(self.client, build.base_tag(self.suite))
        if image is None:
            pytest.skip(f"no {build.base_tag(self.suite)} image")
        return image

    def _framework_inputs(self, framework, variant, base):
        kind = KINDS[framework]
        files = {"Dockerfile": FIXTURE / f"Dockerfile.{kind}", "job.py": FIXTURE / "job.py"}
        args = {"BASE_IMAGE": base.id, "NONCE": self.nonce, "SLOW_S": str(SLOW_S)}
        return tag_of(framework), files, args, {TEST_LABEL: "early-start"}


@pytest.fixture
def early_runtime():
    runtime = runtimes.make("docker", display=NullDisplay())
    runtime.builder = EarlyBuilder(runtime.client, say=lambda text: None)
    yield runtime
    for image in runtime.client.images.list(filters={"label": f"{TEST_LABEL}=early-start"}):
        runtime.client.images.remove(image.id, force=True)
    runtime.close()


def created(image) -> dt.datetime:
    """When Docker made the image (its last step ended), to the microsecond."""
    stamp = image.attrs["Created"]          # 2026-11-26T07:30:01.123456789Z
    head, _, fraction = stamp.rstrip("Z").partition(".")
    return dt.datetime.fromisoformat(f"{head}.{fraction[:6].ljust(6, '0')}+00:00")


@pytest.mark.docker
def test_a_job_whose_image_is_ready_runs_while_another_image_builds(tmp_path, data_root, early_runtime):
    early_runtime.builder.framework("caffe")           # present before the run
    the_plan = make_plan(["caffe", "theano", "mxnet"], ["mnist"], profile="quick", host_cpus=2)
    assert [job.framework for job in the_plan.jobs] == ["caffe", "theano", "mxnet"]

    records = run.run_plan(the_plan, tmp_path / "results", early_runtime, data_root)

    slow = early_runtime.client.images.get(tag_of("theano"))
    by_framework = {r.framework: r for r in records}
    caffe, theano, mxnet = by_framework["caffe"], by_framework["theano"], by_framework["mxnet"]
    # The present image's job ran, and its row was stored, before the slow image was built;
    # the failed build's jobs came next (ready at once, in the plan's order among the ready
    # ones); the slow image's job waited for its own image only.
    assert [r.framework for r in records] == ["caffe", "mxnet", "theano"]
    assert caffe.status == "ok" and caffe.recorded_at < created(slow)
    assert caffe.started_at < created(slow) - dt.timedelta(seconds=SLOW_S / 2)
    assert theano.status == "ok" and theano.started_at > created(slow)
    # A build that fails is its image's jobs' failed rows, in the build's own words; nothing
    # of them was started, and the run went on.
    assert mxnet.status == "failed" and mxnet.image_id is None and mxnet.builds_alongside is None
    assert mxnet.error.startswith(f"building {tag_of('mxnet')} failed: The command")
    assert "returned a non-zero code: 3" in mxnet.error
    assert not (tmp_path / "results" / store.JOBS / mxnet.run_id).exists()
    # A job that ran beside a build says so, and the report marks it disturbed.
    assert caffe.builds_alongside >= 1 and theano.builds_alongside == 0
    frame = store.load(tmp_path / "results")
    why = dict(zip(frame["framework"], noise.reasons(frame, ["framework"])))
    assert f"{caffe.builds_alongside} image build(s) ran beside it" in why["caffe"]
    assert "image build" not in why["theano"] and why["mxnet"] == ""     # not ok: not judged


# -- the job loop's side, without Docker --------------------------------------------------------
class Later:
    """A runtime whose jobs end at once with a valid result, and whose second target comes
    only once the first job has run (within ``wait_s``): a loop that waited for every target
    before its first job would wait that long, and the test would see it."""

    name, default_memory, gpus = "native", None, None

    def __init__(self, wait_s: float = 30):
        self.wait_s = wait_s
        self.ran = threading.Event()
        self.waited_out = False

    def host_facts(self):
        return {}

    def targets(self, images):
        first, *others = images
        yield first, Target("first", "first-id")
        self.waited_out = not self.ran.wait(self.wait_s)
        for key in others:
            yield key, Target("later", "later-id")

    def unsupported(self, target, job):
        return None

    def run(self, job, target, run_id, job_id, job_dir, dataset_path, display, inputs=None):
        immediate_result(job, run_id, job_id, job_dir)
        self.ran.set()
        return Outcome(exit_code=0, wall_time_s=0.1, log_tail=[])

    def cancel(self):
        pass

    def close(self):
        pass


class Said(NullDisplay):
    def __init__(self):
        self.lines = []

    def say(self, text):
        self.lines.append(text)


def test_jobs_run_as_their_targets_come_and_resume_counts_once_all_are_in(tmp_path, data_root):
    the_plan = make_plan(["caffe", "theano"], ["mnist"], profile="quick", host_cpus=2)
    runtime = Later()
    records = run.run_plan(the_plan, tmp_path / "results", runtime, data_root)
    assert [(r.framework, r.status, r.image_id) for r in records] == [
        ("caffe", "ok", "first-id"), ("theano", "ok", "later-id")]
    assert not runtime.waited_out

    display = Said()
    assert run.run_plan(the_plan, tmp_path / "results", Later(wait_s=0), data_root, display,
                        resume=True) == []
    assert display.lines == ["resume: 2 job(s) already stored as ok, 0 to run"]
