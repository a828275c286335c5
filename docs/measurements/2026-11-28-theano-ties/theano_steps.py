"""Theano's first fair steps, with what each max-pooling layer saw.

Run inside the theano image (its Theano, OpenBLAS and runner), with the data set
mounted:

    docker run --rm -v DATA:/data:ro -v OUT:/out --entrypoint python3 \
        -v THIS_FOLDER:/scripts:ro dlbench/theano:<tag> /scripts/theano_steps.py mnist /data /out

It trains the fair network as the theano fair adapter does (float32, the same graph
ops, the same update), and for each of the first STEPS steps writes the weights before
the step, the input of every max-pooling layer on the step's batch, and the step's
loss to OUT/theano-steps-<dataset>.npz, for theano_ties.py to read on the host.
"""

import os
import sys

STEPS = 10


def main(dataset, data_root, out):
    os.environ["THEANO_FLAGS"] = ("device=cpu,floatX=float32,blas.ldflags=-lopenblas,"
                                  "base_compiledir=" + os.path.join(os.environ.get("TMPDIR", "/var/tmp"), "theano"))
    import numpy as np
    import theano
    import theano.tensor as T
    from theano.tensor.nnet import conv2d
    from theano.tensor.signal.pool import pool_2d
    from dlbench_runner import contract, fair as networks

    hp = dict(contract.fair_hyperparameters(dataset), steps=STEPS)
    data = networks.FairData(contract.formats.load(dataset, data_root), dataset, hp, 1)
    weights = networks.initial_weights(dataset, 1)
    x, y = T.tensor4("x"), T.lvector("y")
    h, params, pooled = x, [], []
    for layer in data.network["layers"]:
        kind, name = layer["kind"], layer["name"]
        if kind in ("conv", "linear"):
            w = theano.shared(weights[name + ".weight"], name=name + ".weight")
            b = theano.shared(weights[name + ".bias"], name=name + ".bias")
            params += [w, b]
        if kind == "conv":
            p = layer["pad"]
            h = conv2d(h, w, border_mode=(p, p), filter_flip=False) + b.dimshuffle("x", 0, "x", "x")
        elif kind == "pool":
            if layer["mode"] == "max":
                pooled.append(h)
            k, s = layer["kernel"], layer["stride"]
            h = pool_2d(h, ws=(k, k), stride=(s, s), ignore_border=False,
                        mode="max" if layer["mode"] == "max" else "average_exc_pad")
        elif kind == "relu":
            h = T.nnet.relu(h)
        else:
            if h.ndim == 4:
                h = h.flatten(2)
            h = T.dot(h, w.T) + b
    loss = -T.mean(T.log(T.nnet.softmax(h))[T.arange(y.shape[0]), y])
    velocities = [theano.shared(np.zeros_like(p.get_value())) for p in params]
    lr, momentum = np.float32(data.learning_rate), np.float32(data.momentum)
    updates = []
    for p, v, g in zip(params, velocities, T.grad(loss, params)):
        v_new = momentum * v + g
        updates += [(v, v_new), (p, p - lr * v_new)]
    train = theano.function([x, y], loss, updates=updates)
    seen = theano.function([x], pooled)
    kept = {}
    for step in range(STEPS):
        bx, by = data.batch(step)
        for p in params:
            kept["w%d:%s" % (step, p.name)] = p.get_value()
        for index, array in enumerate(seen(bx)):
            kept["pool%d:%d" % (step, index)] = array
        kept["loss%d" % step] = np.float64(train(bx, by))
    np.savez(os.path.join(out, "theano-steps-%s.npz" % dataset), **kept)


if __name__ == "__main__":
    main(*sys.argv[1:])
