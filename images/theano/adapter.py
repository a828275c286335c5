"""Theano adapter: the deeplearning.net LeNet5 tutorial, trained by Theano itself.

GTDLBench's Theano default on MNIST is ``THEANO_FLAGS=device=cpu python
convolutional_mlp.py``: ``evaluate_lenet5()`` of the DeepLearningTutorials
(code/convolutional_mlp.py, with LogisticRegression and load_data from
logistic_sgd.py and HiddenLayer from mlp.py).  The graph here is that
tutorial's, op for op:

* conv 5x5, 20 maps (``theano.tensor.nnet.conv2d``, 'valid') -> max-pool 2x2
  (``pool_2d``, ignore_border) -> + bias -> tanh; the same with 50 maps;
  flatten; fully connected 500 + tanh (HiddenLayer); fully connected 10 +
  softmax (LogisticRegression); cost: the mean negative log-likelihood.
* Initial weights, drawn in the tutorial's order from one
  ``numpy.random.RandomState``: conv filters U(-b, b) with
  b = sqrt(6 / (fan_in + fan_out)), fan_in = maps_in*5*5,
  fan_out = maps_out*5*5 // (2*2) (the tutorial's integer division); hidden
  layer U(-b, b), b = sqrt(6 / (n_in + n_out)) (tanh: no factor 4); the
  logistic layer's weights and every bias start at zero.
* Plain SGD, ``param - learning_rate * grad`` for every parameter, lr 0.1,
  minibatches of 500 taken in file order (no shuffling), at most 200 epochs.
* Early stopping as in the tutorial: patience 10,000 iterations, patience
  increase 2, improvement threshold 0.995, validation every
  min(n_train_batches, patience // 2) iterations (every epoch here), on the
  last 10,000 training images; training uses the first 50,000 (the split of
  the tutorial's mnist.pkl.gz).  Training stops when patience <= iteration,
  also within an epoch; that epoch is reported with the images it saw.
* Pixels as in mnist.pkl.gz: byte / 256 (its largest value is 255/256).

How dlbench differs from the tutorial, and why:

* The tutorial tests on the test set each time the validation error reaches a
  new best and prints the score of the last such test.  Here the parameters
  are copied at every new best validation score and restored when training
  ends, and the test runs once, after training, on those parameters: the same
  number, with the test passes out of the training time.
* The weights are drawn from RandomState(seed) with the job's seed; the
  tutorial hard-codes 23455 (``--seed 23455`` gives its draw).
* The tutorial compiles its functions for a fixed batch of 500 and drops a
  last partial batch; here the batch dimension is left open so that the test
  covers every test image whatever the batch size (with 500, nothing is
  dropped either way).  Training and validation still use whole batches only.
* The training function also returns the minibatch's error count (from the
  same forward pass) for the per-epoch training accuracy.
* The data come from the canonical IDX / CIFAR-10 binary files instead of
  mnist.pkl.gz; labels are int32 shared variables (the tutorial stores floatX
  and casts, for the GPU).  ``validation_images`` (10,000) names the split
  that mnist.pkl.gz fixes; ``epochs`` is the tutorial's ``n_epochs``.
* Where training ended (epochs run, iterations, whether patience ran out, the
  best validation error and its iteration) goes to result.json under
  ``early_stopping``; the stored row shows it as the number of epochs and the
  images of the last one.
* Theano is discontinued; Debian's 1.0.5 is its last release.  The tutorial's
  final form (theano.tensor.nnet.conv2d, pool.pool_2d) is used as written for
  Theano 1.0; its older forms (conv.conv2d, downsample.max_pool_2d) build the
  same graph.

CIFAR-10: GTDLBench names a Theano CIFAR-10 ``convolutional_mlp.py`` derived
from the Reslab theano-tutorial but never published it.  dlbench's definition
is the same LeNet5 on 3x32x32 input (channel-first, byte / 256): conv 5x5
3->20, pool, conv 5x5 20->50, pool, 50*5*5 -> 500 -> 10, with the MNIST
hyper-parameters and the last 10,000 training images for validation.

Theano settings (THEANO_FLAGS, set before the import): device=cpu,
floatX=float32 (the float64 default breaks the tutorial's float32 updates),
base_compiledir in a fresh directory under $DLBENCH_COMPILE_DIR, else under
the temporary directory (the job's root file system is read-only, and its /tmp
is noexec while the compiled modules are loaded as shared objects),
blas.ldflags=-lopenblas (Theano calls OpenBLAS's sgemm directly), openmp on
when more than one thread is requested (CorrMM then works on the images of a
batch in parallel), on_opt_error and on_shape_error raise (Theano's default
prints a warning and goes on without the optimisation).  Every function is
compiled in setup(); a Theano without a C++ compiler would silently run Python
implementations, or its Python virtual machine instead of the C one, so setup()
refuses both.
"""

import os
import subprocess
import tempfile

DEBIAN_VERSION = "1.0.5+dfsg-2"
NKERNS = (20, 50)          # evaluate_lenet5(nkerns=[20, 50])
FILTER = 5
POOL = (2, 2)
N_HIDDEN = 500
N_CLASSES = 10
PIXEL_SCALE = 1.0 / 256    # mnist.pkl.gz: byte / 256
SHAPES = {"mnist": (1, 28, 28), "cifar10": (3, 32, 32)}


def theano_flags(threads, compiledir):
    # on_opt_error, on_shape_error: by default Theano prints a warning and goes on
    # without the optimisation (or with a default shape); here that fails the job.
    flags = ["device=cpu", "floatX=float32", "mode=FAST_RUN",
             "base_compiledir=%s" % compiledir, "blas.ldflags=-lopenblas",
             "on_opt_error=raise", "on_shape_error=raise"]
    if threads:
        flags.append("openmp=%s" % ("True" if threads > 1 else "False"))
    return ",".join(flags)


def conv_bound(numpy, filter_shape, poolsize):
    """LeNetConvPoolLayer: sqrt(6 / (fan_in + fan_out)), fan_out divided by
    the pooling area with the tutorial's integer division."""
    fan_in = int(numpy.prod(filter_shape[1:]))
    fan_out = int(filter_shape[0] * numpy.prod(filter_shape[2:])) // int(numpy.prod(poolsize))
    return numpy.sqrt(6.0 / (fan_in + fan_out))


class Adapter:
    def __init__(self, ctx):
        self.ctx = ctx
        self.hp = ctx.hp
        self.early_stopping = None

    # -- setup ---------------------------------------------------------------
    def setup(self):
        if self.ctx.device != "cpu":
            raise ValueError("this theano image is a CPU build (Debian's Theano without "
                             "libgpuarray/pygpu or CUDA); device %r is not available"
                             % self.ctx.device)
        if self.ctx.dataset not in SHAPES:
            raise ValueError("no theano model for %s" % self.ctx.dataset)
        self.compiledir = tempfile.mkdtemp(prefix="dlbench-theano-",
                                           dir=os.environ.get("DLBENCH_COMPILE_DIR") or None)
        os.environ["THEANO_FLAGS"] = theano_flags(self.ctx.threads, self.compiledir)
        import numpy
        import theano
        self.np, self.theano = numpy, theano
        if not theano.config.cxx:
            raise RuntimeError("Theano found no C++ compiler (config.cxx is empty): it would "
                               "run its ops in Python, about 60x slower")
        if "openblas" not in theano.config.blas.ldflags:
            raise RuntimeError("Theano does not link OpenBLAS (blas.ldflags=%r)"
                               % theano.config.blas.ldflags)
        self._load_data()
        self._build()

    def _load_data(self):
        np, theano, hp = self.np, self.theano, self.hp
        arrays = self.ctx.load_data()
        n_valid = hp["validation_images"]
        images, labels = arrays["train_images"], arrays["train_labels"]
        if not 0 < n_valid < len(labels):
            raise ValueError("validation_images must be between 1 and %d" % (len(labels) - 1))
        n_train = len(labels) - n_valid

        def shared(x, y):
            x = x.reshape(len(x), -1).astype(theano.config.floatX)
            x *= np.float32(PIXEL_SCALE)        # in place: CIFAR-10 is 737 MB as float32
            return (theano.shared(x, borrow=True),
                    theano.shared(y.astype("int32"), borrow=True))

        # mnist.pkl.gz's split: the first 50,000 for training, the rest for validation.
        self.train_x, self.train_y = shared(images[:n_train], labels[:n_train])
        self.valid_x, self.valid_y = shared(images[n_train:], labels[n_train:])
        self.test_x, self.test_y = shared(arrays["test_images"], arrays["test_labels"])
        self.n_train, self.n_valid = n_train, n_valid
        self.n_test = len(arrays["test_labels"])
        self.ctx.train_samples = n_train

    def _build(self):
        np, theano, hp = self.np, self.theano, self.hp
        T = theano.tensor
        from theano.tensor.nnet import conv2d
        from theano.tensor.signal import pool
        floatX = theano.config.floatX
        rng = np.random.RandomState(self.ctx.seed)
        batch = hp["batch_size"]
        channels, height, width = SHAPES[self.ctx.dataset]

        index = T.lscalar("index")
        x = T.matrix("x")
        y = T.ivector("y")

        def uniform(bound, shape):
            return theano.shared(np.asarray(rng.uniform(low=-bound, high=bound, size=shape),
                                            dtype=floatX), borrow=True)

        def zeros(shape):
            return theano.shared(np.zeros(shape, dtype=floatX), borrow=True)

        # LeNetConvPoolLayer x 2
        layer_input = x.reshape((x.shape[0], channels, height, width))
        maps_in, size = channels, (height, width)
        params = []
        for maps_out in NKERNS:
            filter_shape = (maps_out, maps_in, FILTER, FILTER)
            W = uniform(conv_bound(np, filter_shape, POOL), filter_shape)
            b = zeros((maps_out,))
            conv_out = conv2d(input=layer_input, filters=W, filter_shape=filter_shape,
                              input_shape=(None, maps_in) + size)
            pooled = pool.pool_2d(input=conv_out, ws=POOL, ignore_border=True)
            layer_input = T.tanh(pooled + b.dimshuffle("x", 0, "x", "x"))
            params = [W, b] + params
            size = tuple((s - FILTER + 1) // p for s, p in zip(size, POOL))
            maps_in = maps_out

        # HiddenLayer (tanh)
        n_in = maps_in * size[0] * size[1]
        bound = np.sqrt(6.0 / (n_in + N_HIDDEN))
        W = uniform(bound, (n_in, N_HIDDEN))
        b = zeros((N_HIDDEN,))
        hidden = T.tanh(T.dot(layer_input.flatten(2), W) + b)
        params = [W, b] + params

        # LogisticRegression
        W, b = zeros((N_HIDDEN, N_CLASSES)), zeros((N_CLASSES,))
        p_y_given_x = T.nnet.softmax(T.dot(hidden, W) + b)
        params = [W, b] + params
        y_pred = T.argmax(p_y_given_x, axis=1)
        cost = -T.mean(T.log(p_y_given_x)[T.arange(y.shape[0]), y])
        errors = T.mean(T.neq(y_pred, y))

        # The tutorial's order: layer3 + layer2 + layer1 + layer0.
        self.params = params
        lr = np.asarray(hp["learning_rate"], dtype=floatX)
        updates = [(p, p - lr * g) for p, g in zip(params, T.grad(cost, params))]

        def window(data):
            return data[index * batch:(index + 1) * batch]

        self.train_fn = theano.function(
            [index], [cost, errors], updates=updates,
            givens={x: window(self.train_x), y: window(self.train_y)})
        self.validate_fn = theano.function(
            [index], errors, givens={x: window(self.valid_x), y: window(self.valid_y)})
        self.test_fn = theano.function(
            [index], [cost, errors], givens={x: window(self.test_x), y: window(self.test_y)})
        self._check_compiled()

    def _check_compiled(self):
        """Fail loudly if the graph did not become C code: every node of the training
        function must have a C implementation and the convolutions must be CorrMM."""
        if type(self.train_fn.fn).__name__ != "CVM":
            raise RuntimeError("Theano runs the training function with %s, not its C virtual "
                               "machine (CVM): lazylinker_c did not compile"
                               % type(self.train_fn.fn).__name__)
        fgraph = self.train_fn.maker.fgraph
        ops = sorted({type(node.op).__name__ for node in fgraph.apply_nodes})
        if not any(op.startswith("CorrMM") for op in ops):
            raise RuntimeError("the convolutions were not compiled to CorrMM (ops: %s)"
                               % ", ".join(ops))
        self.conv_ops = [op for op in ops if op.startswith("CorrMM")]
        thunks = self.train_fn.fn
        python_ops = []
        for node, thunk in zip(getattr(thunks, "nodes", []), getattr(thunks, "thunks", [])):
            if not hasattr(thunk, "cthunk"):
                python_ops.append(type(node.op).__name__)
        if python_ops:
            raise RuntimeError("ops without C code in the training function: %s"
                               % ", ".join(sorted(set(python_ops))))

    # -- train ---------------------------------------------------------------
    def train(self):
        np, hp, ctx = self.np, self.hp, self.ctx
        batch = hp["batch_size"]
        n_train_batches = self.n_train // batch
        n_valid_batches = self.n_valid // batch
        if n_train_batches == 0 or n_valid_batches == 0:
            raise ValueError("batch_size %d is larger than the training or validation set" % batch)
        patience = hp["patience"]
        validation_frequency = min(n_train_batches, patience // 2)
        best_validation_loss, best_iter, best_params = np.inf, 0, None
        stopped_at = None
        epoch, done_looping, it = 0, False, 0
        while epoch < hp["epochs"] and not done_looping:
            epoch += 1
            ctx.epoch_start()
            loss_sum, error_sum, seen = 0.0, 0.0, 0
            for minibatch_index in range(n_train_batches):
                it = (epoch - 1) * n_train_batches + minibatch_index
                cost, errors = self.train_fn(minibatch_index)
                loss_sum += float(cost) * batch
                error_sum += float(errors) * batch
                seen += batch
                ctx.progress(epoch, (minibatch_index + 1) / n_train_batches, cost, step=it + 1)
                if (it + 1) % validation_frequency == 0:
                    this_validation_loss = float(np.mean(
                        [self.validate_fn(i) for i in range(n_valid_batches)]))
                    if this_validation_loss < best_validation_loss:
                        if this_validation_loss < best_validation_loss * hp["improvement_threshold"]:
                            patience = max(patience, it * hp["patience_increase"])
                        best_validation_loss, best_iter = this_validation_loss, it
                        best_params = [p.get_value(borrow=False) for p in self.params]
                if patience <= it:
                    done_looping, stopped_at = True, it
                    break
            ctx.epoch_done(epoch, loss_sum / seen, 1.0 - error_sum / seen, samples=seen)
        # The tutorial reports the test score of the best validation model.
        if best_params is not None:
            for p, value in zip(self.params, best_params):
                p.set_value(value, borrow=True)
        self.early_stopping = {
            "epochs_run": epoch, "iterations": it + 1, "stopped_early": done_looping,
            "stopped_at_iteration": None if stopped_at is None else stopped_at + 1,
            "final_patience": patience, "best_iteration": best_iter + 1,
            "best_validation_error": None if best_params is None else best_validation_loss,
            "validation_frequency": validation_frequency,
        }
        print("theano: trained %d epoch(s), %d iterations; %s; best validation error %s "
              "at iteration %d" % (epoch, it + 1,
                                   "stopped early (patience %d)" % patience if done_looping
                                   else "epoch limit reached",
                                   best_validation_loss, best_iter + 1), flush=True)

    # -- test ----------------------------------------------------------------
    def test(self):
        batch = self.hp["batch_size"]
        loss_sum, error_sum = 0.0, 0.0
        for i in range((self.n_test + batch - 1) // batch):
            count = min(batch, self.n_test - i * batch)
            cost, errors = self.test_fn(i)
            loss_sum += float(cost) * count
            error_sum += float(errors) * count
        return {"accuracy": 1.0 - error_sum / self.n_test, "loss": loss_sum / self.n_test}

    # -- describe ------------------------------------------------------------
    def describe(self):
        np, theano = self.np, self.theano
        import scipy
        config = theano.config
        return {
            "framework_version": theano.__version__,
            "param_count": int(sum(p.get_value(borrow=True).size for p in self.params)),
            "device_name": None,
            "threads": {"requested": self.ctx.threads,
                        "framework": {"theano.config.openmp": bool(config.openmp),
                                      "theano.config.openmp_elemwise_minsize":
                                          int(config.openmp_elemwise_minsize),
                                      "theano.config.blas.ldflags": config.blas.ldflags,
                                      "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                                      "openblas_get_num_threads": _openblas_threads()}},
            "libraries": {"numpy": np.__version__, "scipy": scipy.__version__,
                          "theano_debian": DEBIAN_VERSION, "openblas": _openblas_config(),
                          "cxx": "%s %s" % (config.cxx, _cxx_version(config.cxx))},
            # Kept in result.json (the stored row has no columns for them).
            "theano": {"floatX": config.floatX, "mode": str(config.mode),
                       "linker": str(config.linker), "conv_ops": self.conv_ops},
            "early_stopping": self.early_stopping,
        }


def _cxx_version(cxx):
    try:
        return subprocess.run([cxx, "-dumpfullversion", "-dumpversion"], capture_output=True,
                              text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _openblas():
    """The OpenBLAS mapped into this process (the same instance), or None."""
    import ctypes
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
        for path in sorted(paths):
            library = ctypes.CDLL(path)
            if hasattr(library, "openblas_get_num_threads"):
                return library
    except OSError:
        pass
    return None


def _openblas_threads():
    library = _openblas()
    return None if library is None else int(library.openblas_get_num_threads())


def _openblas_config():
    import ctypes
    library = _openblas()
    if library is None or not hasattr(library, "openblas_get_config"):
        return None
    library.openblas_get_config.restype = ctypes.c_char_p
    return library.openblas_get_config().decode()
