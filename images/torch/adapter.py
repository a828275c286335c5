"""Lua Torch7 adapter: GTDLBench's own Torch scripts, run by ``th`` as they ran.

The scripts (``train-on-mnist.lua``, ``train-on-cifar-10.lua``) come unchanged
from GTDLBench's repository at its pinned commit, unpacked into the image at
build time.  ``dlbench_harness.lua`` runs one of them and adds only what a
harness needs (see its header): the data files it asks for are served from the
canonical files, which ``setup()`` converts to raw byte arrays (setup, not
training); its ``train``/``test`` calls are announced on stdout as
``:::DLBENCH-TH {json}`` lines and each waits for a ``go`` on stdin, so this
process's clock, the runner's, brackets every call exactly.

The scripts test after every epoch.  The runner's ``train_time_s`` is its clock
around the whole loop less those per-epoch test passes (``ctx.train_excluded_s``,
timed by the same clock); ``test_time_s`` is the last epoch's test pass, the
runner's one pass over the test set.  Beside them, the script's own clock: its
"whole training time" (``paper_train_time_s``: every epoch's training) and the
"test time" it prints after its last epoch's test pass (``paper_test_time_s``:
one pass).  GTDLBench published one pass: its Torch7 MNIST CPU testing time,
56.52 s, is what one pass over the 10,000 test images takes (55 to 57 s here),
not 20 passes' sum (that would be 2.8 s a pass while training is only 1.8 times
faster there than here).  The script's "whole test time", the sum of every
epoch's pass, stays in result.json under ``periodic``.

On a GPU (``cuda``/``cuda:N``, in the GPU image, whose Lua Torch7 has cutorch and
cunn) the harness moves the script's model, criterion and batches there; see its
header.  The GPU work is in ``th``, so the harness synchronises it before each event.
The CIFAR-10 script's ``nn.SpatialConvolutionMap`` layers, which cunn lacks, run
there as masked full convolutions (``dlbench_maps.lua``): a reconstruction of the
program behind GTDLBench's Torch CIFAR-10 GPU cell, which its repository lacks
(``script.masked_maps`` in result.json counts them).

The robustness check's gradient is Torch7's own: after the script, the harness answers
``gradient``/``predict``/``loss`` requests (the pixels and labels as raw files) by the
trained model's updateGradInput through the script's preprocessing rebuilt from nn modules
(MNIST: zero padding and normalizeGlobal's statistics of the test set, as the script's test
sees its images; CIFAR-10: image.rgb2yuv, a copy of the script's contrastive normalisation
on Y, and its training set's U and V statistics).
"""

import json
import os
import subprocess
import sys
import time

import numpy

from dlbench_runner.robustness import NoInputGradient

SCRIPTS = {
    "mnist": "/opt/gtdlbench/models/mnist/torch/train-on-mnist.lua",
    "cifar10": "/opt/gtdlbench/models/cifar10/torch/train-on-cifar-10.lua",
}
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_PINS = "/opt/dlbench/sources.txt"
TAG = b":::DLBENCH-TH "
# the robustness check's files, in the harness's working directory (named relative to it)
ROBUST_FILES = {"pixels": "robust-pixels.f64", "labels": "robust-labels.u8",
                "gradient": "robust-gradient.f64", "losses": "robust-losses.f64",
                "logits": "robust-logits.f64", "output_gradient": "robust-output-gradient.f64",
                "vjp": "robust-vjp.f64"}
ROBUST_ANSWERS = {"predict": "predicted", "loss": "loss", "gradient": "gradient", "losses": "losses",
                  "logits": "logits", "vjp": "vjp"}
# the script's tensor types (the harness's `finish`), as numpy's
TENSOR_DTYPES = {"torch.FloatTensor": numpy.float32, "torch.DoubleTensor": numpy.float64,
                 "torch.CudaTensor": numpy.float32, "torch.CudaDoubleTensor": numpy.float64}
# the migration check's layer kinds of Lua Torch7's modules without weights
PLAIN_MODULES = {"nn.Tanh": "tanh", "nn.ReLU": "relu", "nn.Sigmoid": "sigmoid", "nn.SoftMax": "softmax",
                 "nn.LogSoftMax": "log_softmax", "nn.Reshape": "flatten", "nn.View": "flatten"}


class ScriptError(RuntimeError):
    pass


class Adapter:
    def __init__(self, ctx):
        self.ctx = ctx
        self.hp = ctx.hp
        self.proc = None
        self.finish = {}
        self.tail = []

    # -- setup: the data as the script's .t7 files hold it, then th up to its first train()
    def setup(self):
        self.work = os.environ.get("DLBENCH_TORCH7_WORK") or _tmpdir()
        # whole: the script's files hold every image, and it takes its first N itself
        arrays = self.ctx.load_data(cut=False)
        files = (self._mnist_files if self.ctx.dataset == "mnist" else self._cifar_files)(arrays)
        # dataset: which preprocessing the robustness check's requests rebuild
        config = {"files": files, "epochs": self.hp["epochs"], "dataset": self.ctx.dataset}
        if self.ctx.gpu is not None:
            if not os.path.isdir("/opt/torch/share/lua/5.1/cunn"):
                raise ValueError("device %r: this image's Lua Torch7 is a CPU build, without "
                                 "cutorch and cunn" % self.ctx.device)
            config["gpu"] = self.ctx.gpu    # checked by cutorch
        for key in ("train_subset", "test_subset"):    # the script's trsize, tesize, ...
            if self.hp[key]:            # absent, not null: cjson's null is true in Lua
                config[key] = self.hp[key]
        config_path = os.path.join(self.work, "dlbench-config.json")
        with open(config_path, "w") as f:
            json.dump(config, f)
        command = ["th", os.path.join(HERE, "dlbench_harness.lua"), config_path,
                   SCRIPTS[self.ctx.dataset]] + self._script_options()
        print("dlbench torch7: " + " ".join(command), flush=True)
        self.proc = subprocess.Popen(command, cwd=self.work, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._expect("start")
        self._expect("begin", phase="train", epoch=1)

    def _script_options(self):
        hp, threads = self.hp, self.ctx.omp_threads     # the script's torch.setnumthreads
        if self.ctx.dataset == "mnist":   # lapp: -m is both --model and --momentum, so long names
            options = ["--full", "--batchSize", str(hp["batch_size"]),
                       "--learningRate", repr(hp["learning_rate"]), "--momentum", repr(hp["momentum"])]
            return options + (["--threads", str(threads)] if threads else [])
        options = ["-full", "-batchSize", str(hp["batch_size"]), "-learningRate", repr(hp["learning_rate"]),
                   "-momentum", repr(hp["momentum"]), "-weightDecay", repr(hp["weight_decay"]),
                   "-seed", str(self.ctx.seed)]
        return options + (["-threads", str(threads)] if threads else [])

    def _write(self, name, array):
        path = os.path.join(self.work, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        numpy.ascontiguousarray(array, dtype=numpy.uint8).tofile(path)
        return path

    def _mnist_files(self, arrays):
        """mnist.t7/{train,test}_32x32.t7: data ByteTensor N x 1 x 32 x 32 (the 28x28 digits
        zero-padded by 2 on each side), labels ByteTensor N holding 1..10."""
        files = {}
        for split, name in (("train", "train_32x32.t7"), ("test", "test_32x32.t7")):
            images = numpy.pad(arrays[split + "_images"], ((0, 0), (2, 2), (2, 2)))
            labels = arrays[split + "_labels"].astype(numpy.uint8) + 1
            expected = "mnist.t7/" + name
            files[expected] = {
                "data": self._write(expected + ".data.u8", images), "data_shape": [len(images), 1, 32, 32],
                "labels": self._write(expected + ".labels.u8", labels), "labels_shape": [len(labels)]}
            open(os.path.join(self.work, expected), "w").close()   # the script's download check
        return files

    def _cifar_files(self, arrays):
        """cifar-10-batches-t7/{data_batch_1..5,test_batch}.t7: data ByteTensor 3072 x 10000
        (one column per image, R, G then B planes), labels ByteTensor 1 x 10000 holding 0..9."""
        files = {}
        names = ["data_batch_%d" % i for i in range(1, 6)] + ["test_batch"]
        for i, name in enumerate(names):
            split, start = ("test", 0) if name == "test_batch" else ("train", i * 10000)
            images = arrays[split + "_images"][start:start + 10000].reshape(10000, 3072)
            labels = arrays[split + "_labels"][start:start + 10000]
            expected = "cifar-10-batches-t7/%s.t7" % name
            files[expected] = {
                "data": self._write(expected + ".data.u8", images), "data_shape": [10000, 3072],
                "transpose": True,
                "labels": self._write(expected + ".labels.u8", labels), "labels_shape": [1, 10000]}
        return files

    # -- the protocol with the harness ---------------------------------------------------
    def _events(self):
        """The harness's events, in order; every other line is passed on to the log."""
        for line in iter(self.proc.stdout.readline, b""):
            if line.startswith(TAG):
                yield json.loads(line[len(TAG):])
                continue
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
            text = line.decode("utf-8", "replace").strip().split("\r")[-1]
            if text:
                self.tail = (self.tail + [text])[-5:]
        code = self.proc.wait()
        raise ScriptError("th exited with %d before the script finished: %s"
                          % (code, " | ".join(self.tail)[-400:]))

    def _next_event(self):
        if not hasattr(self, "_stream"):
            self._stream = self._events()
        return next(self._stream)

    def _expect(self, event, **fields):
        found = self._next_event()
        if found["event"] != event or any(found.get(k) != v for k, v in fields.items()):
            raise ScriptError("expected %s %s from the harness, got %s" % (event, fields, found))
        return found

    def _go(self):
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    # -- train: every epoch's train() call; the per-epoch test passes are excluded ----------
    def train(self):
        epochs = self.hp["epochs"]
        for epoch in range(1, epochs + 1):
            if epoch > 1:
                self._expect("begin", phase="train", epoch=epoch)
            self.ctx.epoch_start()
            self._go()
            end = self._expect("end", phase="train", epoch=epoch)
            self.ctx.epoch_done(epoch, _number(end.get("loss")), _number(end.get("accuracy")),
                                samples=end.get("samples"))
            if epoch < epochs:      # this epoch's test pass: the script's, not training
                self._go()
                self._expect("begin", phase="test")
                t0 = time.perf_counter()
                self._go()
                scores = self._expect("end", phase="test")
                self.ctx.train_excluded_s += time.perf_counter() - t0
                self.ctx.epochs[-1]["test_accuracy"] = scores.get("accuracy")
                self._go()

    # -- test: the last epoch's test pass ------------------------------------------------------
    def test(self):
        self._go()
        self._expect("begin", phase="test")
        self._go()
        scores = self._expect("end", phase="test")
        self._go()
        self.ctx.epochs[-1]["test_accuracy"] = scores.get("accuracy")
        # the classes the script's test predicted, one an image it added to its confusion
        # matrix (MNIST's adds whole batches, a last one's padding included, so more than
        # the test set holds where it is not a multiple of the batch: the runner then
        # predicts them itself)
        predicted = scores.get("predictions")
        return {"accuracy": scores["accuracy"], "loss": scores.get("loss"),
                "predictions": numpy.asarray(predicted, dtype=numpy.int64) if predicted else None}

    # -- save: torch.save of the script's model, in th ----------------------------------------
    def _finished(self):
        """The script's own totals, sent once it has ended."""
        if not self.finish:
            self.finish = self._expect("finish")
        return self.finish

    def save(self, folder):
        self._finished()
        path = os.path.join(folder, "model.t7")
        self.proc.stdin.write(b"save " + path.encode() + b"\n")
        self.proc.stdin.flush()
        self._expect("saved", path=path)

    # -- the robustness check: the trained model's view of pixels, by Torch7 in th ---------------
    def input_gradient(self, pixels, labels):
        """The gradient of the ClassNLLCriterion loss summed over the batch with respect to
        the pixels, by updateGradInput of the model and of the script's preprocessing rebuilt
        from nn modules (see the harness's header); and the classes predicted."""
        found = self._ask("gradient", pixels, labels)
        gradient = numpy.fromfile(os.path.join(self.work, ROBUST_FILES["gradient"]), dtype=numpy.float64)
        return gradient.reshape(pixels.shape).astype(pixels.dtype), _classes(found)

    def input_vjp(self, pixels, output_gradient):
        """The vector-Jacobian product of the model's LogSoftMax outputs (whose softmax is
        its probabilities) with ``output_gradient(outputs)``, by updateGradInput of the
        model and of the preprocessing rebuilt from nn modules: two requests, ``logits``
        then ``vjp`` of the same images, which reuses the first's forward pass; and the
        classes predicted."""
        g = output_gradient(self.logits(pixels))
        found = self._ask("vjp", pixels, output_gradient=g, again=True)
        gradient = numpy.fromfile(os.path.join(self.work, ROBUST_FILES["vjp"]), dtype=numpy.float64)
        return gradient.reshape(pixels.shape).astype(pixels.dtype), _classes(found)

    def predict(self, pixels):
        return _classes(self._ask("predict", pixels))

    def loss(self, pixels, labels):
        return float(self._ask("loss", pixels, labels)["loss"])

    def losses(self, pixels, labels):
        """Each image's loss, in one request (the gradient check's 65 images: one call to the
        harness instead of 65, each of which writes and reads its files)."""
        self._ask("losses", pixels, labels)
        return numpy.fromfile(os.path.join(self.work, ROBUST_FILES["losses"]), dtype=numpy.float64)

    # -- migration: the trained model as a layer list, read from th ------------------------------
    def logits(self, pixels):
        """The model's LogSoftMax outputs for ``pixels``, through the harness's preprocessing."""
        self._ask("logits", pixels)
        found = numpy.fromfile(os.path.join(self.work, ROBUST_FILES["logits"]), dtype=numpy.float64)
        return found.reshape(len(pixels), -1)

    def export_layers(self, pixels):
        """The script's preprocessing and trained model as a layer list
        (``orchestrator/checks/onnx_layers.py``): the harness writes the trained modules and the
        preprocessing's constants (``layers`` request); they become, after the preprocessing
        the harness rebuilds (``MNIST_PREPROCESSING``, ``cifar_preprocessing``), conv
        (SpatialConvolutionMM's nOut x (nIn kH kW) weight as nOut x nIn x kH x kW; a
        SpatialConvolutionMap's connection table as the dense weight of the same
        cross-correlation), pool, flatten, dense and the activations, in the script's tensor
        type.  A module of another kind is a reason (``NoExport``)."""
        from dlbench_runner.migration import NoExport
        self._finished()
        folder = os.path.join(self.work, "layers")
        os.makedirs(folder, exist_ok=True)
        self.proc.stdin.write(b"layers " + folder.encode() + b"\n")
        self.proc.stdin.flush()
        found = self._next_event()
        if found["event"] == "unavailable":
            raise NoExport("Lua Torch7 harness: %s" % found.get("reason"))
        if found["event"] != "layers":
            raise ScriptError("expected layers from the harness, got %s" % found)
        with open(os.path.join(folder, "layers.json")) as f:
            described = json.load(f)
        dtype = TENSOR_DTYPES.get(self.finish.get("tensor_type"))
        if dtype is None:
            raise NoExport("Lua Torch7's model is %s, not float32 or float64" % self.finish.get("tensor_type"))

        def array(prefix, name, shape):
            path = os.path.join(folder, "%s.%s" % (prefix, name))
            return numpy.fromfile(path, dtype=numpy.float64).reshape(shape).astype(dtype)

        if self.ctx.dataset == "mnist":
            mean, std = float(described["mean"]), float(described["std"])
            layers = [{"op": "affine", "scale": 255.0}, {"op": "reshape", "shape": [1, 28, 28]},
                      {"op": "pad", "pads": [2, 2, 2, 2]},
                      {"op": "affine", "scale": 1.0 / std, "shift": -mean / std}]
        else:
            normalization = described["normalization"]
            if normalization["type"] != "nn.SpatialContrastiveNormalization" \
                    or normalization.get("nInputPlane") != 1 or len(normalization.get("kernel", [])) != 1:
                raise NoExport("Lua Torch7's CIFAR-10 normalization is %s, not a SpatialContrastiveNormalization "
                               "of one plane with a 1-D kernel" % normalization["type"])
            layers = cifar_preprocessing(described, array("normalization", "kernel", normalization["kernel"]),
                                         dtype)
        for index, module in enumerate(described["modules"], start=1):
            kind = module["type"]
            pads = [module.get("padH", 0), module.get("padW", 0)] * 2
            if kind in ("nn.SpatialConvolutionMM", "nn.SpatialConvolution"):
                shape = (module["nOutputPlane"], module["nInputPlane"], module["kH"], module["kW"])
                layers.append({"op": "conv", "weight": array(index, "weight", module["weight"]).reshape(shape),
                               "bias": array(index, "bias", module["bias"]),
                               "stride": [module["dH"], module["dW"]], "pads": pads})
            elif kind == "nn.SpatialConvolutionMap":
                # each row of its connection table (input plane, output plane, from 1) one
                # kernel: the dense weight of the same cross-correlation, zero off the table
                kernels = array(index, "weight", module["weight"])
                table = array(index, "connTable", module["connTable"]).astype(numpy.int64) - 1
                weight = numpy.zeros((module["nOutputPlane"], module["nInputPlane"]) + kernels.shape[1:], dtype)
                for (plane, out), kernel in zip(table, kernels):
                    weight[out, plane] += kernel
                layers.append({"op": "conv", "weight": weight, "bias": array(index, "bias", module["bias"]),
                               "stride": [module["dH"], module["dW"]]})
            elif kind == "nn.SpatialMaxPooling":
                layers.append({"op": "pool", "mode": "max", "kernel": [module["kH"], module["kW"]],
                               "stride": [module["dH"], module["dW"]], "pads": pads,
                               "ceil": bool(module.get("ceil_mode", False))})
            elif kind == "nn.Linear":
                layers.append({"op": "dense", "weight": array(index, "weight", module["weight"]),
                               "bias": array(index, "bias", module["bias"])})
            elif kind in PLAIN_MODULES:
                layers.append({"op": PLAIN_MODULES[kind]})
            else:
                raise NoExport("Lua Torch7's %s has no layer kind in the layer list yet" % kind)
        return layers

    def _ask(self, request, pixels, labels=None, output_gradient=None, again=False):
        """One robustness request of the harness's: the pixels (float64) and labels (uint8),
        or the output gradient (float64), written as raw files in its working directory,
        named relative to it; its answer, or NoInputGradient with its reason where it cannot
        rebuild the script's preprocessing.  ``again``: the pixels are those of the
        ``logits`` request just before (``-``: the harness reuses its forward pass)."""
        self._finished()
        names = ["-" if again else self._write_raw("pixels", pixels, numpy.float64)]
        if labels is not None:
            names.append(self._write_raw("labels", labels, numpy.uint8))
        if output_gradient is not None:
            names.append(self._write_raw("output_gradient", output_gradient, numpy.float64))
        if request in ("gradient", "losses", "logits", "vjp"):
            names.append(ROBUST_FILES[request])
        line = " ".join([request, str(len(pixels))] + names)
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        found = self._next_event()
        if found["event"] == "unavailable":
            raise NoInputGradient("Lua Torch7 harness: %s" % found.get("reason"))
        if found["event"] != ROBUST_ANSWERS[request]:
            raise ScriptError("expected %s from the harness, got %s" % (ROBUST_ANSWERS[request], found))
        return found

    def _write_raw(self, kind, array, dtype):
        name = ROBUST_FILES[kind]
        numpy.ascontiguousarray(array, dtype=dtype).tofile(os.path.join(self.work, name))
        return name

    # -- describe: the script's own totals, then th's exit ---------------------------------------
    def describe(self):
        self._finished()
        self.proc.stdin.close()
        for line in self.proc.stdout:
            sys.stdout.buffer.write(line)
        code = self.proc.wait()
        if code != 0:
            raise ScriptError("th exited with %d after the script" % code)
        torch7 = _pinned_commit("torch/torch7")
        return {
            "framework_version": "torch7@%s %s" % (torch7, self.finish["jit"]),
            "param_count": self.finish["param_count"],
            "param_bytes": (self.finish["param_count"] * self.finish["param_element_size"]
                            if self.finish.get("param_element_size") else None),
            "device_name": self.finish.get("gpu_name"),
            "paper_train_time_s": self.finish["train_time"],
            "paper_test_time_s": self.finish["last_test_time"],
            "periodic": {"test_passes": self.finish["test_passes"],
                         "test_time_sum_s": self.finish["test_time"]},
            "script": {"path": SCRIPTS[self.ctx.dataset], "options": self._script_options(),
                       "sgd_config_is_penlight": self.finish.get("sgd_config_is_penlight"),
                       "masked_maps": self.finish.get("masked_maps"),
                       "normalisation": self.finish.get("normalisation")},
            "threads": {"requested": self.ctx.threads,
                        "framework": {"torch.getnumthreads": self.finish["threads"]}},
            "blas_paths": self.finish["blas"],      # Lua's process trains, not this one
            "libraries": {"numpy": numpy.__version__, "luajit": self.finish["jit"],
                          "tensor_type": self.finish["tensor_type"], "th_blas": self.finish["blas"],
                          "sources": _pins()},
        }


def cifar_preprocessing(described, kernel, dtype):
    """train-on-cifar-10.lua's preprocessing as the harness rebuilds it, as layers: the
    bytes, image.rgb2yuv (a 1 x 1 convolution), the script's SpatialContrastiveNormalization
    on Y (its kernel, threshold and thresval), U and V add(-mean), then the product with
    -1 / std (the script's div(-std)) with the training set's statistics."""
    normalization = described["normalization"]
    shift = numpy.array([0.0, -described["mean_u"], -described["mean_v"]], dtype).reshape(3, 1, 1)
    scale = numpy.array([1.0, -1.0 / described["std_u"], -1.0 / described["std_v"]], dtype).reshape(3, 1, 1)
    return [{"op": "affine", "scale": 255.0},
            {"op": "conv", "weight": numpy.array(described["rgb_to_yuv"], dtype).reshape(3, 3, 1, 1)},
            {"op": "contrast", "channel": 0, "kernel": kernel,
             "threshold": float(normalization["threshold"]), "value": float(normalization["thresval"])},
            {"op": "affine", "shift": shift},
            {"op": "affine", "scale": scale}]


def _classes(answer):
    return numpy.array(answer["predicted"], dtype=numpy.int64)


def _number(value):
    return float("nan") if value is None else float(value)


def _tmpdir():
    import tempfile
    return tempfile.mkdtemp(prefix="dlbench-torch7-")


def _pins():
    """owner/repo -> commit, as the image was built (its SOURCE_PINS build argument)."""
    try:
        with open(SOURCE_PINS) as f:
            entries = f.read().split()
    except OSError:
        return {}
    return dict(entry.split(":")[0].split("@") for entry in entries)


def _pinned_commit(repo):
    return _pins().get(repo, "unknown")
