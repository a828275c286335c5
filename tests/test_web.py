"""The web image: a trained model's ONNX file run inside a real headless Chromium by tract
compiled to WebAssembly (images/web), in a real container, on a hundred real test images.
The models are the quick profile's, as trained and committed in
docs/measurements/2026-11-28-exact-attacks: Caffe's LeNet runs and classifies as ONNX Runtime
does; Lua Torch7's, whose Pad gives its constant as a one-element tensor where ONNX has a
scalar, tract cannot load, and a model with an operator tract lacks (Mish) neither: failed
rows with tract's reasons."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from orchestrator import build, catalog
from orchestrator.checks import platforms, untrusted
from orchestrator.runtimes.docker import docker_client

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parent.parent
QUICK = REPO / "docs" / "measurements" / "2026-11-28-exact-attacks" / "quick"
IMAGES = 100        # test images
BATCH = 50


def _model(framework: str) -> bytes:
    import pyarrow.parquet as pq

    rows = pq.read_table(QUICK / "runs").to_pylist()
    run_id, = [row["run_id"] for row in rows if row["framework"] == framework and row["dataset"] == "mnist"]
    return (QUICK / "models" / f"{run_id}.onnx").read_bytes()


def _mish() -> bytes:
    """A classifier of MNIST's shape through Mish, an operator tract lacks (ONNX Runtime has it)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.full((784, 10), 1 / 784, np.float32), "weights")
    shape = numpy_helper.from_array(np.array([-1, 784], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["pixels", "shape"], ["flat"]),
         helper.make_node("Mish", ["flat"], ["activated"]),
         helper.make_node("MatMul", ["activated", "weights"], ["logits"])], "mish",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["N", 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], [weights, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _containers() -> set[str]:
    return {c.id for c in docker_client().containers.list(
        all=True, filters={"ancestor": build.image_tag("web")})}


@pytest.fixture(scope="module")
def web(build_image, data_root, tmp_path_factory):
    """model -> (its web row, ONNX Runtime's classes, the labels, the model), each model run
    once, and the web image's containers before and after."""
    from dlbench_runner.contract import formats

    build_image("web")
    images, labels = formats.test_split("mnist", str(data_root))
    images, labels = images[:IMAGES], labels[:IMAGES]
    before = _containers()
    found = {}
    for name, model in (("caffe", _model("caffe")), ("torch", _model("torch")), ("mish", _mish())):
        (classes, logits), = untrusted.classify(model, [images], 16)
        # no calibration images: the web platform does not quantize
        folder = platforms.request(tmp_path_factory.mktemp(name) / "in", model, images, labels,
                                   classes, logits, images[:0], platforms=["web"], batch=BATCH,
                                   timed=50, warmup=5)
        rows = platforms.deploy(docker_client(), folder, ["web"])
        found[name] = (rows, classes, labels, model)
    return found, before, _containers()


def test_a_model_runs_in_a_real_browser_as_onnx_runtime_runs_it(web):
    found, _, _ = web
    rows, classes, labels, model = found["caffe"]
    row, = rows
    assert row.platform == "web" and row.status == "ok" and row.reason is None, row
    # run by the page in Chromium (its user agent, as it posted it), by the engine pinned
    tract, chromium = catalog.tool_info("web")["version"].split(", ")
    assert f"HeadlessChrome/{chromium.split()[1]}" in row.runtime, row.runtime
    assert row.runtime.endswith(f"; {tract} wasm32"), row.runtime
    # every one of the hundred images classified as ONNX Runtime classifies it
    assert row.mismatches == 0
    assert row.max_logit_error < 1e-4
    assert row.accuracy == pytest.approx(float(np.mean(classes == labels)))
    assert row.model_bytes == len(model)
    assert row.conversion_s > 0 and row.latency_ms > 0 and row.latency_iqr_ms >= 0
    assert row.throughput > 0 and row.throughput_batch == BATCH
    assert row.peak_memory_bytes > 50 << 20       # a browser's processes, summed
    assert row.converter_layout is None and row.conversion_shared is None
    assert row.adversarial_images is None and row.adversarial_accuracy is None


@pytest.mark.parametrize("name, reason", [
    ("torch", 'Failed analyse for node #17 "t2" Pad: '),
    ("mish", "Unimplemented(Mish)"),
])
def test_a_model_tract_cannot_load_is_a_row_with_its_reason(web, name, reason):
    found, _, _ = web
    row, = found[name][0]
    assert row.status == "failed" and row.reason.startswith("load: ") and reason in row.reason, row.reason
    assert "\n" not in row.reason
    assert "HeadlessChrome/" in row.runtime        # the page ran, and said why
    assert row.accuracy is None and row.latency_ms is None and row.conversion_s is None
    assert row.model_bytes == len(found[name][3])


def test_the_containers_are_gone(web):
    _, before, after = web
    assert after == before


def _program():
    """web.py, the image's program (stand-alone: numpy only), imported here."""
    spec = importlib.util.spec_from_file_location("web_program", REPO / "images" / "web" / "web.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


AGENT = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
         "HeadlessChrome/156.0.0.0 Safari/537.36")


@pytest.mark.parametrize("path, agent, body, reason", [
    ("/secret/result", AGENT, {"token": "guess", "userAgent": AGENT}, "a wrong token"),
    ("/guess/result", AGENT, {"token": "secret", "userAgent": AGENT}, "a wrong token"),
    ("/secret/result", "curl/8.0", {"token": "secret", "userAgent": "curl/8.0"}, "not a Chrome's"),
    ("/secret/result", "curl/8.0", {"token": "secret", "userAgent": AGENT}, "not a Chrome's"),
    ("/secret/result", AGENT, [1, 2], "not a JSON object"),
])
def test_a_post_not_from_the_page_is_refused(path, agent, body, reason):
    web = _program()
    with pytest.raises(web.Failed, match=reason):
        web.judged({"path": path, "agent": agent, "body": body}, "secret")
    posted = {"token": "secret", "userAgent": AGENT, "error": "load: no"}
    assert web.judged({"path": "/secret/result", "agent": AGENT, "body": posted}, "secret") == posted


def test_no_row_where_web_is_not_asked_for(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "request.json").write_text(json.dumps({"platforms": ["mobile"], "model": "model.onnx"}))
    assert _program().main(["web.py", str(folder), str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "result.json").read_text()) == {"schema": 1, "platforms": []}
