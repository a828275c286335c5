"""JAX adapter: Flax's own MNIST example, its training step compiled by XLA.

Framework ``jax``: JAX with Flax (the ``linen`` API) and Optax, as a person picks it today.
Its default model is Flax's MNIST example, as GTDLBench took each framework's own example
models (google/flax ``examples/mnist``: ``train.py`` and ``configs/default.py``):

- ``CNN``: 3x3 convolutions of 32 and 64 features (Flax's default ``SAME`` padding), each
  with ReLU and 2x2 average pooling of stride 2, a dense layer of 256 units with ReLU, 10
  outputs (the logits); Flax's default initialisers (LeCun normal kernels, zero biases);
- the mean softmax cross-entropy of the batch's logits (optax), SGD at learning rate 0.1
  with momentum 0.9 (``optax.sgd``), batch 128, 10 epochs, each epoch's order a fresh
  permutation drawn from the job's key, the incomplete last batch skipped;
- the pixels x / 255, float32, images N x H x W x C.

On CIFAR-10 dlbench trains the MNIST example's CNN, settings and all, on 32 x 32 x 3 images
(its dense layer then takes 8 x 8 x 64 features): Flax's CIFAR-10 example (``examples/
cifar10``) trains Wide ResNets (26 layers, 10 times wide) for 200 epochs, which its README
times at 70 minutes on 8 TPU cores.

Differs from the example: the images come from dlbench's readers (the same pixels), not
TensorFlow Datasets; the key is the job's seed (the example's is 0); the model is tested
once, after training, in batches of ``test_batch_size`` (the example tests after every
epoch, the whole test set at once: dlbench times the test pass apart).

Compiled ahead: setup lowers and compiles the training step (``jax.jit(...).lower(...)
.compile()``) on the shapes every step has, so ``compile_time_s`` holds XLA's compilation
(part of setup, none of training), and each step runs the compiled executable.  JAX
dispatches asynchronously: ``synchronize`` waits for the parameters, so that every clock
read (``ctx.now``) sees the work before it done.

The after-training checks: the robustness check's gradients are JAX's own (``jax.vjp`` of
the model's logits from the pixels); the migration check gets the trained model as a layer
list (``export_layers``, as Caffe and Theano give theirs), which the host makes an ONNX
graph of.
"""

import os
import time

from dlbench_runner import robustness


def mnist_cnn(nn):
    """Flax's examples/mnist CNN (train.py), as a linen module class."""

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Conv(features=32, kernel_size=(3, 3))(x)
            x = nn.relu(x)
            x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = nn.Conv(features=64, kernel_size=(3, 3))(x)
            x = nn.relu(x)
            x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = x.reshape((x.shape[0], -1))
            x = nn.Dense(features=256)(x)
            x = nn.relu(x)
            return nn.Dense(features=10)(x)
    return CNN()


class Adapter:
    def __init__(self, ctx):
        self.ctx = ctx
        self.hp = ctx.hp

    def start(self):
        """jax imported, on the CPU (the image has no other platform)."""
        import jax
        import jax.numpy as jnp
        import numpy as np
        import optax
        self.jax, self.jnp, self.np, self.optax = jax, jnp, np, optax
        if self.ctx.gpu is not None:
            raise RuntimeError("the jax image is a CPU build")

    def setup(self):
        self.start()
        import flax.linen as nn
        jax, jnp, np, ctx, hp = self.jax, self.jnp, self.np, self.ctx, self.hp
        self.model = mnist_cnn(nn)
        arrays = ctx.load_data()
        self.train_x = jnp.asarray(self.model_input(arrays["train_images"].astype(np.float32) / 255))
        self.test_x = self.model_input(arrays["test_images"].astype(np.float32) / 255)
        self.train_y = jnp.asarray(arrays["train_labels"].astype(np.int32))
        self.test_y = np.asarray(arrays["test_labels"], np.int64)
        init_key, order_key = jax.random.split(jax.random.key(ctx.seed))
        self.params = jax.jit(self.model.init)(init_key, self.train_x[:1])["params"]
        self.optimizer = self.optax.sgd(hp["learning_rate"], momentum=hp["momentum"])
        self.opt_state = self.optimizer.init(self.params)
        self.orders = self._orders(order_key)
        self._forward = jax.jit(lambda params, x: self.model.apply({"params": params}, x))
        self.step = self._compiled_step()
        batch = hp["test_batch_size"]           # the test pass's shapes, compiled now
        for size in {min(batch, len(self.test_y)), len(self.test_y) % batch} - {0}:
            self._forward(self.params, self.test_x[:size])

    def model_input(self, pixels):
        """[0, 1] pixels in the data set's layout (MNIST N x 28 x 28, CIFAR-10 N x 3 x 32 x
        32) -> the model's N x H x W x C input (a numpy or a JAX array alike)."""
        if pixels.ndim == 3:
            return pixels[..., None]
        return pixels.transpose(0, 2, 3, 1)

    def _orders(self, key):
        """Each epoch's training order, as the example draws it: a permutation of the
        training images from the epoch's key (split from the job's), cut to whole batches,
        steps x batch indices; drawn now, so that training holds no compilation."""
        jax, np = self.jax, self.np
        n = len(self.train_y)
        batch = min(self.hp["batch_size"], n)
        steps = n // batch                      # the example skips the incomplete batch
        permutation = jax.jit(lambda k: jax.random.permutation(k, n))
        orders = []
        for _ in range(self.hp["epochs"]):
            key, epoch_key = jax.random.split(key)
            orders.append(np.asarray(permutation(epoch_key))[:steps * batch]
                          .reshape(steps, batch).astype(np.int32))
        return orders

    def compiled(self, function, *args):
        """``function`` lowered and compiled by XLA now, for the shapes of ``args``; its time
        is the job's ``compile_time_s``."""
        started = time.perf_counter()
        executable = self.jax.jit(function).lower(*args).compile()
        self.ctx.compile_time_s = time.perf_counter() - started
        return executable

    def _compiled_step(self):
        """One training step, compiled now for the shapes of every step."""
        jax, optax, model, optimizer = self.jax, self.optax, self.model, self.optimizer

        def step(params, opt_state, sums, train_x, train_y, index):
            x, y = train_x[index], train_y[index]

            def loss_of(p):
                logits = model.apply({"params": p}, x)
                return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), logits
            (loss, logits), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            correct = (logits.argmax(-1) == y).sum()
            sums = sums + self.jnp.stack([loss * len(index), correct.astype(sums.dtype)])
            return optax.apply_updates(params, updates), opt_state, sums, loss

        return self.compiled(step, self.params, self.opt_state, self._no_sums(), self.train_x,
                             self.train_y, self.orders[0][0])

    def _no_sums(self):
        """An epoch's running sums of its steps' losses (times their images) and right
        classes, kept on the device by the step."""
        return self.jnp.zeros((2,), self.jnp.float32)

    # -- train ---------------------------------------------------------------
    def train(self):
        ctx = self.ctx
        steps = 0
        for epoch, order in enumerate(self.orders, 1):
            ctx.epoch_start()
            sums = self._no_sums()
            for i, index in enumerate(order):
                self.params, self.opt_state, sums, loss = self.step(
                    self.params, self.opt_state, sums, self.train_x, self.train_y, index)
                steps += 1
                # float(loss) waits for the step: every 200 steps, and the last
                if i % 200 == 0 or i == len(order) - 1:
                    ctx.progress(epoch, (i + 1) / len(order), float(loss), step=steps)
            samples = order.size
            loss_sum, correct = (float(v) for v in self.np.asarray(sums))
            ctx.epoch_done(epoch, loss_sum / samples, correct / samples, samples=samples)

    def synchronize(self):
        if hasattr(self, "params"):
            self.jax.block_until_ready(self.params)

    # -- test ----------------------------------------------------------------
    def test(self):
        np = self.np
        batch, n = self.hp["test_batch_size"], len(self.test_y)
        loss_sum, correct, predicted = 0.0, 0, []
        for start in range(0, n, batch):
            logits = np.asarray(self._forward(self.params, self.test_x[start:start + batch]), np.float64)
            labels = self.test_y[start:start + batch]
            loss_sum += float(robustness.cross_entropy(logits, labels).sum())
            classes = logits.argmax(1)
            correct += int((classes == labels).sum())
            predicted.append(classes)
        return {"accuracy": correct / n, "loss": loss_sum / n,
                "predictions": np.concatenate(predicted) if predicted else None}

    # -- the robustness check: the model's view of pixels, JAX's own gradients ---------
    def _pixels(self, pixels):
        return self.jnp.asarray(self.np.asarray(pixels, self.np.float32))

    def logits(self, pixels):
        """The model's logits for [0, 1] pixels (float32)."""
        return self.np.asarray(self._forward(self.params, self.model_input(self._pixels(pixels))))

    def predict(self, pixels):
        return self.logits(pixels).argmax(1)

    def input_vjp(self, pixels, output_gradient):
        """``jax.vjp`` of the logits with respect to the pixels (through ``model_input``),
        weighted by ``output_gradient(logits)``; and the classes predicted."""
        jax, np = self.jax, self.np
        x = self._pixels(pixels)
        logits, pullback = jax.vjp(lambda p: self._forward(self.params, self.model_input(p)), x)
        g = np.asarray(output_gradient(np.asarray(logits)), np.float32)
        gradient, = pullback(self.jnp.asarray(g))
        return np.asarray(gradient), np.asarray(logits).argmax(1)

    # -- migration: the trained model as a layer list ----------------------------------
    def export_layers(self, pixels):
        """The CNN from the data set's pixels (C x H x W layers, as the host's graph takes
        them) to its logits: Flax's kernels (H x W x in x out) as O x I x H x W weights,
        SAME padding of a 3x3 kernel as one pixel on every side, and the first dense
        layer's rows put in the C, H, W order the layer list flattens in (Flax flattens
        H x W x C)."""
        np = self.np
        params = {name: {k: np.asarray(v) for k, v in layer.items()} for name, layer in self.params.items()}
        layers = []
        if pixels.ndim == 3:                            # MNIST: 28 x 28 pixels, 1 x 28 x 28
            layers.append({"op": "reshape", "shape": [1] + list(pixels.shape[1:])})
        side = pixels.shape[-1]
        for name in ("Conv_0", "Conv_1"):
            kernel = params[name]["kernel"]
            layers += [{"op": "conv", "weight": kernel.transpose(3, 2, 0, 1).copy(),
                        "bias": params[name]["bias"], "stride": [1, 1], "pads": [1, 1, 1, 1], "group": 1},
                       {"op": "relu"},
                       {"op": "pool", "mode": "avg", "kernel": [2, 2], "stride": [2, 2],
                        "pads": [0, 0, 0, 0], "ceil": False, "divisor": "window"}]
            side //= 2
        kernel = params["Dense_0"]["kernel"]            # (side * side * channels) x 256
        channels = kernel.shape[0] // (side * side)
        chw = kernel.reshape(side, side, channels, -1).transpose(2, 0, 1, 3).reshape(kernel.shape[0], -1)
        layers += [{"op": "flatten"},
                   {"op": "dense", "weight": chw.T.copy(), "bias": params["Dense_0"]["bias"]},
                   {"op": "relu"},
                   {"op": "dense", "weight": params["Dense_1"]["kernel"].T.copy(),
                    "bias": params["Dense_1"]["bias"]}]
        return layers

    # -- save ----------------------------------------------------------------
    def save(self, folder):
        """The trained parameters as Flax serialises them (``flax.serialization.to_bytes``,
        msgpack)."""
        from flax import serialization
        with open(os.path.join(folder, "params.msgpack"), "wb") as f:
            f.write(serialization.to_bytes(self.params))

    # -- describe ------------------------------------------------------------
    def describe(self):
        import flax
        import jaxlib
        jax, np = self.jax, self.np
        leaves = jax.tree_util.tree_leaves(self.params)
        return {
            "framework_version": jax.__version__,
            "param_count": int(sum(leaf.size for leaf in leaves)),
            "param_bytes": int(sum(leaf.size * leaf.dtype.itemsize for leaf in leaves)),
            "device_name": None,
            "threads": {"requested": self.ctx.threads,
                        "framework": {"jax.devices": [str(d) for d in jax.devices()],
                                      "XLA_FLAGS": os.environ.get("XLA_FLAGS")}},
            "libraries": {"jaxlib": jaxlib.__version__, "flax": flax.__version__,
                          "optax": self.optax.__version__, "numpy": np.__version__},
        }
