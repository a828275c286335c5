"""The fair profile in MXNet (``dlbench_runner/fair.py`` says what is the same everywhere).

Layouts: the neutral file's are MXNet's own. A Convolution weight is (out, in, kH, kW), a
FullyConnected weight (out, in) over its input flattened in C, H, W order: the weights load as they
are (``Module.set_params``).  Pooling uses ``pooling_convention="full"``, Caffe's ceil
rule, and ``count_include_pad=False``, so that an average window cut at the border
divides by the inputs it covers on every path (oneDNN's included).  The symbol ends in
``SoftmaxOutput``, whose gradient the Module scales by 1 / batch (``rescale_grad``): the
mean cross-entropy's; its loss is read from the outputs, as Module.fit's metrics read them.
The step is MXNet's SGD with momentum (``v = momentum * v - lr * gradient; w = w + v``, the
neutral rule with ``v`` negated), no weight decay.  ``MXNET_ENFORCE_DETERMINISM`` is set.
"""

import os

from dlbench_adapter import Adapter, _omp_max_threads, driver_or_stand_in
from dlbench_runner import blas


def symbol(mx, spec):
    """The fair network's logits and its training symbol (with SoftmaxOutput)."""
    x = mx.sym.Variable("data")
    for layer in spec["layers"]:
        kind, name = layer["kind"], layer["name"]
        if kind == "conv":
            k, p = layer["kernel"], layer["pad"]
            x = mx.sym.Convolution(data=x, kernel=(k, k), pad=(p, p), num_filter=layer["out"], name=name)
        elif kind == "pool":
            k, s = layer["kernel"], layer["stride"]
            x = mx.sym.Pooling(data=x, pool_type="max" if layer["mode"] == "max" else "avg",
                               kernel=(k, k), stride=(s, s), pooling_convention="full",
                               count_include_pad=False, name=name)
        elif kind == "relu":
            x = mx.sym.Activation(data=x, act_type="relu", name=name)
        else:       # flatten=True (its default): N x C x H x W read as N x (C H W)
            x = mx.sym.FullyConnected(data=x, num_hidden=layer["out"], flatten=True, name=name)
    return x, mx.sym.SoftmaxOutput(data=x, name="softmax")


class Fair(Adapter):

    def setup(self):
        import numpy as np
        os.environ["MXNET_ENFORCE_DETERMINISM"] = "1"
        driver_or_stand_in()
        import mxnet as mx
        self.np, self.mx = np, mx
        ctx = self.ctx
        self.context = mx.cpu() if ctx.gpu is None else mx.gpu(ctx.gpu)
        self.data = data = ctx.fair_data()
        self.logit_symbol, self.symbol = symbol(mx, data.network)
        self.shape = tuple(data.network["input"])
        self.module = mx.mod.Module(symbol=self.symbol, context=self.context)
        self.module.bind(data_shapes=[("data", (data.batch_size,) + self.shape)],
                         label_shapes=[("softmax_label", (data.batch_size,))], for_training=True)
        weights = ctx.fair_weights()
        params = {name.replace(".", "_"): mx.nd.array(array, dtype="float32") for name, array in weights.items()}
        self.module.init_params(arg_params=params, aux_params={}, allow_missing=False)
        self.module.init_optimizer(kvstore=None, optimizer="sgd", optimizer_params={
            "learning_rate": data.learning_rate, "momentum": data.momentum, "wd": 0.0})
        self.logit_modules = {}
        ctx.fair_logits(self._logits(data.probe_x))
        # describe()'s fields of the default adapter's data pipeline: none here
        self.prefetch, self.data_wait_s, self.checksummed = 0, 0.0, 0
        self.checksum = None

    def _logits(self, images):
        """The logits of ``images`` with the current weights (a module of the logits symbol
        for that batch size, given the training module's parameters)."""
        mx = self.mx
        module = self.logit_modules.get(len(images))
        if module is None:
            module = mx.mod.Module(symbol=self.logit_symbol, context=self.context, label_names=None)
            module.bind(data_shapes=[("data", (len(images),) + self.shape)], for_training=False)
            self.logit_modules[len(images)] = module
        arg_params, aux_params = self.module.get_params()
        module.set_params(arg_params, aux_params)
        module.forward(mx.io.DataBatch(data=[mx.nd.array(images, ctx=self.context)]), is_train=False)
        return module.get_outputs()[0].asnumpy()

    def train(self):
        np, mx, data, ctx = self.np, self.mx, self.data, self.ctx
        ctx.epoch_start()
        for step in range(data.steps):
            x, y = data.batch(step)
            self.module.forward_backward(mx.io.DataBatch(data=[mx.nd.array(x, ctx=self.context)],
                                                         label=[mx.nd.array(y, ctx=self.context)]))
            self.module.update()
            probs = self.module.get_outputs()[0].asnumpy()
            loss = float(-np.log(np.maximum(probs[np.arange(len(y)), y], 1e-45)).mean())
            ctx.fair_step(step, loss, int((probs.argmax(axis=1) == y).sum()))
        mx.nd.waitall()
        ctx.fair_trained(data.steps)

    def op_passes(self, spec, weights, x, g, input_grad):
        """A layer's (or the network's) forward pass in training mode, and that forward and
        backward pass from ``g`` (``ops.py``), on an executor of its symbol; gradients of the
        parameters, and of the input where training's takes one (``input_grad``).  Each
        pass waits for MXNet's engine, which runs operators asynchronously."""
        mx = self.mx
        logits, _ = symbol(mx, spec)
        names = {name.replace(".", "_"): array for name, array in weights.items()}
        arguments = logits.list_arguments()
        grad_req = {name: ("write" if name != "data" or input_grad else "null") for name in arguments}
        executor = logits.simple_bind(ctx=self.context, grad_req=grad_req, data=x.shape)
        for name in arguments:
            executor.arg_dict[name][:] = x if name == "data" else names[name]
        g = mx.nd.array(g, ctx=self.context)

        def forward():
            executor.forward(is_train=True)
            mx.nd.waitall()

        def forward_backward():
            executor.forward(is_train=True)
            executor.backward(out_grads=[g])
            mx.nd.waitall()
        return forward, forward_backward

    def test(self):
        return self.data.test_scores(self._logits)

    def save(self, folder):
        self.module.save_params(os.path.join(folder, "fair.params"))

    def describe(self):
        np, mx = self.np, self.mx
        arg_params, _ = self.module.get_params()
        return {
            "framework_version": mx.__version__,
            "param_count": int(sum(v.size for v in arg_params.values())),
            "param_bytes": int(sum(v.size * np.dtype(v.dtype).itemsize for v in arg_params.values())),
            "device_name": "GPU %d" % self.context.device_id if self.context.device_type == "gpu" else None,
            "threads": {"requested": self.ctx.threads,
                        "framework": {"OMP_NUM_THREADS": mx.util.getenv("OMP_NUM_THREADS"),
                                      "omp_get_max_threads": _omp_max_threads(),
                                      "openblas_get_num_threads": blas.openblas_threads(),
                                      "MXNET_ENFORCE_DETERMINISM": os.environ.get("MXNET_ENFORCE_DETERMINISM")}},
            "libraries": {"numpy": np.__version__,
                          "mxnet_features": ",".join(sorted(f.name for f in mx.runtime.feature_list()
                                                            if f.enabled))},
        }
