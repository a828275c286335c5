"""MXNet adapter: MXNet's own image-classification examples.

GTDLBench lists MXNet but published no MXNet model, command or number; dlbench
trains MXNet's own example scripts, ``example/image-classification``
(branch v1.x): ``train_mnist.py`` and ``train_cifar10.py``, both training with
``common/fit.py`` (``mx.mod.Module`` and ``Module.fit``).  The networks are
rebuilt here as MXNet symbols following ``symbols/lenet.py`` and
``symbols/resnet.py`` operator for operator, with the same operator names, and
trained with a Module exactly as ``fit.fit`` sets it up; only the loop is
written out (so that epochs can be timed and progress reported).

What fit.py sets up, kept here:
- optimizer ``sgd`` with ``momentum`` (--mom 0.9), ``wd`` (--wd 0.0001),
  ``multi_precision`` True, and a ``MultiFactorScheduler`` stepping the rate by
  ``lr_factor`` (--lr-factor 0.1) at ``lr_step_epochs`` epochs, counted in
  updates of ``ceil(num_examples / batch_size)`` per epoch;
- the initializer fit.py picks by default for these networks:
  ``Xavier(rnd_type='gaussian', factor_type='in', magnitude=2)`` (biases and
  BatchNorm betas zero, gammas one, by MXNet's name-based dispatch);
- a ``device`` kvstore object passed to the Module, as fit.py passes it, so the
  optimizer runs as an update on the kvstore; Module scales gradients by
  1/batch_size and MXNet's optimizer exempts ``*_bias`` and ``*_beta`` from
  weight decay (wd_mult 0), as in the original.

MNIST, ``train_mnist.py`` with ``--network lenet`` (the script's own default
network is ``mlp``; dlbench chooses LeNet, the study's MNIST model): pixels / 255, batch 64, lr 0.05,
step 0.1 at epoch 10, 20 epochs; ``NDArrayIter(shuffle=True)``, whose default
``last_batch_handle='pad'`` fills the last batch of an epoch from its start
(938 batches, 60,032 images an epoch).

CIFAR-10, ``train_cifar10.py``: ResNet-110 (``--num-layers 110``,
``--image-shape 3,28,28``: the CIFAR variant with 3 stages of 18 basic (not
bottleneck) pre-activation units of 16, 32 and 64 filters), batch 128, lr 0.05,
steps at epochs 200 and 250, 300 epochs.  Its data iterator is
``ImageRecordIter`` (common/data.py, ``set_data_aug_level(parser, 2)``); the
transformation of ``src/io/image_aug_default.cc`` is done here in numpy, per
image, in the augmenter's order:
pad 4 pixels with fill value 127, random 28x28 crop, random HLS shift (OpenCV's
8-bit HLS: H by int(U(-36, 36)) clamped to [0, 180], L and S by
int(U(-50, 50)) clamped to [0, 255]), random horizontal mirror, then minus the
RGB mean (123.68, 116.779, 103.939; --rgb-std 1,1,1, scale 1).  The test
images are the centre 28x28 crop minus the same mean, as the validation
iterator (rand_crop 0, no pad) makes them.  Each epoch is reshuffled and, as
the iterator's round_batch does, its last batch filled from its start (391
batches, 50,048 images).

Which version of the scripts: in GTDLBench's time (2017-18) train_cifar10.py
calls ``set_data_aug_level(parser, 2)``; the last v1.x scripts comment the
augmentation out (``# set_cifar_aug(parser)``) and default
random crop and mirror to 0.  dlbench keeps the level-2 augmentation that
the scripts had in MXNet 1.0's time.  train_mnist.py's lr was .006 in its 2016 version and
.05 from 2017 on (v1.x); dlbench uses .05.

Quick profile: the same models, one epoch cut to ``max_batches`` batches:
200 of 64 for LeNet (about 0.967), 100 of 128 for ResNet-110 (about 0.25 to 0.30;
its test accuracy still swings a lot so early, as BatchNorm's moving statistics
trail weights that move fast at lr 0.05).

How dlbench differs, and why:
- The data come from the canonical files as numpy arrays, not from
  ``.rec`` files with OpenCV decoding; the augmentation is the augmenter's,
  rewritten in numpy (the original's random stream cannot be reproduced).
- fit.py scores the validation set after every epoch; dlbench tests once,
  after training, over exactly the 10,000 test images (the original's padded
  last batch counts some images twice).
- ``max_batches`` (0 = all, the paper setting) limits the batches of each epoch,
  for the quick profile only; the learning-rate steps stay counted in full
  epochs, as fit.py counts them.
- No Speedometer logging or checkpoints; the runner times the phases.
"""

import ctypes
import math
import os

# MXNet's engine reads this when it starts: one scheduling thread for CPU
# operators (MXNet's default), each of them parallel with OMP_NUM_THREADS,
# which the runner sets from the job's thread count before mxnet is imported.
os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")

# OpenCV's HLS2RGB: for each hue sector, which of (p2, p1, falling, rising)
# feeds R, G and B.
HLS_SECTORS = ((0, 3, 1), (2, 0, 1), (1, 0, 3), (1, 2, 0), (3, 1, 0), (0, 1, 2))


# -- networks ----------------------------------------------------------------------
def lenet_symbol(mx, num_classes=10):
    """symbols/lenet.py (without the optional spatial transformer)."""
    sym = mx.sym
    data = sym.Variable("data")
    conv1 = sym.Convolution(data=data, kernel=(5, 5), num_filter=20)
    tanh1 = sym.Activation(data=conv1, act_type="tanh")
    pool1 = sym.Pooling(data=tanh1, pool_type="max", kernel=(2, 2), stride=(2, 2))
    conv2 = sym.Convolution(data=pool1, kernel=(5, 5), num_filter=50)
    tanh2 = sym.Activation(data=conv2, act_type="tanh")
    pool2 = sym.Pooling(data=tanh2, pool_type="max", kernel=(2, 2), stride=(2, 2))
    flatten = sym.Flatten(data=pool2)
    fc1 = sym.FullyConnected(data=flatten, num_hidden=500)
    tanh3 = sym.Activation(data=fc1, act_type="tanh")
    fc2 = sym.FullyConnected(data=tanh3, num_hidden=num_classes)
    return sym.SoftmaxOutput(data=fc2, name="softmax")


def resnet_config(num_layers, image_shape):
    """symbols/resnet.py get_symbol() for small images: (units per stage,
    filter list, bottleneck).  Pure Python, so the host can check it."""
    channels, height, width = image_shape
    if height > 28:
        raise ValueError("only the CIFAR variant (image height <= 28) is built here, not %s"
                         % (image_shape,))
    if (num_layers - 2) % 9 == 0 and num_layers >= 164:
        return [(num_layers - 2) // 9] * 3, [16, 64, 128, 256], True
    if (num_layers - 2) % 6 == 0 and num_layers < 164:
        return [(num_layers - 2) // 6] * 3, [16, 16, 32, 64], False
    raise ValueError("no experiments done on num_layers %d (resnet.py)" % num_layers)


def _bn(mx, data, name, bn_mom):
    return mx.sym.BatchNorm(data=data, fix_gamma=False, eps=2e-5, momentum=bn_mom, name=name)


def residual_unit(mx, data, num_filter, stride, dim_match, name, bottle_neck, bn_mom=0.9,
                  workspace=256):
    """resnet.py residual_unit(): pre-activation (BN, ReLU, conv) units; the
    shortcut is a 1x1 convolution of the first activation where shapes change."""
    sym = mx.sym
    bn1 = _bn(mx, data, name + "_bn1", bn_mom)
    act1 = sym.Activation(data=bn1, act_type="relu", name=name + "_relu1")
    if bottle_neck:
        quarter = int(num_filter * 0.25)
        conv1 = sym.Convolution(data=act1, num_filter=quarter, kernel=(1, 1), stride=(1, 1),
                                pad=(0, 0), no_bias=True, workspace=workspace, name=name + "_conv1")
        act2 = sym.Activation(data=_bn(mx, conv1, name + "_bn2", bn_mom), act_type="relu",
                              name=name + "_relu2")
        conv2 = sym.Convolution(data=act2, num_filter=quarter, kernel=(3, 3), stride=stride,
                                pad=(1, 1), no_bias=True, workspace=workspace, name=name + "_conv2")
        act3 = sym.Activation(data=_bn(mx, conv2, name + "_bn3", bn_mom), act_type="relu",
                              name=name + "_relu3")
        body = sym.Convolution(data=act3, num_filter=num_filter, kernel=(1, 1), stride=(1, 1),
                               pad=(0, 0), no_bias=True, workspace=workspace, name=name + "_conv3")
    else:
        conv1 = sym.Convolution(data=act1, num_filter=num_filter, kernel=(3, 3), stride=stride,
                                pad=(1, 1), no_bias=True, workspace=workspace, name=name + "_conv1")
        act2 = sym.Activation(data=_bn(mx, conv1, name + "_bn2", bn_mom), act_type="relu",
                              name=name + "_relu2")
        body = sym.Convolution(data=act2, num_filter=num_filter, kernel=(3, 3), stride=(1, 1),
                               pad=(1, 1), no_bias=True, workspace=workspace, name=name + "_conv2")
    if dim_match:
        shortcut = data
    else:
        shortcut = sym.Convolution(data=act1, num_filter=num_filter, kernel=(1, 1), stride=stride,
                                   no_bias=True, workspace=workspace, name=name + "_sc")
    return body + shortcut


def resnet_symbol(mx, num_layers, image_shape, num_classes=10, bn_mom=0.9, workspace=256):
    """resnet.py resnet() for CIFAR-sized input (float32)."""
    units, filter_list, bottle_neck = resnet_config(num_layers, image_shape)
    sym = mx.sym
    data = sym.identity(data=sym.Variable(name="data"), name="id")
    data = sym.BatchNorm(data=data, fix_gamma=True, eps=2e-5, momentum=bn_mom, name="bn_data")
    body = sym.Convolution(data=data, num_filter=filter_list[0], kernel=(3, 3), stride=(1, 1),
                           pad=(1, 1), no_bias=True, name="conv0", workspace=workspace)
    for i, count in enumerate(units):
        stride = (1, 1) if i == 0 else (2, 2)
        body = residual_unit(mx, body, filter_list[i + 1], stride, False,
                             "stage%d_unit%d" % (i + 1, 1), bottle_neck, bn_mom, workspace)
        for j in range(count - 1):
            body = residual_unit(mx, body, filter_list[i + 1], (1, 1), True,
                                 "stage%d_unit%d" % (i + 1, j + 2), bottle_neck, bn_mom, workspace)
    relu1 = sym.Activation(data=_bn(mx, body, "bn1", bn_mom), act_type="relu", name="relu1")
    pool1 = sym.Pooling(data=relu1, global_pool=True, kernel=(7, 7), pool_type="avg", name="pool1")
    fc1 = sym.FullyConnected(data=sym.Flatten(data=pool1), num_hidden=num_classes, name="fc1")
    return sym.SoftmaxOutput(data=fc1, name="softmax")


# -- schedule ----------------------------------------------------------------------
def epoch_size(num_examples, batch_size):
    """fit.py get_epoch_size() on one worker: updates per epoch."""
    return math.ceil(int(num_examples) / batch_size)


def lr_steps(lr_step_epochs, updates_per_epoch):
    """fit.py _get_lr_scheduler() from epoch 0: the update counts of the steps."""
    epochs = [int(e) for e in str(lr_step_epochs).split(",") if e.strip()]
    return [updates_per_epoch * e for e in epochs if e > 0]


def parse_floats(text):
    return tuple(float(v) for v in str(text).split(","))


def parse_shape(text):
    return tuple(int(v) for v in str(text).split(","))


# -- data --------------------------------------------------------------------------
def epoch_order(rng, n, batch_size):
    """A shuffled epoch cut into whole batches; the last is filled from the
    epoch's start (NDArrayIter last_batch_handle='pad', ImageRecordIter round_batch)."""
    order = rng.permutation(n)
    batches = math.ceil(n / batch_size)
    short = batches * batch_size - n
    if short:
        order = list(order) + list(order[:short])
    return [order[i * batch_size:(i + 1) * batch_size] for i in range(batches)]


def rgb_to_hls_u8(np, rgb):
    """OpenCV cvtColor RGB2HLS on 8-bit images (..., 3) -> uint8 H [0,180), L, S."""
    x = rgb.astype(np.float32) / 255.0
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    vmax, vmin = x.max(axis=-1), x.min(axis=-1)
    diff = vmax - vmin
    light = (vmax + vmin) * 0.5
    chroma = diff > np.finfo(np.float32).eps
    safe = np.where(chroma, diff, 1.0)
    sat = np.where(light < 0.5, diff / np.where(chroma, vmax + vmin, 1.0),
                   diff / np.where(chroma, 2.0 - vmax - vmin, 1.0))
    sat = np.where(chroma, sat, 0.0)
    scale = 60.0 / safe
    hue = np.where(vmax == r, (g - b) * scale,
                   np.where(vmax == g, (b - r) * scale + 120.0, (r - g) * scale + 240.0))
    hue = np.where(hue < 0, hue + 360.0, hue)
    hue = np.where(chroma, hue, 0.0)
    out = np.stack([hue * 0.5, light * 255.0, sat * 255.0], axis=-1)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def hls_to_rgb_u8(np, hls):
    """OpenCV cvtColor HLS2RGB on 8-bit images (H in [0,180]) -> uint8 RGB."""
    x = hls.astype(np.float32)
    h = x[..., 0] * (6.0 / 180.0)
    light, sat = x[..., 1] / 255.0, x[..., 2] / 255.0
    p2 = np.where(light <= 0.5, light * (1 + sat), light + sat - light * sat)
    p1 = 2 * light - p2
    h = np.mod(h, 6.0)
    sector = np.floor(h).astype(np.int64) % 6
    frac = h - np.floor(h)
    tab = np.stack([p2, p1, p1 + (p2 - p1) * (1 - frac), p1 + (p2 - p1) * frac], axis=-1)
    pick = np.asarray(HLS_SECTORS)[sector]                     # (..., 3) indices into tab
    rgb = np.take_along_axis(tab, pick, axis=-1)
    grey = (sat == 0)[..., None]
    rgb = np.where(grey, light[..., None], rgb)
    return np.clip(np.rint(rgb * 255.0), 0, 255).astype(np.uint8)


def augment(np, rng, images, hp):
    """The train iterator's augmentation for a batch of uint8 N x 3 x 32 x 32
    images -> float32 N x 3 x H x W (see the module docstring)."""
    _, height, width = parse_shape(hp["image_shape"])
    pad = hp["pad_size"]
    n = len(images)
    x = images
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), mode="constant",
                   constant_values=hp["fill_value"])
    rows, cols = x.shape[2] - height, x.shape[3] - width
    if hp["random_crop"]:
        ys, xs = rng.randint(0, rows + 1, n), rng.randint(0, cols + 1, n)
    else:
        ys, xs = np.full(n, rows // 2), np.full(n, cols // 2)
    index_y = ys[:, None] + np.arange(height)[None, :]                   # n x H
    index_x = xs[:, None] + np.arange(width)[None, :]                    # n x W
    crops = x[np.arange(n)[:, None, None, None], np.arange(3)[None, :, None, None],
              index_y[:, None, :, None], index_x[:, None, None, :]]
    limits = (hp["max_random_h"], hp["max_random_l"], hp["max_random_s"])
    if any(limits):
        hls = rgb_to_hls_u8(np, crops.transpose(0, 2, 3, 1)).astype(np.int32)
        # int(U(0,1) * 2m - m): truncated toward zero, as the C++ cast does
        shift = np.trunc(rng.uniform(0, 1, (n, 3)) * 2 * np.asarray(limits) -
                         np.asarray(limits)).astype(np.int32)
        hls = np.clip(hls + shift[:, None, None, :], 0, np.asarray([180, 255, 255]))
        crops = hls_to_rgb_u8(np, hls).transpose(0, 3, 1, 2)
    if hp["random_mirror"]:
        flip = rng.uniform(0, 1, n) > 0.5
        crops = np.where(flip[:, None, None, None], crops[..., ::-1], crops)
    mean = np.asarray(parse_floats(hp["rgb_mean"]), dtype=np.float32)
    return crops.astype(np.float32) - mean[None, :, None, None]


def centre(np, images, hp):
    """The validation iterator: centre crop, minus the mean."""
    _, height, width = parse_shape(hp["image_shape"])
    y, x = (images.shape[2] - height) // 2, (images.shape[3] - width) // 2
    crops = images[:, :, y:y + height, x:x + width]
    mean = np.asarray(parse_floats(hp["rgb_mean"]), dtype=np.float32)
    return crops.astype(np.float32) - mean[None, :, None, None]


# -- adapter -----------------------------------------------------------------------
class Adapter:
    def __init__(self, ctx):
        self.ctx = ctx
        self.hp = ctx.hp

    # -- setup ---------------------------------------------------------------
    def setup(self):
        import numpy as np
        import mxnet as mx
        self.np, self.mx = np, mx
        hp, ctx = self.hp, self.ctx
        if ctx.device.startswith("cuda"):
            if not mx.runtime.Features().is_enabled("CUDA"):
                raise ValueError("this mxnet %s build has no CUDA; device %r is not available"
                                 % (mx.__version__, ctx.device))
            index = int(ctx.device.partition(":")[2] or 0)
            self.context = mx.gpu(index)
        elif ctx.device == "cpu":
            self.context = mx.cpu()
        else:
            raise ValueError("unknown device %r" % ctx.device)
        mx.random.seed(ctx.seed)
        np.random.seed(ctx.seed)
        self.rng = np.random.RandomState(ctx.seed)

        arrays = ctx.load_data()
        self.train_y = arrays["train_labels"].astype(np.float32)
        self.test_y = arrays["test_labels"]
        if ctx.dataset == "mnist":
            # train_mnist.py to4d(): N x 1 x 28 x 28 float32 / 255
            self.train_x = arrays["train_images"][:, None].astype(np.float32) / 255
            self.test_x = arrays["test_images"][:, None].astype(np.float32) / 255
            self.shape = (1, 28, 28)
            self.symbol = lenet_symbol(mx)
        elif ctx.dataset == "cifar10":
            self.train_x = arrays["train_images"]              # augmented per batch
            self.test_x = centre(np, arrays["test_images"], hp)
            self.shape = parse_shape(hp["image_shape"])
            self.symbol = resnet_symbol(mx, hp["num_layers"], self.shape)
        else:
            raise ValueError("no mxnet model for %s" % ctx.dataset)

        batch = hp["batch_size"]
        self.module = mx.mod.Module(symbol=self.symbol, context=self.context)
        self.module.bind(data_shapes=[("data", (batch,) + self.shape)],
                         label_shapes=[("softmax_label", (batch,))], for_training=True)
        self.module.init_params(initializer=mx.init.Xavier(rnd_type="gaussian", factor_type="in",
                                                           magnitude=2))
        self.updates_per_epoch = epoch_size(len(self.train_y), batch)
        steps = lr_steps(hp["lr_step_epochs"], self.updates_per_epoch)
        optimizer_params = {"learning_rate": hp["learning_rate"], "wd": hp["weight_decay"],
                            "momentum": hp["momentum"], "multi_precision": True}
        if hp["lr_factor"] < 1 and steps:
            optimizer_params["lr_scheduler"] = mx.lr_scheduler.MultiFactorScheduler(
                step=steps, factor=hp["lr_factor"], base_lr=hp["learning_rate"])
        self.module.init_optimizer(kvstore=mx.kvstore.create("device"), optimizer="sgd",
                                   optimizer_params=optimizer_params)
        test_batch = hp["test_batch_size"]
        self.test_module = mx.mod.Module(symbol=self.symbol, context=self.context)
        self.test_module.bind(data_shapes=[("data", (test_batch,) + self.shape)],
                              label_shapes=[("softmax_label", (test_batch,))],
                              for_training=False, shared_module=self.module)
        mx.nd.waitall()
        ctx.planned_epochs = hp["epochs"]

    def _inputs(self, index):
        if self.ctx.dataset == "cifar10":
            return augment(self.np, self.rng, self.train_x[index], self.hp)
        return self.train_x[index]

    # -- train ---------------------------------------------------------------
    def train(self):
        np, mx, hp, ctx = self.np, self.mx, self.hp, self.ctx
        batch, n = hp["batch_size"], len(self.train_y)
        limit = hp.get("max_batches") or 0
        steps = 0
        for epoch in range(1, hp["epochs"] + 1):
            ctx.epoch_start()
            batches = epoch_order(self.rng, n, batch)
            if limit:
                batches = batches[:limit]
            loss_sum, correct, seen = 0.0, 0, 0
            for i, index in enumerate(batches):
                y = self.train_y[index]
                data_batch = mx.io.DataBatch(
                    data=[mx.nd.array(self._inputs(index), ctx=self.context)],
                    label=[mx.nd.array(y, ctx=self.context)])
                self.module.forward_backward(data_batch)
                self.module.update()
                # Module.fit updates its accuracy metric from the outputs after
                # every batch (a copy to numpy); loss and accuracy come from that copy.
                probs = self.module.get_outputs()[0].asnumpy()
                labels = y.astype(np.int64)
                picked = probs[np.arange(len(labels)), labels]
                loss = float(-np.log(np.maximum(picked, 1e-12)).mean())
                loss_sum += loss * len(labels)
                correct += int((probs.argmax(axis=1) == labels).sum())
                seen += len(labels)
                steps += 1
                ctx.progress(epoch, (i + 1) / len(batches), loss, step=steps)
            mx.nd.waitall()
            ctx.epoch_done(epoch, loss_sum / seen, correct / seen, samples=seen)
        mx.nd.waitall()

    # -- test ----------------------------------------------------------------
    def test(self):
        np, mx = self.np, self.mx
        batch, n = self.hp["test_batch_size"], len(self.test_y)
        loss_sum, correct = 0.0, 0
        for start in range(0, n, batch):
            x = self.test_x[start:start + batch]
            y = self.test_y[start:start + batch]
            real = len(y)
            if real < batch:        # a last, short batch: padded, the pad ignored
                x = np.concatenate([x, np.zeros((batch - real,) + x.shape[1:], x.dtype)])
            self.test_module.forward(mx.io.DataBatch(data=[mx.nd.array(x, ctx=self.context)]),
                                     is_train=False)
            probs = self.test_module.get_outputs()[0].asnumpy()[:real]
            picked = probs[np.arange(real), y]
            loss_sum += float(-np.log(np.maximum(picked, 1e-12)).sum())
            correct += int((probs.argmax(axis=1) == y).sum())
        mx.nd.waitall()
        return {"accuracy": correct / n, "loss": loss_sum / n}

    # -- describe ------------------------------------------------------------
    def describe(self):
        np, mx = self.np, self.mx
        arg_params, _ = self.module.get_params()
        gpu = self.context.device_type == "gpu"
        return {
            "framework_version": mx.__version__,
            # Every learnable argument of the symbol (weights, biases, BatchNorm
            # gamma and beta), as mx.viz.print_summary counts them; BatchNorm's
            # moving mean and variance are auxiliary states, not counted.
            "param_count": int(sum(v.size for v in arg_params.values())),
            "device_name": "GPU %d" % self.context.device_id if gpu else None,
            "threads": {"requested": self.ctx.threads,
                        "framework": {
                            "MXNET_CPU_WORKER_NTHREADS": mx.util.getenv("MXNET_CPU_WORKER_NTHREADS"),
                            "OMP_NUM_THREADS": mx.util.getenv("OMP_NUM_THREADS"),
                            "omp_get_max_threads": _omp_max_threads(),
                            "openblas_get_num_threads": _openblas_threads()}},
            "libraries": {"numpy": np.__version__,
                          "mxnet_features": ",".join(sorted(f.name for f in mx.runtime.feature_list()
                                                            if f.enabled))},
        }


def _mapped(fragment):
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if fragment in line.split()[-1]})
    except OSError:
        return []


def _omp_max_threads():
    """omp_get_max_threads() of the OpenMP runtime libmxnet uses (libgomp)."""
    for path in _mapped("libgomp"):
        try:
            return int(ctypes.CDLL(path).omp_get_max_threads())
        except (OSError, AttributeError):
            pass
    return None


def _openblas_threads():
    """openblas_get_num_threads() of the OpenBLAS bundled with libmxnet."""
    for path in _mapped("openblas"):
        try:
            library = ctypes.CDLL(path)
            if hasattr(library, "openblas_get_num_threads"):
                return int(library.openblas_get_num_threads())
        except OSError:
            pass
    return None
