"""PyTorch adapter: GTDLBench's Torch7 default models, layer for layer, in PyTorch.

Framework ``pytorch``, a second opinion beside Lua Torch7 itself (framework
``torch``, which runs GTDLBench's own scripts).  PyTorch's default initialisation of Conv2d and Linear draws
weights and biases from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), which is exactly
Torch7's nn reset(), so no custom initialisation is needed for them.

CIFAR-10 follows torch/demos train-on-cifar/train-on-cifar.lua (model
'convnet'): RGB -> YUV, Y contrast-normalised locally, U and V globally, then
two nn.SpatialConvolutionMap stages with random connection tables.  A
connection table is a gather of the connected input planes and a grouped
convolution, so only the connected kernels exist and are computed.
Kept from the script: batch 1, lr 1e-3 with optim.sgd's learningRateDecay
(the script hard-codes 5e-7 in its SGD config; it has no option for it), no
momentum or weight decay, one-sample testing (a larger test batch would give
the same scores; batch 1 keeps the script's test cost).  Differs: the
training order is reshuffled each epoch from the seed (the script walks the
set in file order), as for MNIST; the random numbers (connection tables,
initial weights) are PyTorch's, not Torch7's.  The model and data are float64,
as the script's (it never sets a default tensor type); ``dtype=float32`` chooses
single precision.

The migration check exports the model with ``torch.onnx.export`` (the TorchScript
exporter, which needs no onnx package) as a module from pixels to log-probabilities:
the preprocessing of the robustness check (``model_input``), then the model.  The
preprocessing's float64 steps stay float64 in the graph: CIFAR-10's filters are matrix
products (``banded``), which onnxruntime computes in float64, where it has no float64
convolution.  For that reason a float64 model is exported as a float32 copy.
"""

import math

from dlbench_runner.torch_adapter import TorchAdapter

# image.gaussian1D defaults (sigma 0.25, amplitude 1, mean 0.5, not normalised).
GAUSSIAN_SIGMA = 0.25
# nn.SpatialDivisiveNormalization: local stds <= threshold become thresval.
DIVISIVE_THRESHOLD = 1e-4
# image.rgb2yuv, rows Y, U, V over columns R, G, B.
RGB_TO_YUV = ((0.299, 0.587, 0.114),
              (-0.14713, -0.28886, 0.436),
              (0.615, -0.51499, -0.10001))


def gaussian1d(size):
    """image.gaussian1D(size): amplitude * exp(-((i - center) / (sigma * size))^2 / 2)."""
    center = 0.5 * size + 0.5
    return [math.exp(-(((i - center) / (GAUSSIAN_SIGMA * size)) ** 2) / 2)
            for i in range(1, size + 1)]


def random_connection_table(nin, nout, nto, randperm):
    """nn.tables.random(nin, nout, nto) as (input plane, output plane) pairs, 0-based.

    Each output plane takes the next nto entries of a random permutation of
    the input planes; after floor(nin / nto) output planes the permutation is
    redrawn.  ``randperm(n)`` returns a permutation of range(n) as a list.
    """
    chunks = nin // nto
    perm, chunk, table = randperm(nin), 0, []
    for out in range(nout):
        table.extend((inp, out) for inp in perm[chunk * nto:(chunk + 1) * nto])
        chunk += 1
        if chunk == chunks:
            perm, chunk = randperm(nin), 0
    return table


def banded(taps, size):
    """The size x size matrix B for which B @ x @ B.T applies the 1-D kernel ``taps`` down
    and across a zero-padded size x size plane (a centred cross-correlation): row i holds
    the taps from column i - len(taps) // 2."""
    half = len(taps) // 2
    return [[taps[k - i + half] if abs(k - i) <= half else 0.0 for k in range(size)]
            for i in range(size)]


def connection_conv(torch):
    """The class of nn.SpatialConvolutionMap in PyTorch (built on demand: torch is
    imported only inside the container).

    A connection table's true work, not a dense convolution: the input planes each
    output plane is connected to are gathered (index_select) in output order, and a
    grouped convolution (one group per output plane) convolves each output's own
    inputs.  The weight is (outputs, inputs per output, kH, kW): only the connected
    kernels exist, as in Torch7's (connections, kH, kW) weight."""

    class ConnectionTableConv2d(torch.nn.Module):
        def __init__(self, table, nin, nout, kernel):
            super().__init__()
            inputs = [[inp for inp, out in table if out == o] for o in range(nout)]
            per_output = len(inputs[0])
            if any(len(planes) != per_output for planes in inputs):
                raise ValueError("a grouped convolution needs as many inputs for every output plane")
            self.table, self.nout, self.kernel_size = table, nout, (kernel, kernel)
            self.register_buffer("gather", torch.tensor([i for planes in inputs for i in planes]))
            self.weight = torch.nn.Parameter(torch.empty(nout, per_output, kernel, kernel))
            self.bias = torch.nn.Parameter(torch.empty(nout))
            self.connection_reset()

        def connection_reset(self):
            """SpatialConvolutionMap:reset(): U(-b, b), b = 1/sqrt(kW*kH*inputs of that
            output plane), for each connection's kernel and for the bias."""
            bound = 1.0 / math.sqrt(self.weight.shape[1] * self.kernel_size[0] * self.kernel_size[1])
            with torch.no_grad():
                self.weight.uniform_(-bound, bound)
                self.bias.uniform_(-bound, bound)

        def forward(self, x):
            return torch.nn.functional.conv2d(x.index_select(1, self.gather), self.weight, self.bias,
                                              groups=self.nout)

    return ConnectionTableConv2d


def sample_linear(torch):
    """nn.Linear that, for a batch of one, works as Torch7's nn.Linear on a single
    sample: addmv forward, ger (addr) for the weight gradient and mv for the
    input gradient.  PyTorch's own path (addmm with one row, and addmv's
    generic backward) costs about three times as much here, all of it in
    memory-bound copies of the 6400x128 weight's gradient."""

    class SampleLinearFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            return torch.addmv(bias, weight, x)

        @staticmethod
        def backward(ctx, grad):
            x, weight = ctx.saved_tensors
            grad_x = weight.t().mv(grad) if ctx.needs_input_grad[0] else None
            return grad_x, torch.ger(grad, x), grad

    class SampleLinear(torch.nn.Linear):
        def forward(self, x):
            if x.shape[0] == 1:
                return SampleLinearFunction.apply(x[0], self.weight, self.bias).unsqueeze(0)
            return torch.nn.functional.linear(x, self.weight, self.bias)

    return SampleLinear

class Adapter(TorchAdapter):
    # -- setup ---------------------------------------------------------------
    def setup(self):
        self.start()
        torch = self.torch
        arrays = self.ctx.load_data()
        if self.ctx.dataset == "mnist":
            self.train_x, self.test_x = self._mnist_inputs(arrays["train_images"], arrays["test_images"])
            self.model = self._mnist_model().to(self.device)
        elif self.ctx.dataset == "cifar10":
            # train_subset N > 0 (load_data): the first N training images, as the script's
            # non-full mode (trsize) does; the U/V statistics come from them too.
            # The script never sets a default tensor type: Torch7 trains it in float64.
            dtype = {"float64": torch.float64, "float32": torch.float32}[self.hp["dtype"]]
            self.train_x, self.test_x = (x.to(dtype) for x in
                                         self._cifar_inputs(arrays["train_images"], arrays["test_images"]))
            self.model = self._cifar_model().to(self.device, dtype)
        else:
            raise ValueError("no torch model for %s yet" % self.ctx.dataset)
        self.train_y = torch.from_numpy(arrays["train_labels"]).to(self.device)
        self.test_y = torch.from_numpy(arrays["test_labels"]).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.hp["learning_rate"],
                                         momentum=self.hp["momentum"],
                                         weight_decay=self.hp["weight_decay"])
        self.trainer = self.join(self.model)

    def _mnist_inputs(self, train, test):
        """Zero-pad 28x28 to 32x32 (as Torch7's mnist package), then normalise
        both sets by the training set's global mean and standard deviation (kept, for
        the robustness check's pixels: ``model_input``)."""
        torch = self.torch
        pad = torch.nn.functional.pad

        def prepare(images):
            x = torch.from_numpy(images.astype("float32")).unsqueeze(1)
            return pad(x, (2, 2, 2, 2))

        train_x, test_x = prepare(train), prepare(test)
        mean, std = train_x.mean(), train_x.std()
        self.normalise = lambda x: (pad(x.unsqueeze(1), (2, 2, 2, 2)) - mean.to(x.device)) / std.to(x.device)
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

    def _cifar_inputs(self, train, test):
        """train-on-cifar.lua's preprocessing, vectorised: RGB (0-255, as the script's
        raw bytes) -> YUV (image.rgb2yuv); Y through
        nn.SpatialContrastiveNormalization(1, image.gaussian1D(7)) -- as torch/nn's
        sources: y - smooth(y)/coef, then divided by sqrt(smooth(y^2))/coef with
        values <= 1e-4 replaced by 1e-4, where smooth is the normalised 7-tap kernel
        applied separably with zero padding and coef = smooth(ones); U and V minus
        the training set's mean, divided by minus its (unbiased) std -- the
        script's ``div(-std_u)``, a harmless sign flip kept for fidelity."""
        torch = self.torch
        taps = gaussian1d(7)
        total = sum(taps)
        # SpatialSubtractiveNormalization normalises the kernel in place
        band = torch.tensor(banded([t / total for t in taps], 32), dtype=torch.float64)

        def smooth(x):
            """The 1-D kernel applied separably over a zero-padded plane, as two matrix
            products (a float64 convolution has no onnxruntime kernel)."""
            b = band.to(x.device)
            return b.matmul(x).matmul(b.t())

        coef = smooth(torch.ones(1, 1, 32, 32, dtype=torch.float64))
        yuv_matrix = torch.tensor(RGB_TO_YUV, dtype=torch.float64)
        # std <= threshold becomes the threshold: the same as clamping smooth(y^2) at
        # (threshold * coef)^2 under the square root, where the root's gradient stays finite
        # (torch.max of two tensors: PyTorch 1.7's clamp_min takes a number only)
        floor = (DIVISIVE_THRESHOLD * coef) ** 2

        def yuv_normalised(rgb):
            """float64 RGB (0-255) -> YUV with Y normalised; differentiable."""
            here = coef.to(rgb.device)
            yuv = yuv_matrix.to(rgb.device).matmul(rgb.flatten(2)).reshape(-1, 3, 32, 32)
            y = yuv[:, :1]
            y = y - smooth(y) / here                                          # subtractive
            std = torch.max(smooth(y * y), floor.to(rgb.device)).sqrt() / here   # divisive
            return torch.cat([y / std, yuv[:, 1:]], dim=1)

        def prepare(images, chunk=5000):
            out = torch.empty(images.shape, dtype=torch.float32)
            for start in range(0, len(images), chunk):
                rgb = torch.from_numpy(images[start:start + chunk]).to(torch.float64)
                out[start:start + chunk] = yuv_normalised(rgb).to(torch.float32)
            return out

        train_x, test_x = prepare(train), prepare(test)
        stats = []
        for c in (1, 2):
            plane = train_x[:, c].double()
            mean, std = plane.mean(), plane.std()
            stats.append((mean, std))
            for x in (train_x, test_x):
                x[:, c].sub_(mean).div_(-std)

        def normalise(rgb):
            yuv = yuv_normalised(rgb.double()).to(torch.float32)
            planes = [yuv[:, :1]] + [(yuv[:, c:c + 1] - mean.float().to(rgb.device))
                                     / -std.float().to(rgb.device)
                                     for c, (mean, std) in zip((1, 2), stats)]
            return torch.cat(planes, dim=1)

        self.normalise = normalise
        return train_x.to(self.device), test_x.to(self.device)

    def _cifar_model(self):
        """train-on-cifar.lua, model 'convnet'; the connection tables are drawn from
        the job's seed (after torch.manual_seed, as the script draws them)."""
        torch = self.torch
        nn = torch.nn
        Conv, Linear = connection_conv(torch), sample_linear(torch)

        def randperm(n):
            return torch.randperm(n).tolist()

        return nn.Sequential(
            Conv(random_connection_table(3, 16, 1, randperm), 3, 16, 5), nn.Tanh(),
            nn.MaxPool2d(2, stride=2),
            Conv(random_connection_table(16, 256, 4, randperm), 16, 256, 5), nn.Tanh(),
            nn.MaxPool2d(2, stride=2),
            nn.Flatten(),
            Linear(256 * 5 * 5, 128), nn.Tanh(),
            Linear(128, 10),
            nn.LogSoftmax(dim=1),
        )

    # -- train: TorchAdapter's loop, with optim.sgd's learning-rate decay -----------
    def step_started(self, steps):
        """optim.sgd's learning-rate decay: lr / (1 + t * decay), t = steps so far."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.hp["learning_rate"] / (1 + steps * self.hp["learning_rate_decay"])

    # -- the robustness check: the model's view of [0, 1] pixels, by autograd ----------
    def model_input(self, pixels):
        """Pixels (MNIST N x 28 x 28, CIFAR-10 N x 3 x 32 x 32, in [0, 1]) -> the model's
        input, through the same preprocessing as training's, differentiably."""
        dtype = next(self.model.parameters()).dtype
        return self.normalise(pixels * 255).to(dtype)
