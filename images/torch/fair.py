"""The fair profile in Lua Torch7 (``dlbench_runner/fair.py`` says what is the same
everywhere): ``dlbench_fair.lua`` builds the network in nn and trains it in ``th``; this
side writes its inputs as raw files, asks for each phase and reads its events (see the Lua
program's header for the requests, the layouts and the step).  The per-step events carry
each step's loss and right predictions, as every other framework's adapter reports them.

Threads: TH runs its loops with OpenMP and calls BLAS inside them (SpatialConvolutionMM
unfolds and multiplies each image of a batch in an OpenMP loop), and the image's default
BLAS, OpenBLAS's pthreads build, starts its own pool as well: two pools of the job's
thread count on the same CPUs oversubscribe them (the fair LeNet trained in 565 s on two
CPUs, against 35 s for Caffe on the same OpenBLAS).  So TH's OpenMP threads are one
unless ``omp_threads`` says otherwise, and BLAS keeps the job's threads, the layout every
other framework here has (one pool, of the job's size, doing the products).
"""

import json
import os

import numpy

from dlbench_adapter import HERE, Adapter, _pinned_commit, _tmpdir
from dlbench_runner import fair as networks


class Fair(Adapter):

    def setup(self):
        ctx = self.ctx
        if ctx.gpu is not None:
            raise ValueError("the fair profile runs Lua Torch7 on the CPU only here")
        self.work = os.environ.get("DLBENCH_TORCH7_WORK") or _tmpdir()
        self.data = data = ctx.fair_data()
        arrays = data.arrays
        mnist = ctx.dataset == "mnist"
        shape = (-1,) + tuple(data.network["input"])
        config = {
            "network": data.network, "learning_rate": data.learning_rate, "momentum": data.momentum,
            "threads": ctx.hp.get("omp_threads") or 1, "probe_images": len(data.probe_x),
            "probe_out": os.path.join(self.work, "probe.f32"),
            "train_x": self._raw("train_x.u8", arrays["train_images"].reshape(shape), numpy.uint8),
            "test_x": self._raw("test_x.u8", arrays["test_images"].reshape(shape), numpy.uint8),
            "train_y": self._raw("train_y.i32", data.train_y, numpy.int32),
            "test_y": self._raw("test_y.i32", data.test_y, numpy.int32),
            "order": self._raw("order.i32", data.order, numpy.int32),
            "weights": {}}
        if mnist:
            config["scale"] = networks.MNIST_SCALE
        else:
            config["means"] = list(networks.CIFAR10_MEANS)
        for name, array in ctx.fair_weights().items():
            layer, kind = name.split(".")
            config["weights"].setdefault(layer, {})[kind] = self._raw(name + ".f32", array, numpy.float32)
        path = os.path.join(self.work, "dlbench-fair.json")
        with open(path, "w") as f:
            json.dump(config, f)
        command = ["th", os.path.join(HERE, "dlbench_fair.lua"), path]
        print("dlbench torch7: " + " ".join(command), flush=True)
        import subprocess
        self.proc = subprocess.Popen(command, cwd=self.work, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._ask("probe")
        self._expect("probed")
        probe = numpy.fromfile(config["probe_out"], dtype=numpy.float32).reshape(len(data.probe_x), -1)
        ctx.fair_logits(probe)

    def _raw(self, name, array, dtype):
        path = os.path.join(self.work, name)
        numpy.ascontiguousarray(array, dtype=dtype).tofile(path)
        return {"path": path, "shape": list(array.shape)}

    def _ask(self, request):
        self.proc.stdin.write(request.encode() + b"\n")
        self.proc.stdin.flush()

    def train(self):
        ctx, steps = self.ctx, self.data.steps
        ctx.epoch_start()
        self._ask("train")
        for step in range(steps):
            event = self._expect("step", step=step)
            ctx.fair_step(step, event["loss"], event["correct"])
        self._expect("trained")
        ctx.fair_trained(steps)

    def test(self):
        self._ask("test")
        scores = self._expect("tested")
        return {"accuracy": scores["correct"] / len(self.data.test_y), "loss": scores["loss"]}

    def op_times(self, spec, weights, x, g, input_grad, repeats, warmup):
        """A layer's (or the network's) passes timed in ``th`` (``ops.py``; the Lua program's
        ``time_op``): the initial weights are those the program read at setup, ``weights``'
        own.  nn's backward computes the input's gradient of every layer, the first's too,
        as Torch7's training does: ``input_grad`` changes nothing here."""
        op = {"layers": spec["layers"], "flat": len(spec["input"]) == 1,
              "x": self._raw("op_x.f32", x, numpy.float32), "g": self._raw("op_g.f32", g, numpy.float32),
              "repeats": repeats, "warmup": warmup}
        path = os.path.join(self.work, "op.json")
        with open(path, "w") as f:
            json.dump(op, f)
        self._ask("op " + path)
        times = self._expect("timed")
        return times["forward"], times["forward_backward"]

    def save(self, folder):
        path = os.path.join(folder, "fair.t7")
        self._ask("save " + path)
        self._expect("saved", path=path)

    def describe(self):
        self._ask("finish")
        finish = self._expect("finish")
        self.proc.stdin.close()
        code = self.proc.wait()
        if code != 0:
            raise RuntimeError("th exited with %d after the fair network" % code)
        return {
            "framework_version": "torch7@%s %s" % (_pinned_commit("torch/torch7"), finish["jit"]),
            "param_count": finish["param_count"], "param_bytes": finish["param_count"] * 4,
            "device_name": None,
            "threads": {"requested": self.ctx.threads, "framework": {"torch.getnumthreads": finish["threads"]}},
            "blas_paths": finish["blas"],       # Lua's process trains, not this one
        }
