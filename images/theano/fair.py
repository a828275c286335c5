"""The fair profile in Theano (``dlbench_runner/fair.py`` says what is the same everywhere).

Layouts: the neutral file's are Theano's. ``conv2d`` takes (out, in, kH, kW) filters; it
flips them unless ``filter_flip=False``, which makes it the cross-correlation every other
framework computes (CorrMM).  The first dense layer's input is ``flatten(2)`` of
N x C x H x W, so C, H, W order, and ``T.dot(h, W.T)`` takes the (out, in) weight as it
is.  Pooling is ``pool_2d(ignore_border=False)``, whose output size is Caffe's ceil rule,
with ``average_exc_pad`` dividing by the inputs a window covers.  float32 throughout
(``floatX=float32``).  The loss is the tutorials' mean of ``-log softmax`` at the labels,
which Theano fuses into one C op; the step is
written out as the neutral rule, ``v = momentum * v + gradient; w = w - lr * v``.
"""

import os
import tempfile

from dlbench_adapter import (Adapter, compile_directory, compiled_conv_ops, copy_warm_modules, gpu_sync,
                             theano_flags)


class Fair(Adapter):

    def setup(self):
        ctx = self.ctx
        scratch = os.environ.get("DLBENCH_COMPILE_DIR")
        if scratch:     # as the default adapter does: g++'s probes need an exec directory
            os.environ["TMPDIR"] = scratch
            tempfile.tempdir = None
        self.compiledir = compile_directory(scratch)
        self.warm_modules = copy_warm_modules(self.compiledir)
        os.environ["THEANO_FLAGS"] = theano_flags(ctx.threads, self.compiledir, "float32", ctx.gpu,
                                                  ctx.spec.get("blas"))
        import numpy
        import theano
        self.np, self.theano = numpy, theano
        self.device_name = None
        if ctx.gpu is not None:
            import theano.gpuarray
            self.device_name = getattr(theano.gpuarray.type.get_context(None), "devname", None)
        self.net = FairNet(ctx, numpy, theano)
        self.net.sync = gpu_sync(self.net.updated) if ctx.gpu is not None else None
        self.conv_ops = compiled_conv_ops(self.net.train_fn)
        ctx.fair_logits(self.net.logits(self.net.data.probe_x))

    def op_passes(self, spec, weights, x, g, input_grad):
        """A layer's (or the network's) forward pass, and that forward and backward pass from
        ``g`` (``ops.py``): two compiled functions, the second returning the output too (a
        Theano function computes only what its outputs need, and a convolution's gradients
        do not need its output); the input's gradient where training's takes one."""
        theano = self.theano
        T = theano.tensor
        x_var = (T.tensor4 if x.ndim == 4 else T.matrix)("x")
        h, params = graph(theano, spec, weights, x_var)
        g_var = h.type("g")
        wrt = params + ([x_var] if input_grad else [])
        gradients = T.grad(None, wrt=wrt, known_grads={h: g_var})
        forward = theano.function([x_var], h)
        forward_backward = theano.function([x_var, g_var], [h] + gradients)
        return (lambda: forward(x)), (lambda: forward_backward(x, g))


def graph(theano, spec, weights, x):
    """The network ``spec`` on the symbolic input ``x``: its output, and its parameters (shared
    variables holding ``weights``, each layer's weight then bias)."""
    T = theano.tensor
    from theano.tensor.nnet import conv2d
    from theano.tensor.signal.pool import pool_2d
    h, flat, params = x, x.ndim == 2, []
    for layer in spec["layers"]:
        kind, name = layer["kind"], layer["name"]
        if kind in ("conv", "linear"):
            w = theano.shared(weights[name + ".weight"], name=name + ".weight")
            b = theano.shared(weights[name + ".bias"], name=name + ".bias")
            params += [w, b]
        if kind == "conv":
            p = layer["pad"]
            h = conv2d(h, w, border_mode=(p, p), filter_flip=False) + b.dimshuffle("x", 0, "x", "x")
        elif kind == "pool":
            k, s = layer["kernel"], layer["stride"]
            h = pool_2d(h, ws=(k, k), stride=(s, s), ignore_border=False,
                        mode="max" if layer["mode"] == "max" else "average_exc_pad")
        elif kind == "relu":
            h = T.nnet.relu(h)
        else:
            if not flat:
                h, flat = h.flatten(2), True
            h = T.dot(h, w.T) + b
    return h, params


class FairNet:
    """The fair network in Theano, with what the default adapter's train(), test(), save()
    and describe() read of a net."""

    early_stopping = None
    periodic_passes = []
    paper_train_time_s = paper_test_time_s = None

    def __init__(self, ctx, np, theano):
        self.ctx, self.np, self.theano = ctx, np, theano
        self.data = data = ctx.fair_data()
        T = theano.tensor
        x, y = T.tensor4("x"), T.lvector("y")
        h, self.params = graph(theano, data.network, ctx.fair_weights(), x)
        # the tutorials' form, which Theano rewrites into its fused C op
        # (CrossentropySoftmaxArgmax1HotWithBias): no indexing left in Python
        loss = -T.mean(T.log(T.nnet.softmax(h))[T.arange(y.shape[0]), y])
        correct = T.sum(T.eq(T.argmax(h, axis=1), y))
        velocities = [theano.shared(np.zeros_like(p.get_value()), name=p.name + ".v") for p in self.params]
        lr, momentum = np.float32(data.learning_rate), np.float32(data.momentum)
        updates = []
        for p, v, g in zip(self.params, velocities, T.grad(loss, self.params)):
            v_new = momentum * v + g
            updates += [(v, v_new), (p, p - lr * v_new)]
        self.updated = self.params + velocities
        self.train_fn = theano.function([x, y], [loss, correct], updates=updates)
        self.logit_fn = theano.function([x], h)

    def logits(self, images):
        return self.logit_fn(images)

    def train(self):
        data, ctx = self.data, self.ctx
        ctx.epoch_start()
        for step in range(data.steps):
            x, y = data.batch(step)
            loss, correct = self.train_fn(x, y)
            ctx.fair_step(step, float(loss), int(correct))
        ctx.fair_trained(data.steps)

    def test(self):
        return self.data.test_scores(self.logits)
