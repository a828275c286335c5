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
step 0.1 at epoch 10, 20 epochs; ``NDArrayIter(shuffle=True)``, which in
MXNet 1.0 permutes the data once, when it is made, and walks that same order
every epoch; its default ``last_batch_handle='pad'`` fills the last batch of
an epoch from the order's start (938 batches, 60,032 images an epoch).  No
prefetching: NDArrayIter hands out slices on the training thread.

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
iterator (rand_crop 0, no pad) makes them.  The order is ImageRecordIter's
(``RecordIter``): the file read in chunks, each chunk augmented as a whole and
shuffled within itself, the last batch of an epoch filled from the file's start
(round_batch), 390 or 391 batches an epoch.  A chunk is 16 MiB of the ``.rec``
file; ``shuffle_chunk_images`` (5,405) takes the records at their raw size
(3,072 bytes of pixels and 32 of headers; an encoded record is smaller, so the
original's chunks held more images), in the canonical files' order (the
``.rec``'s own order is not known).  ``shuffle_chunk_images=0`` makes the whole
set one chunk: a full shuffle every epoch.

ImageRecordIter made its batches in a prefetch thread (``ThreadedIter``, up to
16 batches ahead, decoding and augmenting in ``--data-nthreads`` OpenMP
threads) beside the training steps, from the moment it was made, before the
Module was bound.  ``prefetch`` (16) does the same in a Python thread
(``Prefetcher``) running the very generator the synchronous path
(``prefetch=0``) runs on the training thread, so the batches are the same in
both; the first ``CHECKSUM_BATCHES`` are hashed into result.json to show it.

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
  rewritten in numpy (the original's random stream cannot be reproduced), in
  one thread, not four.
- fit.py scores the validation set after every epoch; dlbench tests once,
  after training, over exactly the 10,000 test images (the original's padded
  last batch counts some images twice).
- ``max_batches`` (0 = all, the paper setting) limits the batches of each epoch,
  for the quick profile only (an epoch cut short starts the next at the file's
  start, as a reset inside an epoch does); the learning-rate steps stay counted
  in updates of ``ceil(num_examples / batch_size)``, as fit.py counts them.
- No Speedometer logging or checkpoints; the runner times the phases.
"""

import ctypes
import hashlib
import json
import math
import os
import time

from dlbench_runner import blas

# MXNet's engine reads this when it starts: one scheduling thread for CPU
# operators (MXNet's default), each of them parallel with OMP_NUM_THREADS,
# which the runner sets from the job's thread count before mxnet is imported.
os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")

# OpenCV's HLS2RGB: for each hue sector, which of (p2, p1, falling, rising)
# feeds R, G and B.
HLS_SECTORS = ((0, 3, 1), (2, 0, 1), (1, 0, 3), (1, 2, 0), (3, 1, 0), (0, 1, 2))

# A chunk is augmented this many images at a time (bounds the memory numpy takes).
AUGMENT_SLICE = 1024

# The first batches of a run, hashed into result.json ("data"."first_batches"), so
# that two runs can be shown to have trained on the same batches.
CHECKSUM_BATCHES = 20


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
    """A shuffled order cut into whole batches; the last is filled from the
    order's start (NDArrayIter last_batch_handle='pad')."""
    order = rng.permutation(n)
    batches = math.ceil(n / batch_size)
    short = batches * batch_size - n
    if short:
        order = list(order) + list(order[:short])
    return [order[i * batch_size:(i + 1) * batch_size] for i in range(batches)]


def ndarray_iter(np, rng, images, labels, batch_size, epochs, limit=0):
    """train_mnist.py's ``NDArrayIter(shuffle=True)`` as MXNet 1.0 runs it: the
    data are permuted once, when the iterator is made, and every epoch walks
    that same order in whole batches, the last filled from its start
    (``last_batch_handle='pad'``; ``reset()`` only rewinds).  Yields
    (epoch, batch index, batches in the epoch, images, labels)."""
    batches = epoch_order(rng, len(labels), batch_size)
    if limit:
        batches = batches[:limit]

    def stream():
        for epoch in range(1, epochs + 1):
            for i, index in enumerate(batches):
                yield epoch, i, len(batches), images[index], labels[index]
    return stream()


class RecordIter:
    """train_cifar10.py's ``ImageRecordIter(shuffle=True)`` on a ``.rec`` file
    without an index, as MXNet 1.0 runs it (``src/io/iter_image_recordio_2.cc``,
    ``ImageRecordIOParser2``; dmlc-core's ``InputSplit``):

    - the file is read in chunks (16 MiB, dmlc-core's buffer; here ``chunk``
      images), always in file order, from its start at every epoch;
    - a chunk is decoded and augmented as a whole, then its images are shuffled
      (one random stream for the whole run) and handed out in that order; a
      batch may take its images from two chunks.  The shuffle never moves an
      image out of its chunk;
    - ``round_batch``: when the file ends inside a batch, the first chunk is read
      again (augmented and shuffled anew) to fill it; the epoch ends with that
      batch and the next one begins with the rest of that chunk, then goes on
      where the file was left.  An epoch that ends at a batch boundary, or is cut
      short (``max_batches``, a ``reset()`` inside an epoch), starts the next one
      at the file's start.

    So every epoch has whole batches, 390 or 391 of 128 for 50,000 images."""

    def __init__(self, np, rng, images, labels, hp, chunk):
        self.np, self.rng, self.images, self.labels, self.hp = np, rng, images, labels, hp
        self.batch = hp["batch_size"]
        n = len(labels)
        chunk = chunk or n                  # 0: the whole file one chunk, a full shuffle
        self.chunks = [(start, min(start + chunk, n)) for start in range(0, n, chunk)]
        self.position = 0                   # the next chunk the file yields
        self.pending = None                 # a parsed chunk's images not handed out yet
        self.overflow = False

    def _parse(self, start, stop):
        """One chunk augmented, then shuffled."""
        np = self.np
        parts = [augment(np, self.rng, self.images[i:min(i + AUGMENT_SLICE, stop)], self.hp)
                 for i in range(start, stop, AUGMENT_SLICE)]
        order = self.rng.permutation(stop - start)
        return np.concatenate(parts)[order], self.labels[start:stop][order]

    def reset(self):
        """BeforeFirst(): the file from its start, unless the last batch overflowed."""
        if self.overflow:
            self.overflow = False
        else:
            self.pending, self.position = None, 0

    def batches_left(self):
        """Batches the epoch now starting will have."""
        left = sum(stop - start for start, stop in self.chunks[self.position:])
        if self.pending is not None:
            left += len(self.pending[1])
        return math.ceil(left / self.batch)

    def next(self):
        """ParseNext(): the next batch (images, labels), None at the end of the epoch."""
        np = self.np
        if self.overflow:
            return None
        xs, ys, size = [], [], 0
        while size < self.batch:
            if self.pending is None or not len(self.pending[1]):
                if self.position < len(self.chunks):
                    self.pending = self._parse(*self.chunks[self.position])
                    self.position += 1
                    continue
                if size == 0:
                    return None
                if self.overflow:
                    raise ValueError("the training set must hold more images than a batch")
                self.overflow, self.position = True, 0
                continue
            take = min(len(self.pending[1]), self.batch - size)
            xs.append(self.pending[0][:take])
            ys.append(self.pending[1][:take])
            self.pending = (self.pending[0][take:], self.pending[1][take:])
            size += take
        return np.concatenate(xs), np.concatenate(ys)

    def stream(self, epochs, limit=0):
        """(epoch, batch index, batches in the epoch, images, labels) for the whole run."""
        for epoch in range(1, epochs + 1):
            self.reset()
            count = self.batches_left()
            if limit:
                count = min(count, limit)
            for i in range(count):
                x, y = self.next()
                yield epoch, i, count, x, y


class Prefetcher:
    """Runs a batch stream in a background thread, ``depth`` batches ahead of the
    training loop, as ImageRecordIter's prefetch thread ran beside the training
    steps.  The stream is the same generator the synchronous path iterates, so
    the batches are the same, in the same order; only when they are made
    changes.  numpy releases the GIL inside its array operations and MXNet's
    engine works outside it, so a thread overlaps them."""

    _END = object()

    def __init__(self, stream, depth):
        import queue
        import threading
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error = None
        self._thread = threading.Thread(target=self._run, args=(stream,), name="dlbench-prefetch",
                                        daemon=True)
        self._thread.start()

    def _put(self, item):
        import queue
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def _run(self, stream):
        try:
            for item in stream:
                if not self._put(item):
                    return
        except BaseException as exc:        # handed to the training thread
            self._error = exc
        self._put(self._END)

    def __iter__(self):
        return self

    def __next__(self):
        item = self._queue.get()
        if item is self._END:
            self._thread.join()
            if self._error is not None:
                raise self._error
            raise StopIteration
        return item

    def close(self):
        self._stop.set()
        self._thread.join()


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


CUDA_STAND_IN = "/opt/dlbench/cuda-stub/libcuda.so.1"     # the GPU image's (Dockerfile.gpu)


def driver_or_stand_in():
    """The GPU image's libmxnet needs the driver's libcuda.so.1.  In a GPU job the host's
    driver is there; elsewhere (``--variant gpu`` on the CPU) the image's stand-in, which
    reports no device, is loaded first, by its path, so that libmxnet binds to it.  It is
    never on the library path, so it cannot shadow a real driver.  The CPU image has none."""
    import ctypes
    if not os.path.exists(CUDA_STAND_IN):
        return
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        ctypes.CDLL(CUDA_STAND_IN, mode=ctypes.RTLD_GLOBAL)


# -- adapter -----------------------------------------------------------------------
class Adapter:
    def __init__(self, ctx):
        self.ctx = ctx
        self.hp = ctx.hp

    # -- setup ---------------------------------------------------------------
    def setup(self):
        import numpy as np
        driver_or_stand_in()
        import mxnet as mx
        self.np, self.mx = np, mx
        hp, ctx = self.hp, self.ctx
        if ctx.gpu is None:
            self.context = mx.cpu()
        elif not mx.runtime.Features().is_enabled("CUDA"):
            raise ValueError("this mxnet %s build has no CUDA; device %r is not available"
                             % (mx.__version__, ctx.device))
        else:
            self.context = mx.gpu(ctx.gpu)
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
        # The training iterator is made first, as fit.py makes it before the Module:
        # NDArrayIter permutes MNIST now, once; ImageRecordIter's prefetch thread
        # starts reading and augmenting now, while the Module is bound.
        limit = hp.get("max_batches") or 0
        if ctx.dataset == "mnist":
            stream = ndarray_iter(np, self.rng, self.train_x, self.train_y, batch, hp["epochs"],
                                  limit)
        else:
            stream = RecordIter(np, self.rng, self.train_x, self.train_y, hp,
                                hp["shuffle_chunk_images"]).stream(hp["epochs"], limit)
        self.prefetch = hp.get("prefetch") or 0
        self.batches = Prefetcher(stream, self.prefetch) if self.prefetch else stream
        self.data_wait_s = 0.0
        self.checksum = hashlib.sha256()
        self.checksummed = 0

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
        self.network = None             # the robustness check's, made after training
        mx.nd.waitall()
        ctx.planned_epochs = hp["epochs"]

    # -- train ---------------------------------------------------------------
    def train(self):
        try:
            self._train(self.np, self.mx, self.ctx, self.batches)
        finally:
            if self.prefetch:
                self.batches.close()

    def _train(self, np, mx, ctx, batches):
        steps = 0
        ctx.epoch_start()
        while True:
            t0 = time.perf_counter()
            item = next(batches, None)
            self.data_wait_s += time.perf_counter() - t0
            if item is None:
                break
            epoch, i, count, x, y = item
            if i == 0:
                loss_sum, correct, seen = 0.0, 0, 0
            if self.checksummed < CHECKSUM_BATCHES:
                self.checksum.update(np.ascontiguousarray(x, dtype=np.float32).tobytes())
                self.checksum.update(np.ascontiguousarray(y, dtype=np.float32).tobytes())
                self.checksummed += 1
            data_batch = mx.io.DataBatch(data=[mx.nd.array(x, ctx=self.context)],
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
            ctx.progress(epoch, (i + 1) / count, loss, step=steps)
            if i + 1 == count:
                mx.nd.waitall()
                ctx.epoch_done(epoch, loss_sum / seen, correct / seen, samples=seen)
                ctx.epoch_start()
        mx.nd.waitall()

    def synchronize(self):
        """Wait for MXNet's engine: it runs operators asynchronously, on the CPU too."""
        if getattr(self, "mx", None) is not None:
            self.mx.nd.waitall()

    # -- test ----------------------------------------------------------------
    def test(self):
        np, mx = self.np, self.mx
        batch, n = self.hp["test_batch_size"], len(self.test_y)
        loss_sum, correct, predicted = 0.0, 0, []
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
            classes = probs.argmax(axis=1)
            correct += int((classes == y).sum())
            predicted.append(classes)
        mx.nd.waitall()
        return {"accuracy": correct / n, "loss": loss_sum / n,
                "predictions": np.concatenate(predicted) if predicted else None}

    # -- the robustness check: the model's view of [0, 1] pixels, by autograd -----------------
    def _network(self):
        """The trained network up to its logits (the SoftmaxOutput's input) as a Gluon
        SymbolBlock holding the Module's trained arguments and auxiliary states (BatchNorm's
        moving statistics); made at the first call, after training.  Its BatchNorm
        layers are set to use their moving statistics in train mode too
        (``use_global_stats``): the function test() computes, back-propagated by the
        train-mode operators (``_train_mode``).  Its parameters get no gradient: only the
        input's is wanted."""
        if self.network is None:
            mx = self.mx
            graph = json.loads(self.symbol.get_children()[0].tojson())
            for node in graph["nodes"]:
                if node["op"] == "BatchNorm":
                    node.setdefault("attrs", {})["use_global_stats"] = "True"
            network = mx.gluon.SymbolBlock(mx.sym.load_json(json.dumps(graph)),
                                           mx.sym.var("data", dtype="float32"))
            arg_params, aux_params = self.module.get_params()
            params = network.collect_params()
            params.load_dict({**arg_params, **aux_params}, ctx=self.context)
            params.setattr("grad_req", "null")
            self.network = network
        return self.network

    def _pixels(self, pixels):
        """Pixels as an NDArray of the network's float32 (the gradient check's float64
        pixels rounded to it)."""
        return self.mx.nd.array(pixels, ctx=self.context, dtype="float32")

    def model_input(self, pixels):
        """Pixels (MNIST N x 28 x 28, CIFAR-10 N x 3 x 32 x 32, in [0, 1]) -> the network's
        data as test() feeds it, in NDArray operators (autograd records them)."""
        mx = self.mx
        mean = None if self.ctx.dataset == "mnist" else mx.nd.array(self._rgb_mean(), ctx=self.context)
        return self._preprocess(mx.nd, pixels, pixels.shape[-2:], mean)

    def _rgb_mean(self):
        return self.np.asarray(parse_floats(self.hp["rgb_mean"]), self.np.float32).reshape(1, 3, 1, 1)

    def _preprocess(self, F, pixels, size, mean):
        """The preprocessing of pixels of ``size`` (height, width) in ``F``'s operators,
        ``mx.nd`` or ``mx.sym`` (the same operators in both, so that the exported graph
        computes what the framework does): MNIST N x 1 x 28 x 28 (to4d's / 255 is the
        pixels' scale); CIFAR-10 back to the bytes' scale, the centre crop and minus the
        RGB mean ``mean`` (1 x 3 x 1 x 1), as ``centre`` makes them."""
        if self.ctx.dataset == "mnist":
            return F.expand_dims(pixels, axis=1)
        _, height, width = self.shape
        top, left = (size[0] - height) // 2, (size[1] - width) // 2
        crops = F.slice(pixels * 255, begin=(None, None, top, left),
                        end=(None, None, top + height, left + width))
        return F.broadcast_sub(crops, mean)

    def _train_mode(self):
        """The mode autograd records and back-propagates the network in: train mode, the
        same function as test()'s predict mode once BatchNorm uses its moving statistics
        (``_network``), unless a Dropout layer would then drop.  Not predict mode: MXNet
        1.9's oneDNN max pooling keeps no workspace in a predict-mode forward pass, and
        its backward then gives a wrong gradient (LeNet's, against finite differences);
        and ResNet-110's predict-mode backward took 15 s for 100 CIFAR-10 images, 30
        times its forward pass."""
        ops = {node["op"] for node in json.loads(self.symbol.tojson())["nodes"]}
        return "Dropout" not in ops

    def _summed_loss(self, logits, labels):
        """SoftmaxOutput's training loss, the cross entropy, summed over the batch."""
        mx = self.mx
        labels = mx.nd.array(labels, ctx=self.context)
        return -mx.nd.pick(mx.nd.log_softmax(logits), labels).sum()

    def input_gradient(self, pixels, labels):
        """mx.autograd's gradient of the summed cross entropy with respect to the pixels,
        of the network as test() runs it (``_train_mode``); and the classes predicted."""
        mx, network, train_mode = self.mx, self._network(), self._train_mode()
        x = self._pixels(pixels)
        x.attach_grad()
        with mx.autograd.record(train_mode=train_mode):
            logits = network(self.model_input(x))
            loss = self._summed_loss(logits, labels)
        loss.backward(train_mode=train_mode)
        return x.grad.asnumpy(), logits.argmax(axis=1).asnumpy().astype(self.np.int64)

    def input_vjp(self, pixels, output_gradient):
        """mx.autograd's gradient of the network's logits with respect to the pixels,
        weighted by ``output_gradient(logits)`` (the head gradient of ``backward``): their
        vector-Jacobian product, of the network as test() runs it (``_train_mode``); and
        the classes predicted."""
        mx, network, train_mode = self.mx, self._network(), self._train_mode()
        x = self._pixels(pixels)
        x.attach_grad()
        with mx.autograd.record(train_mode=train_mode):
            logits = network(self.model_input(x))
        g = mx.nd.array(output_gradient(logits.asnumpy()), ctx=self.context, dtype=logits.dtype)
        logits.backward(out_grad=g, train_mode=train_mode)
        return x.grad.asnumpy(), logits.argmax(axis=1).asnumpy().astype(self.np.int64)

    def predict(self, pixels):
        logits = self._network()(self.model_input(self._pixels(pixels)))
        return logits.argmax(axis=1).asnumpy().astype(self.np.int64)

    def loss(self, pixels, labels):
        logits = self._network()(self.model_input(self._pixels(pixels)))
        return float(self._summed_loss(logits, labels).asscalar())

    # -- the migration check: the trained model exported to ONNX --------------------------------
    def logits(self, pixels):
        """The network's logits for the pixels (the SoftmaxOutput's input), as the exported
        graph gives them."""
        return self._network()(self.model_input(self._pixels(pixels))).asnumpy()

    def export_onnx(self, path, pixels):
        """MXNet's own exporter, ``mx.onnx.export_model`` (mx2onnx; opset: the onnx
        package's, 14), of the trained network up to its logits with ``_preprocess``
        composed in front of it: one symbol from pixels to logits, the batch dimension
        free, the Module's trained arguments and auxiliary states (BatchNorm's moving
        statistics) as its weights.  mx2onnx drops BatchNorm's ``fix_gamma``: MXNet
        computes such a layer (ResNet's ``bn_data``) with gamma 1, whatever the stored
        gamma, and weight decay has moved the stored one off 1; the graph gets the 1
        MXNet computes with.  mx2onnx also lists every weight among the graph's inputs
        (besides its initializers), so that a caller could feed other weights; they are
        taken off the inputs, leaving the pixels the graph's one input."""
        import onnx

        np, mx = self.np, self.mx
        shape = np.shape(pixels)[1:]
        network = self.symbol.get_children()[0]
        arg_params, aux_params = self.module.get_params()
        params = {**arg_params, **aux_params}
        mean = None
        if self.ctx.dataset != "mnist":
            mean = mx.sym.var("rgb_mean", shape=(1, 3, 1, 1), dtype="float32")
            params["rgb_mean"] = mx.nd.array(self._rgb_mean())
        pixels_var = mx.sym.var("pixels", dtype="float32")
        graph = network(data=self._preprocess(mx.sym, pixels_var, shape[-2:], mean))
        nodes = json.loads(graph.tojson())["nodes"]
        for node in nodes:
            fixed = node.get("attrs", {}).get("fix_gamma", "True") in ("True", "true", "1")
            if node["op"] == "BatchNorm" and fixed:     # MXNet's default is fix_gamma=True
                gamma = nodes[node["inputs"][1][0]]["name"]
                params[gamma] = mx.nd.ones_like(params[gamma])
        mx.onnx.export_model(graph, params, in_shapes=[(len(pixels),) + shape],
                             in_types=np.float32, onnx_file_path=path, dynamic=True,
                             dynamic_input_shapes=[(None,) + shape])
        model = onnx.load(path)
        weights = {tensor.name for tensor in model.graph.initializer}
        inputs = [value for value in model.graph.input if value.name not in weights]
        del model.graph.input[:]
        model.graph.input.extend(inputs)
        for value in list(model.graph.input) + list(model.graph.output):
            # mx2onnx leaves the free batch dimension unnamed; named as PyTorch's graphs name it
            value.type.tensor_type.shape.dim[0].dim_param = "images"
        onnx.checker.check_model(model)
        onnx.save(model, path)

    # -- save ----------------------------------------------------------------
    def save(self, folder):
        """Module.save_params: the trained arguments and auxiliary states (BatchNorm's
        moving statistics) as one .params file, the weights half of the checkpoint
        common/fit.py writes each epoch (its -symbol.json is the network, not the model's
        trained state)."""
        self.module.save_params(os.path.join(folder, "model.params"))

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
            "param_bytes": int(sum(v.size * np.dtype(v.dtype).itemsize for v in arg_params.values())),
            "device_name": "GPU %d" % self.context.device_id if gpu else None,
            "threads": {"requested": self.ctx.threads,
                        "framework": {
                            "MXNET_CPU_WORKER_NTHREADS": mx.util.getenv("MXNET_CPU_WORKER_NTHREADS"),
                            "OMP_NUM_THREADS": mx.util.getenv("OMP_NUM_THREADS"),
                            "omp_get_max_threads": _omp_max_threads(),
                            "openblas_get_num_threads": blas.openblas_threads()}},
            "data": {"iterator": "NDArrayIter" if self.ctx.dataset == "mnist" else "ImageRecordIter",
                     "prefetch": self.prefetch,
                     "worker": "thread" if self.prefetch else "training thread",
                     # time the training loop spent getting its batches (made or waited for)
                     "wait_s": self.data_wait_s,
                     "first_batches": {"batches": self.checksummed,
                                       "sha256": self.checksum.hexdigest()}},
            "libraries": {"numpy": np.__version__,
                          "mxnet_features": ",".join(sorted(f.name for f in mx.runtime.feature_list()
                                                            if f.enabled))},
        }


def _omp_max_threads():
    """omp_get_max_threads() of the OpenMP runtime libmxnet uses (libgomp)."""
    for path in blas.mapped("libgomp"):
        try:
            return int(ctypes.CDLL(path).omp_get_max_threads())
        except (OSError, AttributeError):
            pass
    return None
