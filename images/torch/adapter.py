"""Torch adapter: GTDLBench's Torch7 default models, layer for layer, in PyTorch.

Lua Torch7 cannot be installed any more, so the models of its demo scripts are
rebuilt here.  PyTorch's default initialisation of Conv2d and Linear draws
weights and biases from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), which is exactly
Torch7's nn reset(), so no custom initialisation is needed.
"""


class Adapter:
    def __init__(self, ctx):
        self.ctx = ctx
        self.hp = ctx.hp

    # -- setup ---------------------------------------------------------------
    def setup(self):
        import torch
        self.torch = torch
        if self.ctx.threads:
            torch.set_num_threads(self.ctx.threads)
        torch.manual_seed(self.ctx.seed)
        self.device = torch.device("cuda" if self.ctx.device.startswith("cuda") else "cpu")
        arrays = self.ctx.load_data()
        if self.ctx.dataset != "mnist":
            raise ValueError("no torch model for %s yet" % self.ctx.dataset)
        self.train_x, self.test_x = self._mnist_inputs(arrays["train_images"], arrays["test_images"])
        self.train_y = torch.from_numpy(arrays["train_labels"]).to(self.device)
        self.test_y = torch.from_numpy(arrays["test_labels"]).to(self.device)
        self.model = self._mnist_model().to(self.device)
        self.criterion = torch.nn.NLLLoss()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.hp["learning_rate"],
                                         momentum=self.hp["momentum"],
                                         weight_decay=self.hp["weight_decay"])

    def _mnist_inputs(self, train, test):
        """Zero-pad 28x28 to 32x32 (as Torch7's mnist package), then normalise
        both sets by the training set's global mean and standard deviation."""
        torch = self.torch
        pad = torch.nn.functional.pad

        def prepare(images):
            x = torch.from_numpy(images.astype("float32")).unsqueeze(1)
            return pad(x, (2, 2, 2, 2))

        train_x, test_x = prepare(train), prepare(test)
        mean, std = train_x.mean(), train_x.std()
        return ((train_x - mean) / std).to(self.device), ((test_x - mean) / std).to(self.device)

    def _mnist_model(self):
        """train-on-mnist.lua, model 'convnet'."""
        nn = self.torch.nn
        return nn.Sequential(
            nn.Conv2d(1, 32, 5), nn.Tanh(),
            nn.MaxPool2d(3, stride=3, padding=1),
            nn.Conv2d(32, 64, 5), nn.Tanh(),
            nn.MaxPool2d(2, stride=2),
            nn.Flatten(),
            nn.Linear(64 * 3 * 3, 200), nn.Tanh(),
            nn.Linear(200, 10),
            nn.LogSoftmax(dim=1),
        )

    # -- train ---------------------------------------------------------------
    def train(self):
        torch, hp = self.torch, self.hp
        batch, n = hp["batch_size"], len(self.train_y)
        generator = torch.Generator().manual_seed(self.ctx.seed)
        steps = 0
        self.model.train()
        for epoch in range(1, hp["epochs"] + 1):
            self.ctx.epoch_start()
            order = torch.randperm(n, generator=generator).to(self.device)
            loss_sum = torch.zeros((), device=self.device)
            correct = torch.zeros((), dtype=torch.long, device=self.device)
            for i, start in enumerate(range(0, n, batch)):
                index = order[start:start + batch]
                x, y = self.train_x[index], self.train_y[index]
                # optim.sgd's learning-rate decay: lr / (1 + t * decay), t = steps so far.
                for group in self.optimizer.param_groups:
                    group["lr"] = hp["learning_rate"] / (1 + steps * hp["learning_rate_decay"])
                self.optimizer.zero_grad()
                output = self.model(x)
                loss = self.criterion(output, y)
                loss.backward()
                self.optimizer.step()
                steps += 1
                loss_sum += loss.detach() * len(index)
                correct += (output.argmax(1) == y).sum()
                if i % 200 == 0:
                    self.ctx.progress(epoch, start / n, loss.item())
            self.ctx.epoch_done(epoch, loss_sum.item() / n, correct.item() / n, samples=n)
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # -- test ----------------------------------------------------------------
    def test(self):
        torch = self.torch
        batch, n = self.hp["test_batch_size"], len(self.test_y)
        self.model.eval()
        loss_sum, correct = 0.0, 0
        with torch.no_grad():
            for start in range(0, n, batch):
                x, y = self.test_x[start:start + batch], self.test_y[start:start + batch]
                output = self.model(x)
                loss_sum += torch.nn.functional.nll_loss(output, y, reduction="sum").item()
                correct += (output.argmax(1) == y).sum().item()
        return {"accuracy": correct / n, "loss": loss_sum / n}

    # -- describe ------------------------------------------------------------
    def describe(self):
        torch = self.torch
        import numpy
        cuda = self.device.type == "cuda"
        return {
            "framework_version": torch.__version__,
            "param_count": sum(p.numel() for p in self.model.parameters() if p.requires_grad),
            "device_name": torch.cuda.get_device_name(self.device) if cuda else None,
            "threads": {"requested": self.ctx.threads,
                        "framework": {"torch.get_num_threads": torch.get_num_threads(),
                                      "torch.get_num_interop_threads": torch.get_num_interop_threads()}},
            "libraries": {"numpy": numpy.__version__, "cuda": torch.version.cuda,
                          "cudnn": torch.backends.cudnn.version() if cuda else None},
        }
