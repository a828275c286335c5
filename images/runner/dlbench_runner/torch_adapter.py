"""What every PyTorch adapter shares: the ``pytorch`` framework's (PyTorch 1.7, GTDLBench's
Torch7 models) and ``pytorch2``'s (current PyTorch, its own examples' models).

A subclass builds its model and data (``setup``, with ``start`` first), trains it
(``train``) and gives the model's view of [0, 1] pixels (``model_input``); the rest of the
adapter contract is here: several workers through DistributedDataParallel over gloo, the
test pass, the robustness check's gradients by autograd, the migration check's export by
``torch.onnx``, saving and describing.  The model's outputs are log-probabilities (it ends
in ``LogSoftmax``): the test's and the attacks' loss is the negative log-likelihood.

Imported by those adapters alone, inside images (and native environments) that have torch:
the runner's other modules and the host never import it.  It runs on PyTorch 1.7 and 2.x.
"""

import os
import warnings


class TorchAdapter:
    def __init__(self, ctx):
        self.ctx = ctx
        self.hp = ctx.hp

    def start(self, seed=True):
        """torch imported, its threads set from the job's (``omp_threads``), the job's seed
        drawn (``seed``) and the job's device chosen; before the model is built."""
        import torch
        self.torch = torch
        if self.ctx.omp_threads:
            torch.set_num_threads(self.ctx.omp_threads)
        if seed:
            torch.manual_seed(self.ctx.seed)
        self.device = torch.device("cpu" if self.ctx.gpu is None else "cuda:%d" % self.ctx.gpu)

    # -- several workers (ctx.world): DistributedDataParallel over gloo --------
    def join(self, model):
        """The module a training step runs: the model itself, or, in a job of several
        workers, the model wrapped by DistributedDataParallel once this worker has joined
        the others (gloo, over TCP to worker 0).  DDP starts every worker from worker 0's
        weights and averages the gradients in the backward pass."""
        world = self.ctx.world
        if world is None:
            return model
        import datetime
        dist = self.torch.distributed
        dist.init_process_group("gloo", init_method="tcp://%s:%d" % (world.host, world.port),
                                rank=world.rank, world_size=world.size,
                                timeout=datetime.timedelta(seconds=world.timeout_s))
        self.engine = {"dist_engine": "DistributedDataParallel", "dist_backend": dist.get_backend()}
        return self.torch.nn.parallel.DistributedDataParallel(model)

    def shard(self, index):
        """This worker's indices of a global batch and its loss's scale (1 alone).  A worker
        whose share is empty (a last batch smaller than the workers) steps on one image with
        scale 0: DDP's backward needs every worker."""
        world = self.ctx.world
        if world is None:
            return index, 1.0
        mine = world.shard(index)
        return (mine, world.scale(len(index))) if len(mine) else (index[:1], 0.0)

    def summed(self, *values):
        """The values (tensors) summed over the workers (alone: as they are)."""
        if self.ctx.world is None:
            return values
        both = self.torch.stack([v.to(self.torch.float64) for v in values])
        self.torch.distributed.all_reduce(both)
        return tuple(both)

    def gather(self, value):
        torch = self.torch
        mine = torch.tensor([float(value)], dtype=torch.float64)
        every = [torch.zeros_like(mine) for _ in range(self.ctx.world.size)]
        torch.distributed.all_gather(every, mine)
        return [float(v) for v in every]

    def leave(self):
        self.torch.distributed.destroy_process_group()

    # -- train ---------------------------------------------------------------
    def train(self):
        """The training loop every PyTorch model here takes: ``epochs`` passes over the
        training set (``train_x``, ``train_y``, on the device), each in an order drawn from the
        job's seed, a global batch a step (this worker's share of it), the negative
        log-likelihood of the model's log-probabilities, ``self.optimizer``'s step.  The
        models' own parts: ``step_started(steps)`` before each step (a learning rate that
        follows the steps), ``epoch_ended()`` after each epoch (a schedule by epochs)."""
        torch, hp, ctx = self.torch, self.hp, self.ctx
        batch, n = hp["batch_size"], len(self.train_y)
        generator = torch.Generator().manual_seed(ctx.seed)
        steps = 0
        self.model.train()
        for epoch in range(1, hp["epochs"] + 1):
            ctx.epoch_start()
            order = torch.randperm(n, generator=generator).to(self.device)
            loss_sum = torch.zeros((), device=self.device)
            correct = torch.zeros((), dtype=torch.long, device=self.device)
            for i, start in enumerate(range(0, n, batch)):
                index, scale = self.shard(order[start:start + batch])
                x, y = self.train_x[index], self.train_y[index]
                self.step_started(steps)
                self.optimizer.zero_grad(set_to_none=True)
                output = self.trainer(x)
                loss = torch.nn.functional.nll_loss(output, y)
                (loss * scale if scale != 1.0 else loss).backward()
                self.optimizer.step()
                steps += 1
                if scale:
                    loss_sum += loss.detach() * len(index)
                    correct += (output.argmax(1) == y).sum()
                # .item() waits for the step (on a GPU): every 200 steps, and the last
                if i % 200 == 0 or start + batch >= n:
                    ctx.progress(epoch, start / n, loss.item(), step=steps)
            self.epoch_ended()
            loss_sum, correct = self.summed(loss_sum, correct)
            ctx.epoch_done(epoch, loss_sum.item() / n, correct.item() / n, samples=n)

    def step_started(self, steps):
        """Before the step that follows ``steps`` steps: nothing, unless a model says."""

    def epoch_ended(self):
        """After an epoch: nothing, unless a model says."""

    def synchronize(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    # -- test ----------------------------------------------------------------
    def test(self):
        torch = self.torch
        batch, n = self.hp["test_batch_size"], len(self.test_y)
        self.model.eval()
        loss_sum, correct, predicted = 0.0, 0, []
        with torch.no_grad():
            for start in range(0, n, batch):
                x, y = self.test_x[start:start + batch], self.test_y[start:start + batch]
                output = self.model(x)
                loss_sum += torch.nn.functional.nll_loss(output, y, reduction="sum").item()
                classes = output.argmax(1)
                correct += (classes == y).sum().item()
                predicted.append(classes)
        return {"accuracy": correct / n, "loss": loss_sum / n,
                "predictions": torch.cat(predicted).cpu().numpy() if predicted else None}

    def _pixels(self, pixels, grad=False):
        x = self.torch.from_numpy(pixels).to(self.device, self.torch.float64 if pixels.dtype == "float64"
                                                 else self.torch.float32)
        return x.requires_grad_(grad)

    def input_gradient(self, pixels, labels):
        """torch.autograd.grad of the summed NLL loss (the training criterion's) with
        respect to the pixels; and the classes predicted for them."""
        torch = self.torch
        self.model.eval()
        x = self._pixels(pixels, grad=True)
        output = self.model(self.model_input(x))
        y = torch.from_numpy(labels).to(self.device)
        loss = torch.nn.functional.nll_loss(output, y, reduction="sum")
        gradient, = torch.autograd.grad(loss, x)
        return gradient.cpu().numpy(), output.argmax(1).cpu().numpy()

    def input_vjp(self, pixels, output_gradient):
        """torch.autograd.grad of the model's outputs (its log-probabilities, whose softmax
        is its probabilities) with respect to the pixels, weighted by
        ``output_gradient(outputs)``: their vector-Jacobian product; and the classes
        predicted."""
        torch = self.torch
        self.model.eval()
        x = self._pixels(pixels, grad=True)
        output = self.model(self.model_input(x))
        g = torch.as_tensor(output_gradient(output.detach().cpu().numpy()))
        gradient, = torch.autograd.grad(output, x, grad_outputs=g.to(output.device, output.dtype))
        return gradient.cpu().numpy(), output.argmax(1).cpu().numpy()

    def predict(self, pixels):
        self.model.eval()
        with self.torch.no_grad():
            return self.model(self.model_input(self._pixels(pixels))).argmax(1).cpu().numpy()

    def loss(self, pixels, labels):
        torch = self.torch
        self.model.eval()
        with torch.no_grad():
            output = self.model(self.model_input(self._pixels(pixels)))
            y = torch.from_numpy(labels).to(self.device)
            return float(torch.nn.functional.nll_loss(output, y, reduction="sum"))

    # -- migration: the model from pixels, exported by torch.onnx ----------------------
    def logits(self, pixels):
        """The model's log-probabilities for the pixels, as the exported graph gives them."""
        self.model.eval()
        with self.torch.no_grad():
            return self.model(self.model_input(self._pixels(pixels))).cpu().numpy()

    def export_onnx(self, path, pixels):
        """torch.onnx.export (opset 12) of pixels -> ``model_input`` -> the model, traced on
        ``pixels`` with the batch dimension free.  A float64 model is exported as a float32
        copy (its input cast to float32 after the float64 preprocessing), onnxruntime having
        no float64 convolution; the copy's weights are the model's, rounded."""
        import copy

        torch = self.torch
        adapter, model = self, self.model
        if next(model.parameters()).dtype == torch.float64:
            model = copy.deepcopy(model).float()

        class FromPixels(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, x):
                return self.model(adapter.model_input(x).to(next(self.model.parameters()).dtype))

        exported = FromPixels().eval()
        with torch.no_grad(), warnings.catch_warnings():
            # a model that tests its batch size (pytorch's SampleLinear): the trace takes
            # the batch's branch, the one every batch but a single image takes
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(exported, self._pixels(pixels), path, opset_version=12,
                              input_names=["pixels"], output_names=["log_probabilities"],
                              dynamic_axes={"pixels": {0: "images"}, "log_probabilities": {0: "images"}},
                              **self._torchscript_exporter())

    def _torchscript_exporter(self):
        """The arguments that keep ``torch.onnx.export`` on the TorchScript exporter with the
        weights inside the one file: from PyTorch 2.9 it defaults to the dynamo exporter,
        which writes the weights to a second file (``external_data``); PyTorch 1.7 has
        neither argument."""
        import inspect

        parameters = inspect.signature(self.torch.onnx.export).parameters
        return {name: False for name in ("dynamo", "external_data") if name in parameters}

    # -- save ----------------------------------------------------------------
    def save(self, folder):
        """torch.save of the model's state_dict, as PyTorch's own tutorials save a model."""
        self.torch.save(self.model.state_dict(), os.path.join(folder, "model.pt"))

    # -- describe ------------------------------------------------------------
    def describe(self):
        torch = self.torch
        import numpy
        cuda = self.device.type == "cuda"
        return {
            "framework_version": torch.__version__,
            "param_count": self._param_count(),
            "param_bytes": sum(p.numel() * p.element_size() for p in self.model.parameters()
                               if p.requires_grad),
            "device_name": torch.cuda.get_device_name(self.device) if cuda else None,
            "threads": {"requested": self.ctx.threads,
                        "framework": {"torch.get_num_threads": torch.get_num_threads(),
                                      "torch.get_num_interop_threads": torch.get_num_interop_threads()}},
            "libraries": {"numpy": numpy.__version__, "cuda": torch.version.cuda,
                          "cudnn": torch.backends.cudnn.version() if cuda else None},
            **getattr(self, "engine", {}),
        }

    def _param_count(self):
        """Trainable parameters (a connection-table convolution holds only its connected kernels)."""
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)
