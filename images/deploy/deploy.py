"""dlbench's deployment program: one trained model, migrated to ONNX, run where Guo et al.
deployed theirs (the mobile runtime, with and without 8-bit quantization, and ONNX Runtime
quantized), each platform measured alike.  Stand-alone: it speaks JSON, imports nothing of
dlbench, and runs in the deploy image.

    python3 deploy.py IN OUT

IN holds ``request.json`` and the arrays it names (``.npy``, never pickles):

    model           the job's ONNX model (what the host checked and stored)
    images          the test images the framework predicted, as the data set's bytes
                    (uint8, scaled to float32 pixels in [0, 1] as the runner scales them)
    labels          their labels
    predictions     the framework's own classes for them
    logits          the framework's own outputs for the first of them
    calibration     training images (never test images), the same bytes, for the 8-bit
                    post-training quantization
    adversarial     optional: the job's kept adversarial images, bytes or pixels, and
    adversarial_labels
    platforms       the names to run, of PLATFORMS
    batch           the job's test batch (throughput is measured at it where the model allows)
    threads         the runtime's threads (1: a phone core)
    timed           latency: images timed one at a time, after ``warmup``

Each platform's model is converted in a child process, then run in another that imports
only its runtime (its peak memory is the runtime's); ``OUT/result.json`` lists the rows in
``PLATFORMS``'s order.  A
platform that cannot convert or run the model is ``status: failed`` with a one-line
``reason``: an operator a converter lacks is a finding, not an error of the program.

    mobile       LiteRT (``ai_edge_litert``), the model converted from ONNX by onnx2tf,
                 float32, the interpreter's default delegate (XNNPACK)
    mobile-int8  the same converter's full-integer model (int8 in and out), calibrated on
                 ``calibration``; made by mobile's conversion where both are asked for
                 (onnx2tf writes both at once: the row's ``conversion_shared``)
    onnx-int8    ONNX Runtime's own static quantization (QDQ, int8 weights per channel and
                 activations), the same calibration, run by its CPU provider

Before conversion the model is made plain, the same for every platform: its opset raised
to 13 where lower (int8 QDQ needs it), and for LiteRT its batch fixed to 1 and simplified
(onnx-simplifier) with constants held as initializers, which onnx2tf reads.  onnx2tf guesses
each tensor's layout (channels first or last) and can guess wrong without an error: each
converted float32 model is run on the calibration images beside ONNX Runtime's run of the
ONNX model, and kept only where it classifies at least 999 in 1,000 of them alike; else the
conversion is tried again with the input held as channels first (``LAYOUTS``), and where no
way agrees the platform fails with that reason rather than report a wrong model's figures.
LiteRT's models take one image (a phone classifies one at a time): their throughput is at
batch 1; ONNX Runtime's is at the job's test batch.
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

import numpy as np

PLATFORMS = ("mobile", "mobile-int8", "onnx-int8")
SCHEMA = 1                  # result.json's version
AGREEMENT = 0.999           # float32 LiteRT against ONNX Runtime on the calibration images
OPSET = 13


def pixels(array):
    """Bytes as the runner scales them (bytes / 255 in float32); pixels as they are."""
    array = np.asarray(array)
    if array.dtype == np.uint8:
        return array.astype(np.float32) / np.float32(255.0)
    return array.astype(np.float32)


def one_line(exc):
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:400]


# -- the model made plain ------------------------------------------------------------------
def plain(model_bytes):
    """The model with its opset raised to ``OPSET`` where lower."""
    import onnx
    from onnx import version_converter

    model = onnx.load_from_string(model_bytes)
    default = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if default and default[0].version < OPSET:
        model = version_converter.convert_version(model, OPSET)
    return model


def fixed_batch(model):
    """For the LiteRT converter: batch 1, simplified, constants as initializers."""
    import onnx
    import onnxsim
    from onnx import numpy_helper

    name = model.graph.input[0].name
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    simplified, ok = onnxsim.simplify(model, overwrite_input_shapes={name: [1] + dims[1:]})
    if not ok:
        raise RuntimeError("onnx-simplifier could not check the simplified model")
    nodes = []
    for node in simplified.graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            value = numpy_helper.to_array(onnx.helper.get_attribute_value(node.attribute[0]))
            simplified.graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        else:
            nodes.append(node)
    del simplified.graph.node[:]
    simplified.graph.node.extend(nodes)
    return simplified


# -- the runtimes --------------------------------------------------------------------------
class Lite:
    """A LiteRT interpreter of one model, quantizing its input and output where int8."""

    def __init__(self, path, threads):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=str(path), num_threads=threads)
        self.interpreter.allocate_tensors()
        self.input = self.interpreter.get_input_details()[0]
        self.output = self.interpreter.get_output_details()[0]

    def __call__(self, image):
        value = image[None]
        if self.input["dtype"] == np.int8:
            scale, zero = self.input["quantization"]
            value = np.clip(np.round(value / scale + zero), -128, 127).astype(np.int8)
        self.interpreter.set_tensor(self.input["index"], value.reshape(self.input["shape"]))
        self.interpreter.invoke()
        out = self.interpreter.get_tensor(self.output["index"])
        if self.output["dtype"] == np.int8:
            scale, zero = self.output["quantization"]
            out = (out.astype(np.float32) - zero) * scale
        return out.reshape(-1)

    def classify(self, images):
        return np.stack([self(image) for image in images])


class Ort:
    """An ONNX Runtime session of one model, on the CPU provider."""

    def __init__(self, model_bytes, threads):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(model_bytes, options,
                                                    providers=["CPUExecutionProvider"])
        self.name = self.session.get_inputs()[0].name

    def __call__(self, image):
        return self.session.run(None, {self.name: image[None]})[0].reshape(-1)

    def classify(self, images, batch=500):
        return np.concatenate([self.session.run(None, {self.name: images[i:i + batch]})[0]
                               for i in range(0, len(images), batch)])

    def batched(self, images):
        return self.session.run(None, {self.name: images})[0]


def latency(run, images, warmup, timed):
    """Seconds per image at batch 1: median and spread (interquartile range) over ``timed``."""
    for image in images[:warmup]:
        run(image)
    times = []
    for image in images[:timed]:
        started = time.perf_counter()
        run(image)
        times.append(time.perf_counter() - started)
    quartiles = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return statistics.median(times), quartiles[2] - quartiles[0]


# -- one platform --------------------------------------------------------------------------
def convert(name, model, calibration, work, int8=False):
    """The platform's model file, converted into ``work`` (a child process's work)."""
    if name in ("mobile", "mobile-int8"):
        import onnx

        source = work / "plain.onnx"
        onnx.save(fixed_batch(model), source)
        reference = Ort(model.SerializeToString(), 1).classify(calibration).argmax(1)
        tried = []
        for layout in LAYOUTS:      # the first whose float32 model is the ONNX model
            folder = work / layout
            try:
                _onnx2tf(int8 or name == "mobile-int8", model, source, calibration, folder, layout)
            except Exception as exc:
                tried.append(f"{layout}: {one_line(exc)}")
                continue
            found = Lite(folder / "plain_float32.tflite", 1).classify(calibration).argmax(1)
            agree = float(np.mean(found == reference))
            if agree >= AGREEMENT:
                kind = "full_integer_quant" if name == "mobile-int8" else "float32"
                return folder / f"plain_{kind}.tflite", layout
            tried.append(f"{layout}: its float32 model classifies {1 - agree:.1%} of "
                         f"{len(calibration)} training images otherwise than the ONNX model")
        raise RuntimeError("onnx2tf: " + "; ".join(tried))
    if name == "onnx-int8":
        import onnx
        from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                              quantize_static)
        from onnxruntime.quantization.shape_inference import quant_pre_process

        source, prepared, target = work / "plain.onnx", work / "prepared.onnx", work / "int8.onnx"
        onnx.save(model, source)
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        input_name = model.graph.input[0].name

        class Calibration(CalibrationDataReader):
            def __init__(self):
                self.batches = iter(calibration[i:i + 50] for i in range(0, len(calibration), 50))

            def get_next(self):
                batch = next(self.batches, None)
                return None if batch is None else {input_name: batch}

        quantize_static(str(prepared), str(target), Calibration(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        per_channel=True)
        return target, None
    raise ValueError(f"no platform {name!r}")


# onnx2tf guesses each tensor's layout (NCHW or NHWC) and may guess wrong without an error;
# the input held as it is, then held as channels first: the first that gives the ONNX
# model's classes on the calibration images is kept
LAYOUTS = ("keep_shape_absolutely_input_names", "keep_ncw_or_nchw_or_ncdhw_input_names")


def _onnx2tf(int8, model, source, calibration, folder, layout):
    import onnx2tf

    options = {layout: [model.graph.input[0].name]}
    if int8:
        np.save(folder.parent / "calibration.npy", calibration)
        options.update(output_integer_quantized_tflite=True, quant_type="per-channel",
                       custom_input_op_name_np_data_path=[
                           [model.graph.input[0].name, str(folder.parent / "calibration.npy"), 0.0, 1.0]])
    onnx2tf.convert(input_onnx_file_path=str(source), output_folder_path=str(folder),
                    not_use_onnxsim=True, non_verbose=True, **options)
    for kind in ("float32", "full_integer_quant")[:2 if int8 else 1]:
        if not (folder / f"plain_{kind}.tflite").is_file():
            raise RuntimeError(f"onnx2tf wrote no {kind} model")


class Request:
    """The request and its arrays, read from IN."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.fields = json.loads((self.folder / "request.json").read_text())

    def __getitem__(self, key):
        return self.fields[key]

    def get(self, key, default=None):
        return self.fields.get(key, default)

    def array(self, key):
        return np.load(self.folder / self.fields[key], allow_pickle=False)

    def model_bytes(self):
        return (self.folder / self.fields["model"]).read_bytes()


def converting(name, request, work):
    """The conversion child: the platform's model into ``work``, its time and size.  Where
    both LiteRT platforms are asked for, mobile's conversion writes the 8-bit model too
    (onnx2tf makes both in one conversion), and mobile-int8 takes it from there."""
    model, calibration = plain(request.model_bytes()), pixels(request.array("calibration"))
    started = time.perf_counter()
    path, layout = convert(name, model, calibration, work,
                           int8=name == "mobile" and "mobile-int8" in request["platforms"])
    return {"conversion_s": time.perf_counter() - started, "model_bytes": path.stat().st_size,
            "model": str(path), "converter_layout": layout}


def shared_conversion(out):
    """mobile-int8's conversion, made by mobile's: its figures, or mobile's failure."""
    found = json.loads((out / "mobile" / "convert.json").read_text())
    if found["status"] == "ok":
        path = Path(found["model"]).parent / "plain_full_integer_quant.tflite"
        found.update(model=str(path), model_bytes=path.stat().st_size, conversion_shared=True)
    return found


def running(name, request, work, converted):
    """The runtime child: only the runtime is imported, so that its peak memory is the
    runtime's; the converted model checked, timed and scored."""
    images, labels = pixels(request.array("images")), request.array("labels")
    own, own_logits = request.array("predictions"), request.array("logits")
    threads, batch = int(request.get("threads", 1)), int(request.get("batch", 100))
    path = Path(converted["model"])
    found = {}
    if name.startswith("mobile"):
        runtime = Lite(path, threads)
        throughput_batch = 1
        found["runtime"] = f"ai-edge-litert {metadata.version('ai-edge-litert')} (XNNPACK)"
    else:
        runtime = Ort(path.read_bytes(), threads)
        throughput_batch = batch
        found["runtime"] = f"onnxruntime {metadata.version('onnxruntime')} (CPU)"
    median, spread = latency(runtime, images, int(request.get("warmup", 20)),
                             int(request.get("timed", 200)))
    started = time.perf_counter()
    logits = runtime.classify(images)
    seconds, counted = time.perf_counter() - started, len(images)
    if throughput_batch > 1:        # at the test batch, where the runtime takes one
        chunks = [images[i:i + batch] for i in range(0, len(images) - batch + 1, batch)]
        started = time.perf_counter()
        for chunk in chunks:
            runtime.batched(chunk)
        seconds, counted = time.perf_counter() - started, batch * len(chunks)
    classes = logits.argmax(1)
    first = logits[:len(own_logits)].astype(np.float64)
    scale = np.abs(own_logits).max(axis=1)
    error = np.abs(first - own_logits).max(axis=1) / np.where(scale > 0, scale, 1.0)
    found.update(accuracy=float(np.mean(classes == labels)),
                 mismatches=int(np.count_nonzero(classes != own)),
                 max_logit_error=float(error.max()),
                 latency_ms=median * 1e3, latency_iqr_ms=spread * 1e3,
                 throughput=counted / seconds if seconds > 0 else None,
                 throughput_batch=throughput_batch)
    if request.get("adversarial"):
        adversarial = pixels(request.array("adversarial"))
        found["adversarial_images"] = int(len(adversarial))
        found["adversarial_accuracy"] = float(np.mean(
            runtime.classify(adversarial).argmax(1) == request.array("adversarial_labels")))
    found["peak_memory_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return found


STEPS = {"convert": converting, "run": running}


def child(step, name, folder, work):
    """One step of one platform in a process of its own: its figures, or its reason, to
    ``work/<step>.json``."""
    request, work = Request(folder), Path(work)
    try:
        args = (json.loads((work / "convert.json").read_text()),) if step == "run" else ()
        found = {"status": "ok", **STEPS[step](name, request, work, *args)}
    except Exception as exc:    # a converter's or runtime's failure: the platform's reason
        traceback.print_exc()
        found = {"status": "failed", "reason": one_line(exc)}
    (work / f"{step}.json").write_text(json.dumps(found))
    return 0


def deploy(name, folder, out):
    """One platform's row: converted, then run, each step a child process."""
    work = out / name
    work.mkdir(parents=True, exist_ok=True)
    row = {"platform": name, "status": "ok", "reason": None}
    shared = name == "mobile-int8" and (out / "mobile" / "convert.json").is_file()
    for step in STEPS:
        path = work / f"{step}.json"
        if step == "convert" and shared:
            path.write_text(json.dumps(shared_conversion(out)))
        else:
            done = subprocess.run([sys.executable, __file__, f"--{step}", name, str(folder), str(work)])
        found = (json.loads(path.read_text()) if path.is_file() else
                 {"status": "failed", "reason": f"its {step} process ended with exit status {done.returncode}"})
        found.pop("model", None)
        row.update(found)
        if row["status"] != "ok":
            row["reason"] = f"{step}: {row['reason']}"
            break
    return row


def main(argv):
    if len(argv) == 5 and argv[1] in ("--convert", "--run"):
        return child(argv[1][2:], *argv[2:])
    if len(argv) != 3:
        print("usage: deploy.py IN OUT", file=sys.stderr)
        return 2
    folder, out = Path(argv[1]), Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    wanted = Request(folder)["platforms"]
    rows = [deploy(name, folder, out) for name in PLATFORMS if name in wanted]
    (out / "result.json").write_text(json.dumps({"schema": SCHEMA, "platforms": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
