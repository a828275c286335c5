"""The fair profile in PyTorch, for every PyTorch framework (``fair.py`` says what is the same
everywhere; each framework's own ``fair.py`` names this ``Fair``).

Layouts: PyTorch's are the neutral file's own. ``nn.Conv2d`` weights are (out, in, kH,
kW), ``nn.Linear`` weights (out, in), and ``Tensor.view(N, -1)`` flattens N x C x H x W
channel by channel, then row, then column: the weights load as they are.  Pooling:
``ceil_mode=True`` gives Caffe's output size, and an average window cut at the border
divides by the inputs it covers (with no padding PyTorch's divisor is the clipped
window).  The step is ``torch.optim.SGD`` with ``momentum`` and no dampening: ``v =
momentum * v + gradient; w = w - lr * v``, the neutral rule.  Deterministic algorithms
are asked for (``torch.use_deterministic_algorithms``; 1.7's ``set_deterministic``).
"""

import numpy as np

from .torch_adapter import TorchAdapter


class Fair(TorchAdapter):

    def setup(self):
        self.start(seed=False)          # the weights and batches are the fair profile's
        torch = self.torch
        deterministic = getattr(torch, "use_deterministic_algorithms", None) or torch.set_deterministic
        deterministic(True)
        self.data = self.ctx.fair_data()
        self.model = network(torch, self.data.network, self.ctx.fair_weights()).to(self.device)
        with torch.no_grad():
            probe = self.model(torch.from_numpy(self.data.probe_x).to(self.device))
        self.ctx.fair_logits(probe.cpu().numpy())
        self.trainer = self.join(self.model)

    def train(self):
        torch, data, ctx = self.torch, self.data, self.ctx
        optimizer = torch.optim.SGD(self.model.parameters(), lr=data.learning_rate,
                                    momentum=data.momentum, dampening=0, weight_decay=0)
        self.model.train()
        ctx.epoch_start()
        world, sums = ctx.world, []
        for step in range(data.steps):
            images, labels = data.batch(step)
            if world is not None:       # this worker's share; its loss counts by its size
                scale, size = world.scale(len(labels)), len(labels)
                images, labels = world.shard(images), world.shard(labels)
            images = torch.from_numpy(images).to(self.device)
            labels = torch.from_numpy(labels).to(self.device)
            output = self.trainer(images)
            loss = torch.nn.functional.cross_entropy(output, labels)
            optimizer.zero_grad()
            (loss if world is None else loss * scale).backward()
            optimizer.step()
            if world is None:
                ctx.fair_step(step, loss.item(), (output.argmax(1) == labels).sum().item())
            else:               # the batch's mean loss: the workers' sums, added once trained
                sums.append(torch.stack([loss.detach().double() * len(labels) / size,
                                         (output.argmax(1) == labels).sum().double()]))
        if sums:
            total, = self.summed(torch.stack(sums))
            losses, corrects = total.t()
            for step in range(data.steps):
                ctx.fair_step(step, losses[step].item(), int(corrects[step].item()))
        ctx.fair_trained(data.steps)

    def op_passes(self, spec, weights, x, g, input_grad):
        """A layer's (or the network's) forward pass in training mode, and that forward and
        backward pass from ``g`` (``ops.py``); the input takes a gradient where training's
        would (``input_grad``), the parameters' are cleared first, as ``zero_grad`` does."""
        torch = self.torch
        model = network(torch, spec, weights).to(self.device)
        model.train()
        x = torch.from_numpy(x).to(self.device).requires_grad_(input_grad)
        g = torch.from_numpy(g).to(self.device)
        parameters = list(model.parameters())

        def forward():
            model(x)

        def forward_backward():
            for p in parameters:
                p.grad = None
            x.grad = None
            model(x).backward(g)
        return forward, forward_backward

    def test(self):
        torch = self.torch
        self.model.eval()
        with torch.no_grad():
            return self.data.test_scores(
                lambda images: self.model(torch.from_numpy(images).to(self.device)).cpu().numpy())


def network(torch, spec, weights):
    """The fair network as an ``nn.Sequential`` holding ``weights`` (neutral layout)."""
    nn = torch.nn
    layers, flat = [], False
    for layer in spec["layers"]:
        kind = layer["kind"]
        if kind == "conv":
            module = nn.Conv2d(layer["in"], layer["out"], layer["kernel"], padding=layer["pad"])
        elif kind == "pool":
            pool = nn.MaxPool2d if layer["mode"] == "max" else nn.AvgPool2d
            module = pool(layer["kernel"], layer["stride"], ceil_mode=True)
        elif kind == "relu":
            module = nn.ReLU()
        else:
            if not flat:
                layers.append(nn.Flatten())
                flat = True
            module = nn.Linear(layer["in"], layer["out"])
        if kind in ("conv", "linear"):
            with torch.no_grad():
                module.weight.copy_(torch.from_numpy(np.ascontiguousarray(weights[layer["name"] + ".weight"])))
                module.bias.copy_(torch.from_numpy(np.ascontiguousarray(weights[layer["name"] + ".bias"])))
        layers.append(module)
    return nn.Sequential(*layers)
