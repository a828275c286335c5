"""Where the time goes: each layer of the fair network timed alone, in every framework.

Deep500's operator and network levels.  After a fair job has trained and tested, the
runner times (``op_repeats`` of the fair settings times; 0: not at all), at the training's
batch size and the layers' real shapes:

- each layer of the network alone (``plan``: its input shape, its output shape, whether
  its input takes a gradient: every layer's but the first, as in training), and
- the whole network (the layers in one model, as it trains, without the loss),

each in two passes: ``forward``, the layer's forward pass in training mode, and
``forward_backward``, that forward pass and the backward pass from a given gradient of
its output (to its parameters, and to its input where it takes one).  The inputs and the
output gradients are the same in every framework: float32 normal numbers drawn from the
job's seed (``arrays``); the weights are the fair initial ones.  The two passes are
timed in turn, ``OP_WARMUP`` times unrecorded and then ``op_repeats`` times each, so that
a drift of the machine reaches both.  The backward pass's time is the difference of the
two passes' medians: a graph framework (TensorFlow, Theano) cannot run a backward pass
without the forward pass it depends on, so this is the one definition every framework can
follow.  The step's time is the training's own, its mean (training time / steps): data
feeding, loss, gradient and update included, so that a bar of the layers' times under it
shows what the rest of the step costs.

An adapter gives, for ``layers`` (a network spec of those layers, ``input`` their input
shape without the batch), ``op_passes(spec, weights, x, g, input_grad)``: two callables
that run the passes once, the runner's clock reading them (``ctx.now`` waits for a GPU); or,
where another process computes (Lua Torch7), ``op_times(spec, weights, x, g, input_grad,
repeats, warmup)``: the two lists of seconds, timed the same way there.

Each row: ``layer`` (its name, ``network``, or ``step``), ``index`` (its place, from 0;
-1 for the network and the step), ``kind``, ``pass`` (``forward``, ``backward`` or
``step``), ``shape`` and ``output_shape`` (with the batch, ``64x1x28x28``), ``flops`` (a
convolution's or a dense layer's forward multiply-adds times 2; else empty), ``time_s``
and ``spread_s`` (the measured pass's interquartile range: for ``backward``, that of
forward_backward), ``repeats``.
"""

import math

import numpy as np

from . import fair

OP_WARMUP = 2


def shapes(network, batch_size):
    """Each layer's input and output shape (with the batch), in order."""
    shape, found = (batch_size,) + tuple(network["input"]), []
    for layer in network["layers"]:
        kind = layer["kind"]
        if kind == "conv":
            size = shape[2] + 2 * layer["pad"] - layer["kernel"] + 1
            out = (batch_size, layer["out"], size, size)
        elif kind == "pool":
            size = fair.pooled_size(shape[2], layer["kernel"], layer["stride"])
            out = (batch_size, shape[1], size, size)
        elif kind == "relu":
            out = shape
        else:
            out = (batch_size, layer["out"])
        found.append((shape, out))
        shape = out
    return found


def flops(layer, shape, out):
    """A convolution's or a dense layer's forward multiply-adds, times 2; else None."""
    if layer["kind"] == "conv":
        return 2 * out[0] * layer["out"] * layer["in"] * layer["kernel"] ** 2 * out[2] * out[3]
    if layer["kind"] == "linear":
        return 2 * shape[0] * layer["in"] * layer["out"]
    return None


def plan(network, batch_size):
    """The ops to time: each layer alone, then the whole network.  Each a dict: ``layer``,
    ``index``, ``kind``, ``spec`` (a network of those layers, its ``input`` theirs),
    ``shape``, ``output_shape``, ``input_grad``, ``flops``."""
    found = []
    layer_shapes = shapes(network, batch_size)
    for index, (layer, (shape, out)) in enumerate(zip(network["layers"], layer_shapes)):
        spec = dict(network, input=tuple(shape[1:]), layers=[layer])
        found.append({"layer": layer["name"], "index": index, "kind": layer["kind"], "spec": spec,
                      "shape": shape, "output_shape": out, "input_grad": index > 0,
                      "flops": flops(layer, shape, out)})
    counted = [op["flops"] for op in found if op["flops"] is not None]
    found.append({"layer": "network", "index": -1, "kind": "network", "spec": network,
                  "shape": layer_shapes[0][0], "output_shape": layer_shapes[-1][1],
                  "input_grad": False, "flops": sum(counted)})
    return found


def arrays(op, seed):
    """The op's input and output gradient, float32, the same in every framework."""
    random = np.random.RandomState([seed, op["index"] + 1])
    x = random.standard_normal(op["shape"]).astype(np.float32)
    g = random.standard_normal(op["output_shape"]).astype(np.float32)
    return x, g


def time_passes(now, forward, forward_backward, repeats, warmup=OP_WARMUP):
    """The seconds of each pass, timed in turn: ``warmup`` times unrecorded, then
    ``repeats`` times each."""
    times = ([], [])
    for round_ in range(warmup + repeats):
        for run, found in ((forward, times[0]), (forward_backward, times[1])):
            t0 = now()
            run()
            elapsed = now() - t0
            if round_ >= warmup:
                found.append(elapsed)
    return times


def _quartiles(values):
    q1, median, q3 = np.percentile(np.asarray(values, np.float64), [25, 50, 75])
    return float(median), float(q3 - q1)


def _shape(shape):
    return "x".join(str(n) for n in shape)


def rows(op, forward, forward_backward):
    """The forward and backward rows of one op's timings."""
    if len(forward) != len(forward_backward) or not forward:
        raise ValueError("op %s: %d forward and %d forward-backward timings"
                         % (op["layer"], len(forward), len(forward_backward)))
    for value in list(forward) + list(forward_backward):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError("op %s: a pass took %r seconds" % (op["layer"], value))
    f_median, f_spread = _quartiles(forward)
    fb_median, fb_spread = _quartiles(forward_backward)
    common = {"layer": op["layer"], "index": op["index"], "kind": op["kind"],
              "shape": _shape(op["shape"]), "output_shape": _shape(op["output_shape"]),
              "flops": op["flops"], "repeats": len(forward)}
    return [dict(common, **{"pass": "forward", "time_s": f_median, "spread_s": f_spread}),
            dict(common, **{"pass": "backward", "time_s": fb_median - f_median, "spread_s": fb_spread})]


def measure(adapter, ctx, step_s):
    """The rows of every op of the job's fair network, and the training's step."""
    data_network = fair.NETWORKS[ctx.dataset]
    repeats, batch_size = ctx.hp["op_repeats"], ctx.hp["batch_size"]
    weights = ctx.fair_weights()        # the ones the training started from
    found = []
    for op in plan(data_network, batch_size):
        x, g = arrays(op, ctx.seed)
        if hasattr(adapter, "op_times"):
            times = adapter.op_times(op["spec"], weights, x, g, op["input_grad"], repeats, OP_WARMUP)
        else:
            passes = adapter.op_passes(op["spec"], weights, x, g, op["input_grad"])
            times = time_passes(ctx.now, passes[0], passes[1], repeats)
        found += rows(op, *times)
    shape = _shape((batch_size,) + tuple(data_network["input"]))
    found.append({"layer": "step", "index": -1, "kind": "step", "pass": "step", "shape": shape,
                  "output_shape": _shape((batch_size, data_network["classes"])), "flops": None,
                  "time_s": float(step_s), "spread_s": None, "repeats": ctx.hp["steps"]})
    return found
