"""The fair profile in Caffe (``dlbench_runner/fair.py`` says what is the same everywhere).

Layouts: the neutral file's are Caffe's own. A Convolution blob is (out, in, kH, kW), an
InnerProduct blob (out, in) over its bottom flattened channel by channel, then row, then
column: the weights load as they are.  Pooling is Caffe's, the rule the others follow.
The net is written from ``fair.NETWORKS`` as a prototxt with Input layers; every
parameter has ``lr_mult`` 1 (the examples' doubled bias rate is left out) and the solver
is SGD with the fair momentum, a fixed learning rate and no weight decay: Caffe's ``v =
momentum * v + lr * gradient; w = w - v``.  Each step sets the batch's data and labels and
runs ``solver.step(1)``; its loss is the one that step's forward computed.  Caffe's CPU
path is deterministic (one BLAS call per layer, no atomics).
"""

import os
import tempfile

from dlbench_adapter import Adapter, Cudart, Enum, _input, _relu, _text


def layers(spec):
    """The prototxt layers of the fair network, after the Input layers."""
    found, bottom = [], "data"
    for layer in spec["layers"]:
        name, kind = layer["name"], layer["kind"]
        if kind == "relu":
            found += _relu(name, bottom)
            continue
        if kind == "pool":
            options = [("pool", Enum("MAX" if layer["mode"] == "max" else "AVE")),
                       ("kernel_size", layer["kernel"]), ("stride", layer["stride"])]
            found += [("layer", [("name", name), ("type", "Pooling"), ("bottom", bottom),
                                 ("top", name), ("pooling_param", options)])]
        else:
            if kind == "conv":
                kind_name, param = "Convolution", ("convolution_param", [
                    ("num_output", layer["out"]), ("pad", layer["pad"]),
                    ("kernel_size", layer["kernel"]), ("stride", 1)])
            else:
                kind_name, param = "InnerProduct", ("inner_product_param", [("num_output", layer["out"])])
            found += [("layer", [("name", name), ("type", kind_name), ("bottom", bottom), ("top", name),
                                 ("param", [("lr_mult", 1)]), ("param", [("lr_mult", 1)]), param])]
        bottom = name
    loss = [("name", "loss"), ("type", "SoftmaxWithLoss"), ("bottom", bottom), ("bottom", "label"),
            ("top", "loss")]
    return found + [("layer", loss)], bottom


class Fair(Adapter):

    def setup(self):
        import numpy as np
        import caffe
        self.np, self.caffe = np, caffe
        self.cudart = Cudart.loaded()
        self.gpu = self._select_device()
        self.data = data = self.ctx.fair_data()
        self.workdir = tempfile.mkdtemp(prefix="dlbench-caffe-fair-")
        self.snapshot_dir = os.path.join(self.workdir, "snapshot")     # none: describe() lists it
        os.mkdir(self.snapshot_dir)
        self.test_passes, self.snapshots, self.solve_s = [], [], None
        spec = data.network
        body, self.output = layers(spec)
        net_path = os.path.join(self.workdir, "fair.prototxt")
        with open(net_path, "w") as f:
            f.write(_text([("name", spec["name"])] + _input(data.batch_size, spec["input"]) + body) + "\n")
        solver = [("train_net", net_path), ("type", "SGD"), ("base_lr", float(data.learning_rate)),
                  ("momentum", float(data.momentum)), ("weight_decay", 0.0),
                  ("lr_policy", "fixed"), ("max_iter", data.steps), ("display", 0),
                  ("snapshot", 0), ("snapshot_after_train", False),
                  ("snapshot_prefix", os.path.join(self.snapshot_dir, "fair")),
                  ("solver_mode", Enum("CPU" if self.gpu is None else "GPU"))]
        solver_path = os.path.join(self.workdir, "solver.prototxt")
        with open(solver_path, "w") as f:
            f.write(_text(solver) + "\n")
        self.solver = caffe.SGDSolver(solver_path)
        net = self.solver.net
        for name, array in self.ctx.fair_weights().items():
            layer, kind = name.split(".")
            net.params[layer][0 if kind == "weight" else 1].data[...] = array
        self.ctx.fair_logits(self._forward(data.probe_x))

    def _forward(self, images):
        """The logits of ``images`` with the training net's current weights (reshaped to
        their count, then back to the batch size)."""
        net = self.solver.net
        net.blobs["data"].reshape(*images.shape)
        net.blobs["label"].reshape(len(images))
        net.reshape()
        net.blobs["data"].data[...] = images
        net.blobs["label"].data[...] = 0
        net.forward(end=self.output)
        logits = net.blobs[self.output].data.copy()
        net.blobs["data"].reshape(self.data.batch_size, *images.shape[1:])
        net.blobs["label"].reshape(self.data.batch_size)
        net.reshape()
        return logits

    def train(self):
        data, ctx = self.data, self.ctx
        net = self.solver.net
        images, labels = net.blobs["data"], net.blobs["label"]
        scores, loss = net.blobs[self.output], net.blobs["loss"]
        ctx.epoch_start()
        for step in range(data.steps):
            x, y = data.batch(step)
            images.data[...] = x
            labels.data[...] = y
            self.solver.step(1)
            ctx.fair_step(step, float(loss.data), int((scores.data.argmax(axis=1) == y).sum()))
        ctx.fair_trained(data.steps)

    def op_passes(self, spec, weights, x, g, input_grad):
        """A layer's (or the network's) forward pass in a TRAIN net, and that forward and
        backward pass from ``g`` (``ops.py``) in a second net of the same layers and weights.
        Caffe runs a backward pass only where a loss needs it: the second net's input takes
        its gradient by ``force_backward`` where training's does (``input_grad``); where it
        does not (the first layer, the network) its output is made a loss (``loss_weight``
        1, ``g`` as the loss's weights in its diff), which adds to its forward pass one dot
        product of the output with ``g``."""
        caffe = self.caffe
        body, top = layers(spec)
        body = body[:-1]        # not the SoftmaxWithLoss
        shape = [("shape", [("dim", d) for d in x.shape])]
        head = [("layer", [("name", "data"), ("type", "Input"), ("top", "data"), ("input_param", shape)])]
        if input_grad:
            backward_body = [("force_backward", True)] + head + body
        else:       # the last layer's output a loss, g its weights
            backward_body = head + body[:-1] + [("layer", body[-1][1] + [("loss_weight", 1.0)])]
        nets = []
        for name, text in (("forward", head + body), ("backward", backward_body)):
            path = os.path.join(self.workdir, "op-%s.prototxt" % name)
            with open(path, "w") as f:
                f.write(_text([("name", spec["name"])] + text) + "\n")
            net = caffe.Net(path, caffe.TRAIN)
            for key, array in weights.items():
                layer, kind = key.split(".")
                if layer in net.params:
                    net.params[layer][0 if kind == "weight" else 1].data[...] = array
            net.blobs["data"].data[...] = x
            nets.append(net)
        forward_net, backward_net = nets
        backward_net.blobs[top].diff[...] = g

        def forward_backward():
            backward_net.forward()
            backward_net.backward()
        return forward_net.forward, forward_backward

    def test(self):
        return self.data.test_scores(self._forward)

    def save(self, folder):
        self.solver.net.save(os.path.join(folder, "fair.caffemodel"))
