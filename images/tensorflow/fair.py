"""The fair profile in TensorFlow (``dlbench_runner/fair.py`` says what is the same everywhere).

Layouts: TensorFlow's CPU convolutions take N x H x W x C inputs and H x W x in x out
kernels, so the inputs are transposed once and each convolution's (out, in, kH, kW) weight
to (kH, kW, in, out); ``tf.reshape`` then flattens H, W, C, so the first dense layer's
(out, in) weight, whose ``in`` runs over C, H, W, has its columns permuted to H, W, C
order before it is transposed to TensorFlow's (in, out).  Convolution padding is explicit;
pooling is ``SAME``, which is Caffe's ceil rule wherever SAME pads only after (checked:
it holds for both networks), a max window never taking the padding and an average
dividing by the inputs it covers.  The step is Keras's SGD with momentum (``v = momentum
* v - lr * gradient; w = w + v``, the neutral rule with ``v`` negated); op determinism
is on (``tf.config.experimental.enable_op_determinism``).
"""

import os

import numpy as np

from dlbench_adapter import Adapter, _onednn_enabled
from dlbench_runner import fair as networks


class Fair(Adapter):

    def setup(self):
        import tensorflow as tf
        import keras
        self.np, self.tf, self.keras = np, tf, keras
        ctx = self.ctx
        if ctx.threads:
            tf.config.threading.set_intra_op_parallelism_threads(ctx.threads)
            tf.config.threading.set_inter_op_parallelism_threads(ctx.threads)
        tf.config.experimental.enable_op_determinism()
        self.strategy = self.join()         # several workers: before any op
        self.device = self._device()
        self.data = data = ctx.fair_data()
        self.train_x = np.ascontiguousarray(data.train_x.transpose(0, 2, 3, 1))
        with tf.device(self.device):
            self.layers, self.variables = network(tf, data.network, ctx.fair_weights())
            self.optimizer = keras.optimizers.SGD(learning_rate=data.learning_rate,
                                                  momentum=data.momentum)
            self.optimizer.build(self.variables)
            probe = self._logits(tf.constant(np.ascontiguousarray(data.probe_x.transpose(0, 2, 3, 1))))
        ctx.fair_logits(probe.numpy())

    def _logits(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def train(self):
        tf, data, ctx = self.tf, self.data, self.ctx
        variables, optimizer = self.variables, self.optimizer

        world, sums = ctx.world, []

        @tf.function(reduce_retracing=True)
        def step(x, y):
            with tf.GradientTape() as tape:
                logits = self._logits(x)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
                scaled = loss if self.strategy is None else loss * self.scale
            grads = tape.gradient(scaled, variables)
            if self.strategy is not None:   # the workers' scaled gradients, averaged
                grads = self.all_reduced(grads)
            optimizer.apply_gradients(zip(grads, variables))
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), y), tf.int32))
            return loss, correct

        ctx.epoch_start()
        with tf.device(self.device):
            for index in range(data.steps):
                chosen = data.order[index]
                size = len(chosen)
                if world is not None:       # this worker's share of the batch
                    chosen = world.shard(chosen)
                loss, correct = step(tf.constant(self.train_x[chosen]), tf.constant(data.train_y[chosen]))
                if world is None:
                    ctx.fair_step(index, float(loss), int(correct))
                else:       # the batch's mean loss: the workers' sums, added once trained
                    sums.append([float(loss) * len(chosen) / size, float(correct)])
        if sums:
            total, = self.all_reduced([tf.constant(sums, tf.float64)], "SUM")
            for index, (loss, correct) in enumerate(total.numpy()):
                ctx.fair_step(index, loss, int(round(correct)))
        ctx.fair_trained(data.steps)

    def test(self):
        tf = self.tf
        with tf.device(self.device):
            return self.data.test_scores(
                lambda images: self._logits(tf.constant(np.ascontiguousarray(images.transpose(0, 2, 3, 1)))).numpy())

    def op_passes(self, spec, weights, x, g, input_grad):
        """A layer's (or the network's) forward pass, and that forward and backward pass from
        ``g`` (``ops.py``), each one ``tf.function`` as the training step is; the input's
        gradient where training's takes one (``input_grad``).  Images and their gradients in
        N x H x W x C."""
        tf = self.tf

        def nhwc(array):
            return np.ascontiguousarray(array.transpose(0, 2, 3, 1)) if array.ndim == 4 else array

        with tf.device(self.device):
            layers, variables = network(tf, spec, weights)
            x, g = tf.constant(nhwc(x)), tf.constant(nhwc(g))

            def run(x):
                for layer in layers:
                    x = layer(x)
                return x

            @tf.function
            def forward(x):
                return run(x)

            @tf.function
            def forward_backward(x, g):
                with tf.GradientTape() as tape:
                    if input_grad:
                        tape.watch(x)
                    out = run(x)
                # the output returned too: a function runs only the ops its outputs need, and a
                # convolution's gradients do not need its output
                return out, tape.gradient(out, variables + ([x] if input_grad else []), output_gradients=g)

        def forward_pass():
            with tf.device(self.device):
                forward(x)

        def forward_backward_pass():
            with tf.device(self.device):
                forward_backward(x, g)
        return forward_pass, forward_backward_pass

    def save(self, folder):
        """A TensorFlow checkpoint of the trained weights."""
        self.tf.train.Checkpoint(**{v.name.replace("/", "_").split(":")[0]: v for v in self.variables}).write(
            os.path.join(folder, "fair.ckpt"))

    def describe(self):
        tf, keras = self.tf, self.keras
        build = tf.sysconfig.get_build_info()
        device_name = None
        if self.device.startswith("/GPU"):
            physical = tf.config.list_physical_devices("GPU")[int(self.device.rpartition(":")[2])]
            device_name = tf.config.experimental.get_device_details(physical).get("device_name")
        threading = tf.config.threading
        return {
            "framework_version": tf.__version__,
            "param_count": int(sum(v.shape.num_elements() for v in self.variables)),
            "param_bytes": int(sum(v.shape.num_elements() * v.dtype.size for v in self.variables)),
            "device_name": device_name,
            "threads": {"requested": self.ctx.threads,
                        "framework": {"intra_op_parallelism_threads": threading.get_intra_op_parallelism_threads(),
                                      "inter_op_parallelism_threads": threading.get_inter_op_parallelism_threads(),
                                      "onednn_enabled": _onednn_enabled()}},
            "libraries": {"numpy": np.__version__, "keras": keras.__version__,
                          "cuda": build.get("cuda_version"), "cudnn": build.get("cudnn_version")},
        }


def network(tf, spec, weights):
    """The fair network as a list of functions of an N x H x W x C tensor, and its variables
    (each layer's weight and bias, in TensorFlow's layouts)."""
    layers, variables = [], []
    channels, size = spec["input"][0], (spec["input"][1] if len(spec["input"]) == 3 else None)
    flat = len(spec["input"]) == 1        # a dense layer's input (one layer timed alone: ops.py)
    for layer in spec["layers"]:
        kind, name = layer["kind"], layer["name"]
        if kind == "conv":
            kernel = tf.Variable(weights[name + ".weight"].transpose(2, 3, 1, 0), name=name + "/kernel")
            bias = tf.Variable(weights[name + ".bias"], name=name + "/bias")
            variables += [kernel, bias]
            pad = layer["pad"]
            layers.append(lambda x, k=kernel, b=bias, p=pad: tf.nn.bias_add(
                tf.nn.conv2d(x, k, strides=1, padding=[[0, 0], [p, p], [p, p], [0, 0]]), b))
            channels, size = layer["out"], size + 2 * pad - layer["kernel"] + 1
        elif kind == "pool":
            k, s = layer["kernel"], layer["stride"]
            caffe = networks.pooled_size(size, k, s)
            same = -(-size // s)
            if caffe != same or ((same - 1) * s + k - size) // 2 != 0:
                raise ValueError("layer %s: TensorFlow's SAME pooling is not Caffe's ceil rule here" % name)
            pool = tf.nn.max_pool2d if layer["mode"] == "max" else tf.nn.avg_pool2d
            layers.append(lambda x, f=pool, k=k, s=s: f(x, k, s, "SAME"))
            size = caffe
        elif kind == "relu":
            layers.append(tf.nn.relu)
        else:
            weight = weights[name + ".weight"]
            if not flat:        # C, H, W columns to H, W, C: tf.reshape's order
                weight = weight.reshape(-1, channels, size, size).transpose(0, 2, 3, 1).reshape(len(weight), -1)
                layers.append(lambda x: tf.reshape(x, [tf.shape(x)[0], -1]))
                flat = True
            kernel = tf.Variable(np.ascontiguousarray(weight.T), name=name + "/kernel")
            bias = tf.Variable(weights[name + ".bias"], name=name + "/bias")
            variables += [kernel, bias]
            layers.append(lambda x, w=kernel, b=bias: tf.matmul(x, w) + b)
    return layers, variables
