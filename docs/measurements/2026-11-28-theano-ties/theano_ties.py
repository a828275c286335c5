"""Why Theano's fair losses part from its tie rule's reference: a test of the cause.

    python theano_ties.py DATA theano-steps-mnist.npz [mnist]

Reads what theano_steps.py kept of Theano's first steps (its losses, and the input of
each max-pooling layer) and trains the NumPy reference (float64, orchestrator/checks/fair.py)
three ways from the same initial weights on the same batches:

    first       a tied window's gradient to its first maximum
    every       to every input equal to the window's maximum, ties judged on the
                reference's own float64 values (what the report holds Theano to)
    as Theano   to every input equal to the maximum, ties judged on the values Theano's
                float32 forward pass computed at that step

If the third follows Theano's losses to float32 rounding while the second does not, the
gap is which windows are tied, not the rule nor the arithmetic of the update.  It also
counts, per step, the max-pooling windows with a tied maximum in each.
"""

import sys

import numpy as np

from dlbench_runner import contract, fair as networks
from orchestrator.checks import fair

STEPS = 10


class Judged(fair.Layers):
    """The every rule with each max-pooling layer's ties judged on ``self.seen`` (its
    input as another computation made it), counting tied windows in both."""

    def __init__(self, dataset, ties="every"):
        super().__init__(dataset, ties)
        pools = [layer["name"] for layer in self.layers if layer["kind"] == "pool" and layer["mode"] == "max"]
        self.index = {name: i for i, name in enumerate(pools)}
        self.seen, self.tied = None, {}

    def _backward(self, layer, weights, h, g, gradients, input_gradient=True):
        if layer["kind"] == "pool" and layer["mode"] == "max":
            own = _tied(h, layer)
            if self.seen is not None:
                judged = np.asarray(self.seen[self.index[layer["name"]]], np.float64)
                self.tied[layer["name"]] = (own, _tied(judged, layer))
                return fair.pooling_gradient(judged, g, "max", layer["kernel"], layer["stride"], "every")
            self.tied[layer["name"]] = (own, None)
        return super()._backward(layer, weights, h, g, gradients, input_gradient)


def _tied(x, layer):
    windows, _ = fair.pooling_windows(x, "max", layer["kernel"], layer["stride"])
    return int(((windows == windows.max(axis=(4, 5), keepdims=True)).sum(axis=(4, 5)) > 1).sum())


def train(layers, weights, data, seen=None):
    current = {name: np.asarray(a, np.float64) for name, a in weights.items()}
    velocity = {name: np.zeros_like(a) for name, a in current.items()}
    losses, tied = [], []
    for step in range(STEPS):
        x, y = data.batch(step)
        if seen is not None:
            layers.seen = [seen[f"pool{step}:{i}"] for i in range(len(layers.index))]
        loss, gradients = layers.loss(current, x, y)
        losses.append(loss)
        tied.append(dict(getattr(layers, "tied", {})))
        for name, gradient in gradients.items():
            velocity[name] = data.momentum * velocity[name] + gradient
            current[name] = current[name] - data.learning_rate * velocity[name]
    return np.asarray(losses), tied


def main(data_root, kept_path, dataset="mnist"):
    kept = np.load(kept_path)
    theano = np.asarray([float(kept[f"loss{s}"]) for s in range(STEPS)])
    hp = dict(contract.fair_hyperparameters(dataset), steps=STEPS)
    data = networks.FairData(contract.formats.load(dataset, data_root), dataset, hp, 1)
    weights = networks.initial_weights(dataset, 1)
    first, _ = train(fair.Layers(dataset, "first"), weights, data)
    every, tied_every = train(Judged(dataset), weights, data)
    judged = Judged(dataset)
    as_theano, tied = train(judged, weights, data, kept)
    print("step  Theano loss        |T - first|/first  |T - every|/every  |T - as Theano|/as Theano")
    for s in range(STEPS):
        print(f"{s:>4}  {theano[s]:.9f}  {abs(theano[s] - first[s]) / first[s]:17.2e}  "
              f"{abs(theano[s] - every[s]) / every[s]:17.2e}  {abs(theano[s] - as_theano[s]) / as_theano[s]:17.2e}")
    print("largest over the steps:", f"first {np.max(np.abs(theano - first) / first):.2e},",
          f"every {np.max(np.abs(theano - every) / every):.2e},",
          f"as Theano {np.max(np.abs(theano - as_theano) / as_theano):.2e}")
    print("\nmax-pooling windows with a tied maximum (reference float64 / Theano float32):")
    for s in range(STEPS):
        print(f"{s:>4}  " + "  ".join(f"{name}: {own:>6} / {theirs:>6}" for name, (own, theirs) in sorted(tied[s].items())))


if __name__ == "__main__":
    main(*sys.argv[1:])
