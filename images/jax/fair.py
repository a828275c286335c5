"""The fair profile in JAX (``dlbench_runner/fair.py`` says what is the same everywhere).

The network is written with ``jax.lax`` in the neutral layout, N x C x H x W with O x I x
H x W kernels (``lax.conv_general_dilated``'s dimension numbers), so the weights load as
they are and the first linear layer flattens C, H, W as the neutral file does; Flax's
``linen`` layers are N x H x W x C and have no pooling by Caffe's rule.  Pooling:
``lax.reduce_window`` over the input padded at the bottom and right just enough for Caffe's
ceil((size - kernel) / stride) + 1 outputs (with -inf for a maximum); an average divides
each window's sum by the inputs it covers (the same window summed over ones).  The step:
``optax.sgd`` with ``momentum`` (no Nesterov): ``v = momentum * v + gradient; w = w - lr *
v``, the neutral rule; the loss the batch's mean softmax cross-entropy; the step compiled
ahead (its time ``compile_time_s``), as the adapter's.
"""

import numpy as np

from dlbench_adapter import Adapter
from dlbench_runner import fair as neutral

TEST_BATCH = 1000           # FairData.test_scores' batches


def forward(jax, spec, params, x):
    """The network of ``spec`` (layers of ``fair.NETWORKS``) on x, N x C x H x W."""
    lax, jnp = jax.lax, jax.numpy
    for layer in spec["layers"]:
        kind = layer["kind"]
        if kind == "conv":
            weight, bias = params[layer["name"]]
            pad = layer["pad"]
            x = lax.conv_general_dilated(x, weight, (1, 1), [(pad, pad), (pad, pad)],
                                         dimension_numbers=("NCHW", "OIHW", "NCHW"))
            x = x + bias[None, :, None, None]
        elif kind == "pool":
            k, s = layer["kernel"], layer["stride"]
            pads = [(0, 0), (0, 0)] + [(0, (neutral.pooled_size(size, k, s) - 1) * s + k - size)
                                       for size in x.shape[2:]]
            window, strides = (1, 1, k, k), (1, 1, s, s)
            if layer["mode"] == "max":
                x = lax.reduce_window(x, -jnp.inf, lax.max, window, strides, pads)
            else:
                ones = jnp.ones((1, 1) + x.shape[2:], x.dtype)
                covered = lax.reduce_window(ones, 0.0, lax.add, window, strides, pads)
                x = lax.reduce_window(x, 0.0, lax.add, window, strides, pads) / covered
        elif kind == "relu":
            x = jnp.maximum(x, 0.0)
        else:
            weight, bias = params[layer["name"]]
            if x.ndim > 2:
                x = x.reshape((x.shape[0], -1))
            x = x @ weight.T + bias
    return x


def parameters(jax, spec, weights):
    """The layers' (weight, bias) in the neutral layout, as JAX arrays, by layer name."""
    return {layer["name"]: (jax.numpy.asarray(np.ascontiguousarray(weights[layer["name"] + ".weight"])),
                            jax.numpy.asarray(np.ascontiguousarray(weights[layer["name"] + ".bias"])))
            for layer in spec["layers"] if layer["kind"] in ("conv", "linear")}


class Fair(Adapter):

    def setup(self):
        self.start()
        jax, optax, ctx = self.jax, self.optax, self.ctx
        self.data = ctx.fair_data()
        spec = self.data.network
        self.params = parameters(jax, spec, ctx.fair_weights())
        self._forward = jax.jit(lambda params, x: forward(jax, spec, params, x))
        ctx.fair_logits(np.asarray(self._forward(self.params, jax.numpy.asarray(self.data.probe_x))))
        self._forward(self.params, jax.numpy.asarray(self.data.test_x[:TEST_BATCH]))   # compiled now
        self.optimizer = optax.sgd(self.data.learning_rate, momentum=self.data.momentum, nesterov=False)
        self.opt_state = self.optimizer.init(self.params)

        def step(params, opt_state, x, y):
            def loss_of(p):
                logits = forward(jax, spec, p, x)
                return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), logits
            (loss, logits), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss, (logits.argmax(-1) == y).sum()

        images, labels = self.data.batch(0)
        self.step = self.compiled(step, self.params, self.opt_state, images, labels.astype(np.int32))

    def train(self):
        data, ctx = self.data, self.ctx
        ctx.epoch_start()
        for step in range(data.steps):
            images, labels = data.batch(step)
            self.params, self.opt_state, loss, correct = self.step(
                self.params, self.opt_state, images, labels.astype(np.int32))
            ctx.fair_step(step, float(loss), int(correct))
        ctx.fair_trained(data.steps)

    def test(self):
        jnp = self.jnp
        return self.data.test_scores(lambda images: np.asarray(self._forward(self.params, jnp.asarray(images))),
                                     TEST_BATCH)

    def op_passes(self, spec, weights, x, g, input_grad):
        """A layer's (or the network's) forward pass, and that forward pass with the backward
        pass from ``g`` (to the parameters, and to the input where ``input_grad``), each
        compiled once and waited for (JAX dispatches asynchronously); the backward pass
        returns the forward's output too, so that XLA cannot leave the forward out."""
        jax = self.jax
        params = parameters(jax, spec, weights)
        x, g = jax.numpy.asarray(x), jax.numpy.asarray(g)
        run = jax.jit(lambda p, x: forward(jax, spec, p, x))
        if input_grad:
            both = jax.jit(lambda p, x, g: (lambda out, pullback: (out, pullback(g)))(
                *jax.vjp(lambda p, x: forward(jax, spec, p, x), p, x)))
        else:
            both = jax.jit(lambda p, x, g: (lambda out, pullback: (out, pullback(g)))(
                *jax.vjp(lambda p: forward(jax, spec, p, x), p)))

        def forward_pass():
            jax.block_until_ready(run(params, x))

        def forward_backward():
            jax.block_until_ready(both(params, x, g))
        forward_pass()              # compiled before the timing starts
        forward_backward()
        return forward_pass, forward_backward
