"""PyTorch 2 adapter: PyTorch's own example models, eager or compiled.

Framework ``pytorch2``: the PyTorch a person picks today, beside ``pytorch`` (PyTorch 1.7
training GTDLBench's Torch7 models).  Its default models are PyTorch's own examples for the
two data sets, as GTDLBench took each framework's own example models:

- MNIST, ``pytorch-examples-mnist``: pytorch/examples ``mnist/main.py``'s ``Net``: 3x3
  convolutions of 32 and 64 planes with ReLU, 2x2 max pooling, dropout 0.25, a linear layer
  of 128 units with ReLU, dropout 0.5, 10 outputs and log-softmax; the negative
  log-likelihood, Adadelta at learning rate 1.0 with ``StepLR`` (x 0.7 after every epoch),
  batch 64, test batch 1,000, 14 epochs, the pixels normalised by 0.1307 and 0.3081.
- CIFAR-10, ``pytorch-cifar10-tutorial``: the tutorial "Training a Classifier"
  (``beginner_source/blitz/cifar10_tutorial.py``): 5x5 convolutions of 6 and 16 planes,
  each with ReLU and 2x2 max pooling, linear layers of 120 and 84 units with ReLU, 10
  outputs; cross-entropy, SGD at 0.001 with momentum 0.9, batch 4, 2 epochs, each channel
  normalised by 0.5 and 0.5.

Kept from them: the networks, their initialisation (PyTorch's defaults), losses, optimisers,
schedules, batches and normalisations.  Differs: the images come from dlbench's readers, not
torchvision (the same pixels: ``ToTensor``'s x / 255, then ``Normalize``); the training
order is drawn from the job's seed each epoch, as ``DataLoader(shuffle=True)`` draws it;
the CIFAR-10 network ends in ``LogSoftmax`` and trains on the negative log-likelihood, which
is the tutorial's ``CrossEntropyLoss`` of its logits; the model is tested once, after
training (the MNIST example tests after every epoch: dlbench times the test pass apart).

``compile`` (``--set compile=true``): the module each training step runs goes through
``torch.compile`` (Inductor, which compiles C++ on the CPU).  It compiles lazily, at its
first call: setup calls it on the first batch's forward and backward pass (and on a last,
smaller batch where an epoch ends in one), with the random state put back and the
gradients cleared after, and that time is the row's ``compile_time_s`` (part of setup,
none of training).  Testing and the checks after training run the eager model.  The
compiled graph draws its dropout masks its own way, so an eager and a compiled run of the
same seed are not the same step for step.
"""

import os
import time

from dlbench_runner.torch_adapter import TorchAdapter

NORMALISATION = {"mnist": ((0.1307,), (0.3081,)), "cifar10": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))}


def mnist_net(torch):
    """pytorch/examples mnist/main.py's Net, as an nn.Sequential (the same layers in order)."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, 1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, 1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(0.25),
        nn.Flatten(),
        nn.Linear(9216, 128), nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(128, 10),
        nn.LogSoftmax(dim=1),
    )


def cifar_net(torch):
    """The CIFAR-10 tutorial's Net, ending in log-softmax (its loss is the cross-entropy)."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10),
        nn.LogSoftmax(dim=1),
    )


class Adapter(TorchAdapter):

    def setup(self):
        self.start()
        torch, ctx = self.torch, self.ctx
        if ctx.dataset not in NORMALISATION:
            raise ValueError("no pytorch2 model for %s" % ctx.dataset)
        mean, std = NORMALISATION[ctx.dataset]
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)
        self.model = (mnist_net if ctx.dataset == "mnist" else cifar_net)(torch).to(self.device)
        arrays = ctx.load_data()
        self.train_x = self._inputs(arrays["train_images"])
        self.test_x = self._inputs(arrays["test_images"])
        self.train_y = torch.from_numpy(arrays["train_labels"]).long().to(self.device)
        self.test_y = torch.from_numpy(arrays["test_labels"]).long().to(self.device)
        self.optimizer, self.schedule = self._optimizer()
        self.trainer = self.join(self.model)
        if self.hp["compile"]:
            self.trainer = self._compiled(self.trainer)

    def _inputs(self, images):
        """uint8 images -> ``ToTensor`` (x / 255, N x C x H x W) -> ``Normalize``."""
        return self.model_input(self.torch.from_numpy(images).float().div_(255)).to(self.device)

    def model_input(self, pixels):
        """[0, 1] pixels (MNIST N x 28 x 28, CIFAR-10 N x 3 x 32 x 32) -> the model's input,
        in the model's precision (the gradient check hands float64 pixels)."""
        x = pixels.unsqueeze(1) if pixels.dim() == 3 else pixels
        x = (x - self.mean.to(x.device, x.dtype)) / self.std.to(x.device, x.dtype)
        return x.to(next(self.model.parameters()).dtype)

    def _compiled(self, module):
        """``torch.compile(module)``, compiled now on the shapes training will give it."""
        torch, hp = self.torch, self.hp
        scratch = os.environ.get("DLBENCH_COMPILE_DIR")
        if scratch:         # where the kernels Inductor builds may be loaded from (/tmp: noexec)
            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(scratch, "inductor"))
        compiled = torch.compile(module)
        n, batch = len(self.train_y), hp["batch_size"]
        sizes = [min(batch, n)] + ([n % batch] if n % batch else [])
        state = torch.random.get_rng_state()
        started = time.perf_counter()
        self.model.train()
        for size in sizes:
            index, _ = self.shard(torch.arange(size, device=self.device))
            output = compiled(self.train_x[index])
            torch.nn.functional.nll_loss(output, self.train_y[index]).backward()
        self.synchronize()
        self.ctx.compile_time_s = time.perf_counter() - started
        for parameter in self.model.parameters():
            parameter.grad = None
        torch.random.set_rng_state(state)
        return compiled

    def _optimizer(self):
        """The example's optimiser and schedule (None: a constant learning rate)."""
        torch, hp = self.torch, self.hp
        if self.ctx.dataset == "mnist":
            optimizer = torch.optim.Adadelta(self.model.parameters(), lr=hp["learning_rate"])
            return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=hp["gamma"])
        return torch.optim.SGD(self.model.parameters(), lr=hp["learning_rate"], momentum=hp["momentum"]), None

    # -- train: TorchAdapter's loop, with the MNIST example's schedule ----------------
    def epoch_ended(self):
        if self.schedule is not None:
            self.schedule.step()
