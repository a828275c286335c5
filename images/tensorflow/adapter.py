"""TensorFlow adapter: GTDLBench's TensorFlow defaults, the TF 1.x tutorials'
models, rebuilt with TF 2 ops and trained in one tf.function step.

GTDLBench trained TensorFlow with the tutorials TensorFlow itself shipped:

MNIST -- "Deep MNIST for experts", tensorflow/examples/tutorials/mnist/
mnist_deep.py with input_data.read_data_sets (contrib/learn datasets/mnist.py):
  * images scaled to [0, 1] (x * 1/255, float32); the first 5,000 training
    images are read_data_sets' validation set (validation_size=5000), so the
    model trains on the other 55,000; the script never uses the validation set.
  * conv 5x5, 1->32, SAME, + bias, ReLU; max-pool 2x2/2 SAME; conv 5x5, 32->64,
    SAME, ReLU; max-pool 2x2/2 SAME; dense 3136->1024, ReLU; dropout (keep_prob
    0.5 in training, 1.0 in testing); dense 1024->10; mean softmax cross entropy.
  * weights tf.truncated_normal(stddev=0.1), biases tf.constant(0.1).
  * tf.train.AdamOptimizer(1e-4) (beta1 0.9, beta2 0.999, epsilon 1e-8), batches
    of 50 from next_batch(): the training set reshuffled (numpy) before every
    epoch; 20,000 steps (18.2 epochs of 55,000).
  * tested once, on all 10,000 test images in one batch.

CIFAR-10 -- tensorflow/models tutorials/image/cifar10 (cifar10.py,
cifar10_input.py, cifar10_train.py, cifar10_eval.py):
  * training input (distorted_inputs): the 32x32x3 image as float32 in 0..255, a
    random 24x24 crop, a random horizontal flip, random brightness (delta
    uniform in [-63, 63)), random contrast (factor uniform in [0.2, 1.8)),
    per-image standardisation; shuffled batches of 128.
  * evaluation input (inputs(eval_data=True)): the central 24x24 crop
    (resize_image_with_crop_or_pad), per-image standardisation.
  * conv1 5x5, 3->64, SAME, ReLU (weights truncated normal stddev 5e-2, bias 0.0);
    max-pool 3x3/2 SAME; LRN (depth_radius 4, bias 1.0, alpha 0.001/9, beta
    0.75); conv2 5x5, 64->64, SAME, ReLU (stddev 5e-2, bias 0.1); LRN; max-pool
    3x3/2 SAME; local3 2304->384 ReLU and local4 384->192 ReLU (stddev 0.04, bias
    0.1, weight decay 0.004 each); softmax_linear 192->10 (stddev 1/192, bias 0.0).
  * loss: mean sparse softmax cross entropy + 0.004 * l2_loss (sum(w^2)/2) of the
    local3 and local4 weights (conv1, conv2 and softmax_linear have wd 0.0).
  * plain SGD (GradientDescentOptimizer), lr 0.1 decayed x0.1 every
    int(50000 / 128 * 350) = 136,718 steps (exponential_decay, staircase);
    max_steps 1,000,000.
  * an ExponentialMovingAverage(0.9999, num_updates=global_step) of every
    trainable variable, updated each step; cifar10_eval.py restores the averages,
    not the raw weights, and tests with them.

How dlbench differs, and why:
  * TF 1.x graphs, sessions, queue runners and tf.contrib are gone from TF 2; the
    models are written again layer for layer with tf.nn ops and tf.Variables,
    initialised as the tutorials did (tf.random.truncated_normal cuts at two
    standard deviations, as tf.truncated_normal did), and trained by a
    tf.function step.  Adam and SGD are Keras 3's (the tf.keras of TF 2.20),
    whose updates are those of tf.train.AdamOptimizer (epsilon set to its 1e-8;
    Keras' default is 1e-7) and GradientDescentOptimizer; the staircase decay is
    keras.optimizers.schedules.ExponentialDecay.  The moving average is applied
    here by hand with ExponentialMovingAverage's formula: decay = min(0.9999,
    (1 + step) / (10 + step)), shadow -= (1 - decay) * (shadow - variable),
    after each step's update, step counted before the step (the original ran the
    average concurrently with the update, so its step count was either).
  * Data come from the canonical files as numpy arrays, not from TF readers.
    MNIST batches follow next_batch() (per-epoch numpy shuffles, a batch that
    crosses an epoch end takes the rest of one permutation and the start of the
    next).  CIFAR-10's queue-based shuffle_batch (a random stream from a
    20,000-example buffer over files read in shuffled order) becomes the same
    per-epoch shuffle: a uniform permutation of the 50,000 images every epoch.
    The CIFAR augmentation runs inside the training step (tf.image ops and a
    tf.random.Generator), so it is timed as training; the original's 16 input
    threads ran it beside the training steps.
  * cifar10_eval.py evaluates ceil(10000 / 128) = 79 batches of 128, 10,112
    images, the queue wrapping around to repeat 112; dlbench tests each of the
    10,000 test images exactly once (in batches of 128, the last of 16).
    GTDLBench's cifar10_eval.py runs once after training with run_once set,
    evaluating three times back to back, each in a new session; dlbench tests
    once, after training.
  * The zero weight-decay terms (wd=0.0 on conv1, conv2, softmax_linear) add
    nothing to the loss or the gradients and are left out.
  * Setup runs one training step (on the first batch_size training images) to
    trace and optimise the tf.function graphs, and one test step on one image,
    then restores every variable (weights, optimizer slots and iteration count,
    moving averages, step, random generator) to its state before, so training
    starts from exactly the initial state and its time excludes building the
    graphs (which TF 1.x also did before the first session.run).
  * Steps are the hyper-parameter, as in the originals; an "epoch" reported to
    the runner is the steps whose batch starts in that pass over the training
    set (the last one usually partial).  The per-epoch training loss is the
    loss the step minimises (for CIFAR-10 the tutorial's total_loss, weight
    decay included); the test loss is the mean cross entropy alone.

Quick profile: the same models and settings, fewer steps -- MNIST 300 steps
(15,000 images, test accuracy 0.92-0.93 over seeds 1-3), CIFAR-10 50 steps
(6,400 images, 0.29-0.31; the moving average's num_updates term keeps it
short-sighted early on, (1 + step) / (10 + step), so it tracks the weights).
"""

import os

import numpy as np

# Before tensorflow is imported: its C++ logging, errors only.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MNIST_VALIDATION = 5000          # read_data_sets(validation_size=5000)
CIFAR_CROP = 24                  # cifar10_input.IMAGE_SIZE
CIFAR_EXAMPLES_PER_EPOCH = 50000  # cifar10_input.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN


class IndexStream:
    """Batches of training indices as DataSet.next_batch() draws them: a fresh
    random permutation each epoch, batches taken in order, a batch that reaches
    past the end takes the rest and the start of the next permutation."""

    def __init__(self, n, batch, rng):
        self.n, self.batch, self.rng = n, batch, rng
        self.order = rng.permutation(n)
        self.pos = 0

    def next(self):
        end = self.pos + self.batch
        if end <= self.n:
            index = self.order[self.pos:end]
            self.pos = end
            return index
        rest = self.order[self.pos:]
        self.order = self.rng.permutation(self.n)
        self.pos = self.batch - len(rest)
        return np.concatenate([rest, self.order[:self.pos]])


# -- the models -----------------------------------------------------------------
def conv_relu(tf, x, w, b):
    return tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, strides=1, padding="SAME"), b))


class MnistDeep:
    """mnist_deep.py deepnn(): input N x 28 x 28 x 1 in [0, 1] -> logits."""

    uses_dropout = True

    def __init__(self, tf, hp):
        self.tf = tf
        self.keep_prob = hp["keep_prob"]

        def weight(name, shape):
            return tf.Variable(tf.random.truncated_normal(shape, stddev=0.1), name=name)

        def bias(name, n):
            return tf.Variable(tf.fill([n], 0.1), name=name)

        self.variables = [
            weight("conv1/W", [5, 5, 1, 32]), bias("conv1/b", 32),
            weight("conv2/W", [5, 5, 32, 64]), bias("conv2/b", 64),
            weight("fc1/W", [7 * 7 * 64, 1024]), bias("fc1/b", 1024),
            weight("fc2/W", [1024, 10]), bias("fc2/b", 10),
        ]
        self.weight_decay = []    # the tutorial's loss is the cross entropy alone

    def logits(self, params, x, dropout_seed=None):
        tf = self.tf
        w1, b1, w2, b2, w3, b3, w4, b4 = params
        h = tf.nn.max_pool2d(conv_relu(tf, x, w1, b1), 2, 2, "SAME")
        h = tf.nn.max_pool2d(conv_relu(tf, h, w2, b2), 2, 2, "SAME")
        h = tf.nn.relu(tf.matmul(tf.reshape(h, [-1, 7 * 7 * 64]), w3) + b3)
        if dropout_seed is not None:
            h = tf.nn.experimental.stateless_dropout(h, rate=1.0 - self.keep_prob, seed=dropout_seed)
        return tf.matmul(h, w4) + b4


class Cifar10Tutorial:
    """cifar10.py inference(): input N x 24 x 24 x 3, standardised -> logits."""

    uses_dropout = False

    def __init__(self, tf, hp):
        self.tf = tf

        def weight(name, shape, stddev):
            return tf.Variable(tf.random.truncated_normal(shape, stddev=stddev), name=name)

        def bias(name, n, value):
            return tf.Variable(tf.fill([n], float(value)), name=name)

        dim = (CIFAR_CROP // 4) * (CIFAR_CROP // 4) * 64      # 6 x 6 x 64 after two pools
        self.variables = [
            weight("conv1/weights", [5, 5, 3, 64], 5e-2), bias("conv1/biases", 64, 0.0),
            weight("conv2/weights", [5, 5, 64, 64], 5e-2), bias("conv2/biases", 64, 0.1),
            weight("local3/weights", [dim, 384], 0.04), bias("local3/biases", 384, 0.1),
            weight("local4/weights", [384, 192], 0.04), bias("local4/biases", 192, 0.1),
            weight("softmax_linear/weights", [192, 10], 1 / 192.0),
            bias("softmax_linear/biases", 10, 0.0),
        ]
        wd = hp["weight_decay"]
        self.weight_decay = [(self.variables[4], wd), (self.variables[6], wd)]

    def logits(self, params, x, dropout_seed=None):
        tf = self.tf
        w1, b1, w2, b2, w3, b3, w4, b4, w5, b5 = params

        def lrn(h):
            return tf.nn.local_response_normalization(h, depth_radius=4, bias=1.0,
                                                      alpha=0.001 / 9.0, beta=0.75)

        h = lrn(tf.nn.max_pool2d(conv_relu(tf, x, w1, b1), 3, 2, "SAME"))
        h = tf.nn.max_pool2d(lrn(conv_relu(tf, h, w2, b2)), 3, 2, "SAME")
        h = tf.reshape(h, [tf.shape(h)[0], -1])
        h = tf.nn.relu(tf.matmul(h, w3) + b3)
        h = tf.nn.relu(tf.matmul(h, w4) + b4)
        return tf.matmul(h, w5) + b5


# -- the adapter ------------------------------------------------------------------
class Adapter:
    def __init__(self, ctx):
        self.ctx = ctx
        self.hp = ctx.hp

    # -- setup ---------------------------------------------------------------
    def setup(self):
        import tensorflow as tf
        import keras
        self.np, self.tf, self.keras = np, tf, keras
        ctx, hp = self.ctx, self.hp
        if ctx.threads:
            # Before any op runs; TF's own default is one of each per core.
            tf.config.threading.set_intra_op_parallelism_threads(ctx.threads)
            tf.config.threading.set_inter_op_parallelism_threads(ctx.threads)
        self.device = self._device()
        tf.random.set_seed(ctx.seed)
        self.order_rng = np.random.default_rng(ctx.seed)
        arrays = ctx.load_data()
        with tf.device(self.device):
            if ctx.dataset == "mnist":
                self._mnist_data(arrays)
                self.model = MnistDeep(tf, hp)
                self.optimizer = keras.optimizers.Adam(
                    learning_rate=hp["learning_rate"], beta_1=hp["beta1"], beta_2=hp["beta2"],
                    epsilon=hp["epsilon"])
            elif ctx.dataset == "cifar10":
                self._cifar_data(arrays)
                self.model = Cifar10Tutorial(tf, hp)
                batches_per_epoch = CIFAR_EXAMPLES_PER_EPOCH / hp["batch_size"]
                schedule = keras.optimizers.schedules.ExponentialDecay(
                    hp["learning_rate"], int(batches_per_epoch * hp["epochs_per_decay"]),
                    hp["learning_rate_decay_factor"], staircase=True)
                self.optimizer = keras.optimizers.SGD(learning_rate=schedule, momentum=0.0)
            else:
                raise ValueError("no tensorflow model for %s" % ctx.dataset)
            variables = self.model.variables
            self.optimizer.build(variables)
            decay = hp.get("moving_average_decay", 0.0)
            self.averages = [tf.Variable(v, trainable=False) for v in variables] if decay else None
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.rng = tf.random.Generator.from_seed(ctx.seed)
            spec = tf.TensorSpec
            self.train_step = tf.function(self._train_step, input_signature=[
                spec([hp["batch_size"]], tf.int32)])
            self.test_step = tf.function(self._test_step, input_signature=[
                spec([None] + self.test_x.shape[1:].as_list(), self.test_x.dtype),
                spec([None], tf.int32)])
        ctx.planned_epochs = hp["max_steps"] * hp["batch_size"] / len(self.train_y)
        self._warm_up()

    def _device(self):
        tf, device = self.tf, self.ctx.device
        if not device.startswith("cuda"):
            return "/CPU:0"
        if not tf.test.is_built_with_cuda():
            raise ValueError("device %r: this image's TensorFlow %s is a CPU-only build "
                             "(tensorflow-cpu), without CUDA" % (device, tf.__version__))
        index = int(device.partition(":")[2] or 0)
        gpus = tf.config.list_physical_devices("GPU")
        if index >= len(gpus):
            raise ValueError("device %r: TensorFlow sees %d GPU(s)" % (device, len(gpus)))
        return "/GPU:%d" % index

    def _mnist_data(self, arrays):
        """read_data_sets(): the first 5,000 training images are the validation
        set, the rest are trained on; pixels as float32 times 1/255."""
        np, tf = self.np, self.tf
        keep = slice(self.hp["validation_size"], None)

        def scale(images):
            return (images.astype(np.float32) * np.float32(1.0 / 255.0))[..., None]

        self.train_x = tf.constant(scale(arrays["train_images"][keep]))
        self.train_y = arrays["train_labels"][keep].astype(np.int32)
        self.train_y_t = tf.constant(self.train_y)
        self.test_x = tf.constant(scale(arrays["test_images"]))
        self.test_y = arrays["test_labels"].astype(np.int32)
        self.ctx.train_samples = len(self.train_y)
        self.augment = None

    def _cifar_data(self, arrays):
        """The raw bytes, N x 32 x 32 x 3 (as read_cifar10 transposes them); the
        distortions and standardisation run in the step functions."""
        np, tf = self.np, self.tf
        self.train_x = tf.constant(np.ascontiguousarray(arrays["train_images"].transpose(0, 2, 3, 1)))
        self.train_y = arrays["train_labels"].astype(np.int32)
        self.train_y_t = tf.constant(self.train_y)
        self.test_x = tf.constant(np.ascontiguousarray(arrays["test_images"].transpose(0, 2, 3, 1)))
        self.test_y = arrays["test_labels"].astype(np.int32)
        self.augment = self._distort

    # -- inputs ----------------------------------------------------------------
    def _distort(self, images):
        """distorted_inputs(), per image: random crop, flip, brightness, contrast,
        then per_image_standardization (on float pixels in 0..255, unclipped)."""
        tf, hp, rng = self.tf, self.hp, self.rng
        n = tf.shape(images)[0]
        size, full = CIFAR_CROP, images.shape[1]
        x = tf.cast(images, tf.float32)
        # random_crop: a uniform offset per image, exact pixels (no resampling)
        offsets = rng.uniform([n, 2], 0, full - size + 1, dtype=tf.int32)
        span = tf.range(size)
        rows = offsets[:, :1] + span
        cols = offsets[:, 1:] + span
        x = tf.gather(x, rows, axis=1, batch_dims=1)
        x = tf.gather(x, cols, axis=2, batch_dims=1)
        # random_flip_left_right: probability 1/2
        flip = rng.uniform([n, 1, 1, 1]) < 0.5
        x = tf.where(flip, tf.reverse(x, axis=[2]), x)
        # random_brightness(max_delta=63): x + delta
        delta = hp["max_brightness_delta"]
        x = x + rng.uniform([n, 1, 1, 1], -delta, delta)
        # random_contrast(0.2, 1.8): (x - mean) * factor + mean, mean per image and channel
        factor = rng.uniform([n, 1, 1, 1], hp["contrast_lower"], hp["contrast_upper"])
        mean = tf.reduce_mean(x, axis=[1, 2], keepdims=True)
        x = (x - mean) * factor + mean
        return tf.image.per_image_standardization(x)

    def _central(self, images):
        """inputs(eval_data=True): resize_image_with_crop_or_pad to the central
        24x24, then per_image_standardization."""
        tf = self.tf
        if self.augment is None:
            return images
        start = (images.shape[1] - CIFAR_CROP) // 2
        x = tf.cast(images[:, start:start + CIFAR_CROP, start:start + CIFAR_CROP, :], tf.float32)
        return tf.image.per_image_standardization(x)

    # -- the step functions -------------------------------------------------------
    def _train_step(self, index):
        tf, model = self.tf, self.model
        images = tf.gather(self.train_x, index)
        labels = tf.gather(self.train_y_t, index)
        x = self.augment(images) if self.augment is not None else images
        dropout_seed = self.rng.make_seeds(1)[:, 0] if model.uses_dropout else None
        with tf.GradientTape() as tape:
            logits = model.logits(model.variables, x, dropout_seed)
            cross_entropy = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
            loss = cross_entropy
            for var, wd in model.weight_decay:
                loss = loss + wd * tf.nn.l2_loss(var)
        grads = tape.gradient(loss, model.variables)
        self.optimizer.apply_gradients(zip(grads, model.variables))
        if self.averages is not None:
            step = tf.cast(self.global_step, tf.float32)
            decay = tf.minimum(self.hp["moving_average_decay"], (1.0 + step) / (10.0 + step))
            for shadow, var in zip(self.averages, model.variables):
                shadow.assign_sub((1.0 - decay) * (shadow - var))
        self.global_step.assign_add(1)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels),
                                        tf.int32))
        return loss, correct

    def _test_step(self, images, labels):
        tf, model = self.tf, self.model
        params = self.averages if self.averages is not None else model.variables
        logits = model.logits(params, self._central(images))
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels),
                                        tf.int32))
        return loss, correct

    def _state(self):
        """Every variable a training step changes."""
        state = list(self.model.variables) + list(self.optimizer.variables)
        state += list(self.averages or []) + [self.global_step, self.rng.state]
        return state

    def _warm_up(self):
        """Trace and optimise both graphs with one real step, then put every
        variable back, so training starts from the initial state."""
        tf, np = self.tf, self.np
        with tf.device(self.device):
            state = self._state()
            saved = [np.array(v.numpy(), copy=True) for v in state]
            index = tf.constant(np.arange(self.hp["batch_size"], dtype=np.int32))
            self.train_step(index)
            for var, value in zip(state, saved):
                var.assign(value)
            self.test_step(self.test_x[:1], tf.constant(self.test_y[:1]))

    # -- train ---------------------------------------------------------------
    def train(self):
        tf, np, hp, ctx = self.tf, self.np, self.hp, self.ctx
        batch, n = hp["batch_size"], len(self.train_y)
        stream = IndexStream(n, batch, self.order_rng)
        epoch, loss_sum, correct, seen = 1, 0.0, 0, 0
        ctx.epoch_start()
        with tf.device(self.device):
            for step in range(hp["max_steps"]):
                start = step * batch
                # A step belongs to the epoch in which its batch starts.
                if start // n + 1 != epoch:
                    ctx.epoch_done(epoch, loss_sum / seen, correct / seen, samples=seen)
                    epoch, loss_sum, correct, seen = start // n + 1, 0.0, 0, 0
                    ctx.epoch_start()
                index = tf.constant(stream.next().astype(np.int32))
                loss, right = self.train_step(index)
                loss = float(loss)          # waits for the step
                loss_sum += loss * batch
                correct += int(right)
                seen += batch
                ctx.progress(epoch, (start % n) / n, loss, step=step + 1)
        if seen:
            ctx.epoch_done(epoch, loss_sum / seen, correct / seen, samples=seen)

    # -- test ----------------------------------------------------------------
    def test(self):
        tf = self.tf
        batch, n = self.hp["test_batch_size"], len(self.test_y)
        loss_sum, correct = 0.0, 0
        with tf.device(self.device):
            for start in range(0, n, batch):
                loss, right = self.test_step(self.test_x[start:start + batch],
                                             tf.constant(self.test_y[start:start + batch]))
                loss_sum += float(loss)
                correct += int(right)
        return {"accuracy": correct / n, "loss": loss_sum / n}

    # -- describe ------------------------------------------------------------
    def describe(self):
        tf, np, keras = self.tf, self.np, self.keras
        import google.protobuf
        build = tf.sysconfig.get_build_info()
        gpu = self.device.startswith("/GPU")
        device_name = None
        if gpu:
            physical = tf.config.list_physical_devices("GPU")[int(self.device.rpartition(":")[2])]
            device_name = tf.config.experimental.get_device_details(physical).get("device_name")
        threading = tf.config.threading
        return {
            "framework_version": tf.__version__,
            # trainable variables, as tf.trainable_variables() counts them (no
            # moving averages, no optimizer slots)
            "param_count": int(sum(v.shape.num_elements() for v in self.model.variables)),
            "device_name": device_name,
            "threads": {"requested": self.ctx.threads,
                        "framework": {
                            "intra_op_parallelism_threads":
                                threading.get_intra_op_parallelism_threads(),
                            "inter_op_parallelism_threads":
                                threading.get_inter_op_parallelism_threads(),
                            "onednn_enabled": _onednn_enabled(),
                            "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                        }},
            "libraries": {"numpy": np.__version__, "keras": keras.__version__,
                          "protobuf": google.protobuf.__version__,
                          "cuda": build.get("cuda_version"), "cudnn": build.get("cudnn_version"),
                          "tensorflow_build": "cuda" if build.get("is_cuda_build") else "cpu"},
        }


def _onednn_enabled():
    """Whether TF runs its oneDNN kernels (on by default in x86 Linux builds,
    TF_ENABLE_ONEDNN_OPTS=0 turns them off); None where TF cannot say."""
    try:
        from tensorflow.python.util import _pywrap_util_port
        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return None
