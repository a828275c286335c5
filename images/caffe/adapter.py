"""Caffe adapter: the BVLC example models, trained by Caffe's own SGD solver.

The nets are the examples' train/test prototxt layer for layer, with the LMDB
``Data`` layers replaced by ``Input`` layers that this adapter fills from the
numpy arrays before every ``solver.step(1)``.  The data are fed as the Data
layer reads its LMDB: records in the order they were converted (the order of
the original files), one batch after the other, wrapping around at the end,
and transformed as its ``transform_param`` says (MNIST: scale 1/256; CIFAR-10:
minus the training set's mean image, as ``compute_image_mean`` makes it).

cifar10_quick is trained by ``train_quick.sh`` in two runs: 4000 iterations
at lr 0.001, then resumed from that snapshot (weights and momentum history)
with lr 0.0001 up to iteration 5000.  Here the second run is the same solver
continuing with a ``multistep`` policy whose single step at ``max_iter`` sets
the rate to ``learning_rate_lr1``; the resumed data layer starts again at the
first record, which is where the wrap-around stands after 8 whole epochs.

The solvers' periodic work is done as Caffe's ``Solver::Step`` and ``Solve``
do it, when the hyper-parameters ask for it (the ``paper`` profile; ``quick``
switches it off): a test pass of ``test_iter`` batches of the TEST net before
every iteration that is a multiple of ``test_interval`` (iteration 0 too:
``test_initialization``'s default) and after the last iteration of each run;
``solver.snapshot()`` (weights and solver state, Caffe's binary proto) after
every multiple of the run's ``snapshot`` interval, and after its last iteration
unless one was just written (``snapshot_after_train``).  The test net shares the
trained weights, as the solver's own test nets do, and reads the test set from
where its last pass stopped, as the test Data layer reads its LMDB (from the
first record again when the second run starts).  This work goes into
``ctx.train_excluded_s``, out of ``train_time_s``; the span of the whole solve,
with it inside, is ``paper_train_time_s`` (paper profile).
"""

import os
import tempfile
import time

from dlbench_runner import blas, contract

# Before caffe is imported: glog writes errors only, to stderr, and no files.
os.environ.setdefault("GLOG_minloglevel", "2")
os.environ.setdefault("GLOG_logtostderr", "1")

DEBIAN_VERSION = "1.0.0+git20180821.99bd997-8+b2"
DEBIAN_SOURCE_VERSION = "1.0.0+git20180821.99bd997-8"


# -- prototxt ---------------------------------------------------------------------
class Enum(str):
    """A protobuf enum value (MAX, CPU), written bare."""


def _value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Enum):
        return str(v)
    if isinstance(v, str):
        return '"%s"' % v
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _text(fields, indent=0):
    """Protobuf text format from a list of (key, value) pairs; a list value is a message."""
    pad = "  " * indent
    lines = []
    for key, value in fields:
        if isinstance(value, list):
            lines.append("%s%s {" % (pad, key))
            lines.append(_text(value, indent + 1))
            lines.append("%s}" % pad)
        else:
            lines.append("%s%s: %s" % (pad, key, _value(value)))
    return "\n".join(line for line in lines if line)


def _input(batch, shape, top="data"):
    dims = [("dim", d) for d in (batch,) + tuple(shape)]
    return [("layer", [("name", top), ("type", "Input"), ("top", top), ("top", "label"),
                       ("input_param", [("shape", dims), ("shape", [("dim", batch)])])])]


def pixel_input(batch, shape, mean, scale):
    """The robustness check's input layers: [0, 1] pixels (of the model's ``shape``) and
    labels, then the Data layer's transform_param as layers, so that Caffe's backward
    reaches the pixels: a Power layer back to the bytes' scale (x 255), with ``mean`` a
    Bias layer whose blob is the negated mean image (set once the net is made), with
    ``scale`` a Power layer; the last one's top is the model's ``data``."""
    steps = [("bytes", "Power", "power_param", [("scale", 255.0)])]
    if mean:
        steps.append(("mean", "Bias", "bias_param", [("axis", 1), ("num_axes", len(shape))]))
    if scale is not None:
        steps.append(("scale", "Power", "power_param", [("scale", float(scale))]))
    layers, bottom = _input(batch, shape, "pixels"), "pixels"
    for i, (name, kind, param, options) in enumerate(steps):
        top = "data" if i == len(steps) - 1 else name
        layers += [("layer", [("name", name), ("type", kind), ("bottom", bottom), ("top", top),
                              (param, options)])]
        bottom = top
    return layers


def _learnable(name, kind, bottom, num_output, filler, **conv):
    """A Convolution or InnerProduct layer: weights lr_mult 1, biases lr_mult 2,
    constant (0) bias filler, as in every layer of both examples."""
    options = [("num_output", num_output)] + [(k, v) for k, v in conv.items()]
    options += [("weight_filler", filler), ("bias_filler", [("type", "constant")])]
    param_name = "convolution_param" if kind == "Convolution" else "inner_product_param"
    return [("layer", [("name", name), ("type", kind), ("bottom", bottom), ("top", name),
                       ("param", [("lr_mult", 1)]), ("param", [("lr_mult", 2)]),
                       (param_name, options)])]


def _pool(name, bottom, pool, kernel, stride):
    return [("layer", [("name", name), ("type", "Pooling"), ("bottom", bottom), ("top", name),
                       ("pooling_param", [("pool", Enum(pool)), ("kernel_size", kernel),
                                          ("stride", stride)])])]


def _relu(name, blob):
    return [("layer", [("name", name), ("type", "ReLU"), ("bottom", blob), ("top", blob)])]


def _head(phase):
    """The loss, and the accuracy in the TEST phase; in the ATTACK phase (the robustness
    check's net, made as a TEST net) the loss summed over the batch (normalization NONE)
    and back-propagated to the input too (force_backward: an Input layer's top gets no
    diff otherwise)."""
    layers = []
    if phase == "TEST":   # both examples compute accuracy in the TEST phase only
        layers += [("layer", [("name", "accuracy"), ("type", "Accuracy"), ("bottom", "ip2"),
                              ("bottom", "label"), ("top", "accuracy")])]
    loss = [("name", "loss"), ("type", "SoftmaxWithLoss"), ("bottom", "ip2"),
            ("bottom", "label"), ("top", "loss")]
    if phase == "ATTACK":
        loss.append(("loss_param", [("normalization", Enum("NONE"))]))
        layers.append(("force_backward", True))
    return layers + [("layer", loss)]


def lenet(batch, phase, inputs=None):
    """examples/mnist/lenet_train_test.prototxt (``inputs``: other input layers than its
    data and labels, the robustness check's)."""
    xavier = [("type", "xavier")]
    layers = inputs or _input(batch, (1, 28, 28))
    layers += _learnable("conv1", "Convolution", "data", 20, xavier, kernel_size=5, stride=1)
    layers += _pool("pool1", "conv1", "MAX", 2, 2)
    layers += _learnable("conv2", "Convolution", "pool1", 50, xavier, kernel_size=5, stride=1)
    layers += _pool("pool2", "conv2", "MAX", 2, 2)
    layers += _learnable("ip1", "InnerProduct", "pool2", 500, xavier)
    layers += _relu("relu1", "ip1")
    layers += _learnable("ip2", "InnerProduct", "ip1", 10, xavier)
    return _text([("name", "LeNet")] + layers + _head(phase)) + "\n"


def cifar10_quick(batch, phase, inputs=None):
    """examples/cifar10/cifar10_quick_train_test.prototxt (``inputs`` as lenet's)."""
    def gaussian(std):
        return [("type", "gaussian"), ("std", std)]
    conv = dict(pad=2, kernel_size=5, stride=1)
    layers = inputs or _input(batch, (3, 32, 32))
    layers += _learnable("conv1", "Convolution", "data", 32, gaussian(0.0001), **conv)
    layers += _pool("pool1", "conv1", "MAX", 3, 2)
    layers += _relu("relu1", "pool1")
    layers += _learnable("conv2", "Convolution", "pool1", 32, gaussian(0.01), **conv)
    layers += _relu("relu2", "conv2")
    layers += _pool("pool2", "conv2", "AVE", 3, 2)
    layers += _learnable("conv3", "Convolution", "pool2", 64, gaussian(0.01), **conv)
    layers += _relu("relu3", "conv3")
    layers += _pool("pool3", "conv3", "AVE", 3, 2)
    layers += _learnable("ip1", "InnerProduct", "pool3", 64, gaussian(0.1))
    layers += _learnable("ip2", "InnerProduct", "ip1", 10, gaussian(0.1))
    return _text([("name", "CIFAR10_quick")] + layers + _head(phase)) + "\n"


NETS = {"mnist": lenet, "cifar10": cifar10_quick}
# The solvers' snapshot_prefix, in a scratch directory of the job (the root file system
# is read-only): lenet_solver.prototxt's, cifar10_quick_solver*.prototxt's.
SNAPSHOT_PREFIX = {"mnist": "mnist_lenet", "cifar10": "cifar10"}


def schedule(hp):
    """The solvers' periodic work, placed as Caffe's ``Solver::Step`` and ``Solve`` place
    it in each ``caffe train`` run: ``(before, after)``, each {iteration: ["test" or
    "snapshot", ...]}: the work before the training step of that iteration, and after
    the step that ends at it.  LeNet trains in one run; cifar10_quick in two, the
    second resumed at ``max_iter`` with its own ``snapshot_lr1`` interval."""
    total = max(hp["max_iter"], hp.get("max_iter_lr1", 0))
    runs = [(hp["max_iter"], hp["snapshot"])]
    if total > hp["max_iter"]:
        runs.append((total, hp.get("snapshot_lr1", 0)))
    interval, before, after, first = hp["test_interval"], {}, {}, 0
    for last, every in runs:
        for it in range(first, last):   # Step(); test_initialization's default tests at 0
            if interval and it % interval == 0:
                before.setdefault(it, []).append("test")
            if every and (it + 1) % every == 0:
                after.setdefault(it + 1, []).append("snapshot")
        # the end of Solve(): a snapshot unless one was just written, then a test pass
        if hp["snapshot_after_train"] and (not every or last % every):
            after.setdefault(last, []).append("snapshot")
        if interval and last % interval == 0:
            after.setdefault(last, []).append("test")
        first = last
    return before, after


def _pair(single, repeated, h, w, default):
    """A Caffe spatial parameter: ``kernel_h``/``kernel_w`` where set, else the one or
    two values of its repeated (or single) field, else ``default``."""
    if h or w:
        return [int(h), int(w)]
    values = [int(v) for v in (repeated if repeated is not None else ([single] if single else []))]
    if not values:
        return [default, default]
    return values * 2 if len(values) == 1 else values[:2]


def caffe_layers(np, spec, params, first, last):
    """The layer list (``orchestrator/checks/onnx_layers.py``) of a chain of Caffe layers in
    ``spec`` (a NetParameter) from the blob ``first`` to the blob ``last``, with the
    trained ``params`` (net.params).  The kinds these nets use; another, or an option
    the list cannot say, is ``NoExport``."""
    from dlbench_runner.migration import NoExport
    layers, blob, flat = [], first, False
    for layer in spec.layer:
        if layer.type == "Input" or blob == last:
            continue
        if list(layer.bottom) != [blob] or len(layer.top) != 1:
            raise NoExport("Caffe layer %s is not in a chain from %s" % (layer.name, first))
        blobs = [b.data.copy() for b in params[layer.name]] if layer.name in params else []
        kind = layer.type
        if kind == "Power":
            p = layer.power_param
            if p.power != 1:
                raise NoExport("Caffe layer %s raises to a power" % layer.name)
            layers.append({"op": "affine", "scale": float(p.scale), "shift": float(p.shift)})
        elif kind == "Bias" and layer.bias_param.axis == 1 and len(blobs) == 1:
            # the blob over axes 1.., broadcast over the rest (a mean image: all of them)
            layers.append({"op": "affine", "shift": blobs[0]})
        elif kind == "Convolution":
            p = layer.convolution_param
            if any(d != 1 for d in p.dilation) or p.axis != 1:
                raise NoExport("Caffe layer %s: dilated or not over axis 1" % layer.name)
            ph, pw = _pair(None, p.pad, p.pad_h, p.pad_w, 0)
            layers.append({"op": "conv", "weight": blobs[0], "bias": blobs[1] if p.bias_term else None,
                           "stride": _pair(None, p.stride, p.stride_h, p.stride_w, 1),
                           "pads": [ph, pw, ph, pw], "group": int(p.group)})
        elif kind == "Pooling":
            p = layer.pooling_param
            if p.global_pooling or p.pool not in (p.MAX, p.AVE):
                raise NoExport("Caffe layer %s: global or stochastic pooling" % layer.name)
            kernel = _pair(p.kernel_size, None, p.kernel_h, p.kernel_w, 0)
            stride = _pair(p.stride, None, p.stride_h, p.stride_w, 1)
            ph, pw = _pair(p.pad, None, p.pad_h, p.pad_w, 0)
            # Caffe 1.0 rounds pooled sizes up; later versions have round_mode (CEIL = 0)
            ceil = getattr(p, "round_mode", 0) == 0
            if ceil and not (ph or pw) and any(s > k for s, k in zip(stride, kernel)):
                raise NoExport("Caffe layer %s: strides past the kernel without padding make windows "
                               "past the input" % layer.name)
            layers.append({"op": "pool", "mode": "max" if p.pool == p.MAX else "avg", "kernel": kernel,
                           "stride": stride, "pads": [ph, pw, ph, pw], "ceil": ceil, "divisor": "padded"})
        elif kind == "InnerProduct":
            p = layer.inner_product_param
            if p.axis != 1 or p.transpose:
                raise NoExport("Caffe layer %s: not over axis 1, or transposed" % layer.name)
            if not flat:
                layers.append({"op": "flatten"})
                flat = True
            layers.append({"op": "dense", "weight": blobs[0], "bias": blobs[1] if p.bias_term else None})
        elif kind == "ReLU" and layer.relu_param.negative_slope == 0:
            layers.append({"op": "relu"})
        elif kind in ("TanH", "Sigmoid", "Softmax"):
            layers.append({"op": kind.lower()})
        else:
            raise NoExport("Caffe layer %s (%s) has no form in dlbench's layer list" % (layer.name, kind))
        blob = layer.top[0]
    if blob != last:
        raise NoExport("the Caffe net's chain from %s does not reach %s" % (first, last))
    return layers


class Adapter:
    def __init__(self, ctx):
        self.ctx = ctx
        self.hp = ctx.hp

    # -- setup ---------------------------------------------------------------
    def setup(self):
        import numpy as np
        import caffe
        self.np, self.caffe = np, caffe
        if self.ctx.dataset not in NETS:
            raise ValueError("no caffe model for %s" % self.ctx.dataset)
        self.cudart = Cudart.loaded()
        self.gpu = self._select_device()
        caffe.set_random_seed(self.ctx.seed)

        arrays = self.ctx.load_data()
        self.train_x, self.train_y = arrays["train_images"], arrays["train_labels"]
        self.test_x, self.test_y = arrays["test_images"], arrays["test_labels"]
        if self.ctx.dataset == "mnist":
            # transform_param { scale: 0.00390625 }
            self.mean, self.scale = None, np.float32(0.00390625)
            self.train_x, self.test_x = self.train_x[:, None], self.test_x[:, None]
        else:
            # transform_param { mean_file: mean.binaryproto }: the per-pixel,
            # per-channel mean of the training set, as compute_image_mean makes it.
            self.mean = self.train_x.mean(axis=0, dtype=np.float64).astype(np.float32)
            self.scale = None

        hp = self.hp
        self.workdir = tempfile.mkdtemp(prefix="dlbench-caffe-")
        build = NETS[self.ctx.dataset]
        train_net = os.path.join(self.workdir, "train.prototxt")
        self.test_net_path = os.path.join(self.workdir, "test.prototxt")
        with open(train_net, "w") as f:
            f.write(build(hp["batch_size"], "TRAIN"))
        with open(self.test_net_path, "w") as f:
            f.write(build(hp["test_batch_size"], "TEST"))

        self.max_iter = self._total_iterations()
        solver = [("train_net", train_net), ("type", "SGD"),
                  ("base_lr", float(hp["learning_rate"])), ("momentum", float(hp["momentum"])),
                  ("weight_decay", float(hp["weight_decay"])), ("max_iter", self.max_iter)]
        solver += self._policy()
        # Caffe's own test passes and snapshots stay off: train() makes them (timed apart).
        self.snapshot_dir = os.path.join(self.workdir, "snapshot")
        os.mkdir(self.snapshot_dir)
        solver += [("display", 0), ("snapshot", 0), ("snapshot_after_train", False),
                   ("snapshot_prefix", os.path.join(self.snapshot_dir,
                                                    SNAPSHOT_PREFIX[self.ctx.dataset])),
                   ("solver_mode", Enum("CPU" if self.gpu is None else "GPU")),
                   ("random_seed", self.ctx.seed)]
        solver_path = os.path.join(self.workdir, "solver.prototxt")
        with open(solver_path, "w") as f:
            f.write(_text(solver) + "\n")
        self.solver = caffe.SGDSolver(solver_path)
        n = len(self.train_y)
        self.ctx.planned_epochs = self.max_iter * hp["batch_size"] / n

        self.test_passes, self.snapshots, self.solve_s = [], [], None
        self.test_net, self.test_cursor = None, 0
        self.attack_net = None          # the robustness check's, made after training
        if hp["test_interval"]:
            self.test_net = caffe.Net(self.test_net_path, caffe.TEST)
            self.solver.share_weights(self.test_net)

    def _select_device(self):
        """The CPU, or the job's GPU on a CUDA build; returns the GPU index or None.
        Caffe aborts the process (glog FATAL) when a CPU_ONLY build is asked for a GPU
        or a CUDA build for a GPU that does not exist, so both are checked first."""
        caffe, device, index = self.caffe, self.ctx.device, self.ctx.gpu
        if index is None:
            caffe.set_mode_cpu()
            return None
        if self.cudart is None:
            raise ValueError("device %r: this image's caffe is a CPU_ONLY build (Debian's "
                             "python3-caffe), without CUDA" % device)
        count = self.cudart.device_count()
        if index >= count:
            raise ValueError("device %r: CUDA sees %d GPU(s)" % (device, count))
        caffe.set_device(index)
        caffe.set_mode_gpu()
        return index

    def synchronize(self):
        """On a GPU, wait for the kernels Caffe has queued (cudaDeviceSynchronize)."""
        if getattr(self, "gpu", None) is not None:
            self.cudart.synchronize()

    def _total_iterations(self):
        hp = self.hp
        return max(hp["max_iter"], hp.get("max_iter_lr1", 0))

    def _policy(self):
        """The solver's lr_policy fields; cifar10_quick's lr1 phase as one multistep."""
        hp = self.hp
        if hp.get("max_iter_lr1", 0) > hp["max_iter"]:
            if hp.get("lr_policy", "fixed") != "fixed":
                raise ValueError("a second (lr1) phase needs lr_policy 'fixed'")
            return [("lr_policy", "multistep"), ("stepvalue", hp["max_iter"]),
                    ("gamma", float(hp["learning_rate_lr1"]) / float(hp["learning_rate"]))]
        policy = hp.get("lr_policy", "fixed")
        fields = [("lr_policy", policy)]
        for key in ("gamma", "power", "stepsize"):
            if key in hp:
                fields.append((key, hp[key]))
        return fields

    def _inputs(self, images):
        """One batch as the Data layer's transformer makes it (float32, NCHW)."""
        x = images.astype(self.np.float32)
        if self.mean is not None:
            x -= self.mean
        if self.scale is not None:
            x *= self.scale
        return x

    # -- train ---------------------------------------------------------------
    def train(self):
        np, hp, ctx = self.np, self.hp, self.ctx
        batch, n = hp["batch_size"], len(self.train_y)
        net = self.solver.net
        data, label = net.blobs["data"], net.blobs["label"]
        scores, loss_blob = net.blobs["ip2"], net.blobs["loss"]
        before, after = schedule(hp)
        resume = hp["max_iter"] if self.max_iter > hp["max_iter"] else None
        epoch, loss_sum, correct, seen = 1, 0.0, 0, 0
        ctx.epoch_start()
        solve_start = time.perf_counter()
        for it in range(self.max_iter):
            if it == resume:    # a new caffe train: its test Data layer opens at the first record
                self.test_cursor = 0
            for work in before.get(it, ()):
                self._periodic(work, it)
            start = it * batch
            # An iteration belongs to the epoch in which its batch starts.
            if start // n + 1 != epoch:
                ctx.epoch_done(epoch, loss_sum / seen, correct / seen, samples=seen)
                epoch, loss_sum, correct, seen = start // n + 1, 0.0, 0, 0
                ctx.epoch_start()
            index = np.arange(start, start + batch) % n      # sequential, wrapping around
            y = self.train_y[index]
            data.data[...] = self._inputs(self.train_x[index])
            label.data[...] = y
            self.solver.step(1)
            loss = float(loss_blob.data)
            loss_sum += loss * batch
            correct += int((scores.data.argmax(axis=1) == y).sum())
            seen += batch
            ctx.progress(epoch, (start % n) / n, loss, step=it + 1)
            for work in after.get(it + 1, ()):
                self._periodic(work, it + 1)
        self.solve_s = time.perf_counter() - solve_start
        if seen:
            ctx.epoch_done(epoch, loss_sum / seen, correct / seen, samples=seen)

    def _periodic(self, work, iteration):
        """A test pass or a snapshot inside the solve: timed, and not training."""
        t0 = time.perf_counter()
        record = (self._test_pass if work == "test" else self._snapshot)(iteration)
        record["time_s"] = time.perf_counter() - t0
        self.ctx.train_excluded_s += record["time_s"]

    def _test_pass(self, iteration):
        """Solver::Test: test_iter batches through the TEST net; each output's mean."""
        np, hp = self.np, self.hp
        batch, n, count = hp["test_batch_size"], len(self.test_y), hp["test_iter"]
        net = self.test_net
        data, label = net.blobs["data"], net.blobs["label"]
        accuracy = loss = 0.0
        record = {"iteration": iteration, "first_record": self.test_cursor}
        for _ in range(count):
            index = np.arange(self.test_cursor, self.test_cursor + batch) % n
            self.test_cursor = (self.test_cursor + batch) % n
            data.data[...] = self._inputs(self.test_x[index])
            label.data[...] = self.test_y[index]
            out = net.forward()
            accuracy += float(out["accuracy"])
            loss += float(out["loss"])
        record.update(accuracy=accuracy / count, loss=loss / count)
        self.test_passes.append(record)
        return record

    def _snapshot(self, iteration):
        """Solver::Snapshot: <prefix>_iter_N.caffemodel and .solverstate."""
        self.solver.snapshot()
        record = {"iteration": iteration}
        self.snapshots.append(record)
        return record

    # -- test ----------------------------------------------------------------
    def test(self):
        np, caffe = self.np, self.caffe
        batch, n = self.hp["test_batch_size"], len(self.test_y)
        net = caffe.Net(self.test_net_path, caffe.TEST)
        trained = self.solver.net.params
        for name, blobs in net.params.items():   # the TEST net shares the trained weights
            for mine, theirs in zip(blobs, trained[name]):
                mine.data[...] = theirs.data
        loss_sum, correct, predicted = 0.0, 0.0, []
        for start in range(0, n, batch):
            x, y = self.test_x[start:start + batch], self.test_y[start:start + batch]
            if len(y) != net.blobs["label"].data.shape[0]:   # a last, smaller batch
                net.blobs["data"].reshape(len(y), *x.shape[1:])
                net.blobs["label"].reshape(len(y))
                net.reshape()
            net.blobs["data"].data[...] = self._inputs(x)
            net.blobs["label"].data[...] = y
            out = net.forward()
            loss_sum += float(out["loss"]) * len(y)
            correct += float(out["accuracy"]) * len(y)
            predicted.append(net.blobs["ip2"].data.argmax(axis=1))     # the scores' classes
        return {"accuracy": correct / n, "loss": loss_sum / n,
                "predictions": np.concatenate(predicted) if predicted else None}

    # -- the robustness check: Caffe's backward through the transform to the pixels -----------
    def _attack_net(self, count):
        """The robustness check's net (``pixel_input``, the model, the summed loss), made at
        its first call, after training, sharing the solver's trained weights; reshaped to
        batches of ``count``."""
        caffe = self.caffe
        if self.attack_net is None:
            path = os.path.join(self.workdir, "attack.prototxt")
            inputs = pixel_input(count, self.test_x.shape[1:], self.mean is not None, self.scale)
            with open(path, "w") as f:
                f.write(NETS[self.ctx.dataset](count, "ATTACK", inputs))
            self.attack_net = caffe.Net(path, caffe.TEST)
            self.solver.share_weights(self.attack_net)
            if self.mean is not None:
                self.attack_net.params["mean"][0].data[...] = -self.mean
        net = self.attack_net
        if net.blobs["label"].data.shape[0] != count:
            net.blobs["pixels"].reshape(count, *net.blobs["pixels"].data.shape[1:])
            net.blobs["label"].reshape(count)
            net.reshape()
        return net

    def _forward(self, pixels, labels=None):
        """The attack net's forward pass: to the loss given labels, else to the scores."""
        net = self._attack_net(len(pixels))
        net.blobs["pixels"].data[...] = pixels.reshape(net.blobs["pixels"].data.shape)
        if labels is None:
            net.forward(end="ip2")
        else:
            net.blobs["label"].data[...] = labels
            net.forward()
        return net

    def input_gradient(self, pixels, labels):
        """Caffe's own backward (net.backward) of the summed loss down to the pixels blob,
        through the transform's layers; and the classes predicted (ip2's argmax)."""
        net = self._forward(pixels, labels)
        net.backward()
        return (net.blobs["pixels"].diff.reshape(pixels.shape).copy(),
                net.blobs["ip2"].data.argmax(axis=1))

    def input_vjp(self, pixels, output_gradient):
        """Caffe's own backward from ip2 (the scores) down to the pixels blob, through the
        transform's layers, with ip2's diff set to ``output_gradient(ip2)``: the scores'
        vector-Jacobian product; and the classes predicted."""
        net = self._forward(pixels)
        scores = net.blobs["ip2"]
        net.blobs["ip2"].diff[...] = output_gradient(scores.data.copy())
        net.backward(start="ip2")
        return (net.blobs["pixels"].diff.reshape(pixels.shape).copy(), scores.data.argmax(axis=1))

    def predict(self, pixels):
        return self._forward(pixels).blobs["ip2"].data.argmax(axis=1)

    def loss(self, pixels, labels):
        return float(self._forward(pixels, labels).blobs["loss"].data)

    def logits(self, pixels):
        """The net's scores before the softmax (ip2), float32."""
        return self._forward(pixels).blobs["ip2"].data.copy()

    # -- migration: the trained net as a layer list, for the host's ONNX graph ---------
    def export_layers(self, pixels):
        """The robustness check's net (the Data layer's transform as layers, then the
        model) from its pixels to ip2, read from its own prototxt with the trained
        blobs (``caffe_layers``)."""
        from caffe.proto import caffe_pb2
        from google.protobuf import text_format
        net = self._attack_net(len(pixels))
        spec = caffe_pb2.NetParameter()
        with open(os.path.join(self.workdir, "attack.prototxt")) as f:
            text_format.Merge(f.read(), spec)
        layers = []
        shape = tuple(net.blobs["pixels"].data.shape[1:])
        if shape != tuple(pixels.shape[1:]):        # MNIST: 28 x 28 pixels, a 1 x 28 x 28 blob
            layers.append({"op": "reshape", "shape": list(shape)})
        return layers + caffe_layers(self.np, spec, net.params, "pixels", "ip2")

    # -- save ----------------------------------------------------------------
    def save(self, folder):
        """The trained weights as a .caffemodel (Net::ToProto, binary), the file Caffe's
        users deploy (a snapshot's .solverstate is the solver's, not the model's)."""
        self.solver.net.save(os.path.join(folder, SNAPSHOT_PREFIX[self.ctx.dataset] + ".caffemodel"))

    # -- describe ------------------------------------------------------------
    def describe(self):
        import google.protobuf
        np, caffe = self.np, self.caffe
        params = self.solver.net.params
        cuda = self.cudart
        # The CPU image's caffe is Debian's binary package; the GPU image's is built
        # from Debian's source package of that version (its Dockerfile.gpu).
        version, build = ((DEBIAN_VERSION, "cpu_only") if cuda is None
                          else (DEBIAN_SOURCE_VERSION, "cuda"))
        described = {
            "framework_version": getattr(caffe, "__version__", None) or version,
            "param_count": int(sum(b.data.size for blobs in params.values() for b in blobs)),
            "param_bytes": int(sum(b.data.nbytes for blobs in params.values() for b in blobs)),
            "device_name": None if self.gpu is None else self.cudart.device_name(self.gpu),
            "threads": {"requested": self.ctx.threads,
                        "framework": {"OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
                                      "openblas_get_num_threads": blas.openblas_threads()}},
            "libraries": {"numpy": np.__version__, "protobuf": google.protobuf.__version__,
                          "caffe_debian": version, "caffe_build": build,
                          "cuda": None if cuda is None else self.cudart.runtime_version(),
                          "cudnn": None},
            "periodic": {"test_passes": self.test_passes, "snapshots": self._snapshot_files()},
        }
        if self.ctx.spec["profile"] == contract.PAPER_PROFILE:
            # the log's span of the whole solve; its last test pass, as the log shows it
            described["paper_train_time_s"] = self.solve_s
            described["paper_test_time_s"] = (self.test_passes[-1]["time_s"]
                                              if self.test_passes else None)
        return described

    def _snapshot_files(self):
        """The snapshots with the files Caffe wrote for each (name -> bytes); then the
        files are removed (the scratch directory may be the host's, natively)."""
        names = sorted(os.listdir(self.snapshot_dir))
        for record in self.snapshots:
            mark = "_iter_%d." % record["iteration"]
            record["files"] = {name: os.path.getsize(os.path.join(self.snapshot_dir, name))
                               for name in names if mark in name}
        for name in names:
            os.remove(os.path.join(self.snapshot_dir, name))
        return self.snapshots


class Cudart:
    """The CUDA run-time library that libcaffe is linked against, through ctypes (pycaffe
    has no call to wait for the GPU or to name it).  The library already mapped into the
    process is loaded again by its path, so it is the same instance, with Caffe's
    current device and queued work."""

    PROPERTIES_SIZE = 4096      # more than sizeof(cudaDeviceProp); its name comes first

    def __init__(self, path):
        import ctypes
        self.ctypes, self.path = ctypes, path
        self.library = ctypes.CDLL(path)
        self.library.cudaGetErrorString.restype = ctypes.c_char_p

    @classmethod
    def loaded(cls):
        """The libcudart that caffe brought in, or None (a CPU_ONLY build links none)."""
        paths = blas.mapped("/libcudart.so")
        return cls(paths[0]) if paths else None

    def _check(self, status, call):
        if status != 0:
            raise RuntimeError("%s: %s" % (call, self.library.cudaGetErrorString(status).decode()))

    def device_count(self):
        count = self.ctypes.c_int(0)
        status = self.library.cudaGetDeviceCount(self.ctypes.byref(count))
        return count.value if status == 0 else 0    # no driver or no GPU: none

    def synchronize(self):
        self._check(self.library.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def device_name(self, index):
        properties = self.ctypes.create_string_buffer(self.PROPERTIES_SIZE)
        self._check(self.library.cudaGetDeviceProperties(properties, index),
                    "cudaGetDeviceProperties")
        return properties.raw[:256].split(b"\0", 1)[0].decode()

    def runtime_version(self):
        """Major.minor, as the library says, or (CUDA 11.2's asks the driver first, so
        not without one) as its file name says (libcudart.so.11.2.152)."""
        version = self.ctypes.c_int(0)
        if self.library.cudaRuntimeGetVersion(self.ctypes.byref(version)) == 0:
            return "%d.%d" % (version.value // 1000, version.value % 1000 // 10)
        numbers = os.path.basename(self.path).partition(".so.")[2].split(".")
        return ".".join(numbers[:2]) or None
