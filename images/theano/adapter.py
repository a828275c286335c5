"""Theano adapter: GTDLBench's two Theano programs, trained by Theano itself.

MNIST: GTDLBench's Theano default is ``THEANO_FLAGS=device=cpu python
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
  new best and prints the score of the last such test.  The ``paper`` profile
  does so too, with the tutorial's prints (see "The paper profile" below);
  every profile also copies the parameters at every new best validation score
  and restores them when training ends, so that the runner's one test, after
  training, scores the same model: the same number as the tutorial's last
  test pass.
* The weights are drawn from RandomState(seed) with the job's seed; the
  tutorial hard-codes 23455 (``--seed 23455`` gives its draw).
* The tutorial compiles its functions for a fixed batch of 500 and drops a
  last partial batch; here the batch dimension is left open so that the test
  covers every test image whatever the batch size (with 500, nothing is
  dropped either way).  Training and validation still use whole batches only.
* The training function also returns the minibatch's error count (from the
  same forward pass) for the per-epoch training accuracy.
* The data come from the canonical IDX files instead of mnist.pkl.gz; labels
  are int32 shared variables (the tutorial stores floatX and casts, for the
  GPU).  ``validation_images`` (10,000) names the split that mnist.pkl.gz
  fixes; ``epochs`` is the tutorial's ``n_epochs``.
* Where training ended (epochs run, iterations, whether patience ran out, the
  best validation error and its iteration) goes to result.json under
  ``early_stopping``; the stored row shows it as the number of epochs and the
  images of the last one.
* Theano is discontinued; Debian's 1.0.5 is its last release.  The tutorial's
  final form (theano.tensor.nnet.conv2d, pool.pool_2d) is used as written for
  Theano 1.0; its older forms (conv.conv2d, downsample.max_pool_2d) build the
  same graph.

CIFAR-10: GTDLBench runs ``python convolutional_mlp.py`` in its
models/cifar10/theano, a file it never published, "derived from Reslab Theano
tutorial (10 February 2015)" (benanne/theano-tutorial).  That tutorial's
CIFAR-10 convnets are 6_convnet.py (grey: load.cifar10's default averages the
three channels), 6_convnet_color.py (colour) and 6_convnet_dropout.py (grey,
dropout 0.5); dlbench rebuilds the colour one, CIFAR-10 as the other
frameworks take it (docs/frameworks/theano.md gives the evidence; ``grayscale`` true gives
6_convnet.py's input):

* load.py's data: byte / 255.0 (0 to 1, nothing subtracted), one-hot labels,
  the 50,000 training images in file order, no validation split.
* conv 3x3 3->4 ('valid', 30x30) + bias -> ReLU -> max-pool 3x3 (10x10);
  conv 3x3 4->8 (8x8) + bias -> ReLU -> max-pool 2x2 (4x4); flatten 128 ->
  fully connected 100 + ReLU -> fully connected 10 -> softmax; cost: the mean
  categorical cross-entropy against the one-hot labels.  The script's
  max_pool_2d leaves ignore_border False; 30 and 8 divide by 3 and 2, so the
  sizes are the same.
* Every weight and bias N(0, 0.1^2) (``randn * 0.1``), drawn in the script's
  order (w_c1, b_c1, w_c2, b_c2, w_h3, b_h3, w_o, b_o) from
  RandomState(seed); the script draws from numpy's unseeded global generator.
* Its momentum: v = 0.9 v - 0.01 grad, then param + v, velocities from zero;
  minibatches of 50 in file order (a last partial one trained too), 50 epochs.
* The script prints the test accuracy after every epoch; the last is its
  result.  The ``paper`` profile does so too (see below); every profile also
  tests once after the last epoch, in the runner's test phase: the same
  number.  The training function also returns the minibatch's count of
  correct predictions, for the per-epoch training accuracy.

The paper profile: the periodic work of the originals' loops, as they do it.
Only in the ``paper`` profile (``quick`` skips it, to stay short):

* LeNet5 prints "training @ iter = " every 100 iterations, the validation
  error at every validation pass and, at every new best validation score,
  tests the model with the tutorial's ``test_model`` (errors only, whole
  minibatches: 20 of 500) and prints its error; after the loop the
  tutorial's three closing lines ("Optimization complete.", the best scores,
  "The code for file convolutional_mlp.py ran for N.NNm" on stderr).
* The Reslab convnet prints "iteration N" before every epoch and after it
  tests the whole test set with the script's ``predict`` (argmax only, one
  call) and prints "accuracy: N.NNNNN" and an empty line.

Timing.  ``train_time_s`` is the training steps only in every profile: the
runner's clock around ``train()`` less ``ctx.train_excluded_s``, which holds
what the loop does besides training (validation and test passes, prints,
dlbench's copies of the best weights and their restoring).  In the ``paper``
profile describe() also returns:

* ``paper_train_time_s``: the originals' timed span.  LeNet5: the tutorial's
  ``start_time``...``end_time``, the whole loop with its validation and test
  passes and prints (what its "ran for" line prints, in minutes), less
  dlbench's weight copies, which the tutorial does not make.  Reslab: the
  script has no clock; its loop of epochs, each with its test pass and
  prints, the span the LeNet5 tutorial's clock covers.
* ``paper_test_time_s``: neither program prints a testing time; this is the
  original's own test pass of its final model, the one whose score it
  prints last (LeNet5: the last test pass in the loop, of the best validation
  model; Reslab: the last epoch's).

Counts and times of the periodic passes go to result.json under
``periodic_passes`` in every profile (the LeNet5 validation passes run in
every profile: early stopping needs them).

Numeric type: Theano computes in ``floatX``, float64 unless told otherwise;
GTDLBench set only device=cpu, so both programs ran in float64, data,
weights and updates alike (every variable of the tutorials follows floatX).
The ``dtype`` hyper-parameter sets floatX: float64 by default,
``dtype=float32`` for the faster single-precision variant.

Theano settings (THEANO_FLAGS, set before the import): device=cpu (a GPU
job: device=cuda, or cudaN for GPU N, the gpuarray back-end, with
dnn.enabled=False: Theano 1.0.5 needs cuDNN 7, which has no CUDA 11 build, so
convolutions run as GpuCorrMM on cuBLAS), floatX from ``dtype``, base_compiledir in a fresh directory under
$DLBENCH_COMPILE_DIR, else under the temporary directory (the job's root file
system is read-only, and its /tmp is noexec while the compiled modules are
loaded as shared objects), blas.ldflags=-lopenblas (Theano calls OpenBLAS's
gemm directly, and sets its threads to 1 inside its own OpenMP loops; a job that
asks for another BLAS library links -lblas, see ``blas_ldflags``), openmp on when more than one thread is requested (CorrMM then
works on the images of a batch in parallel), on_opt_error and on_shape_error
raise (Theano's default prints a warning and goes on without the
optimisation).  Every function of training and testing is compiled in setup()
(the robustness check's at its first call, after them); a Theano without a C++
compiler would silently run Python implementations, or its Python virtual
machine instead of the C one, so setup() refuses both.

On a GPU, a Theano function returns its outputs on the host, but the kernels
of its updates may still be running when it returns; every clock read, the
runner's and the loops' own (``ctx.now``), first waits for the GPU work on the
shared variables the training function updates (``Adapter.synchronize``, the
net's ``sync``).  On the CPU ``sync`` is None and nothing is done.
"""

import os
import subprocess
import sys
import tempfile

from dlbench_runner import blas, contract

DEBIAN_VERSION = "1.0.5+dfsg-2"
# The C modules compiled when the image was built (warm.py), copied into every job's fresh
# compile directory before Theano is imported: Theano compiles only what they lack.
WARM_COMPILEDIR = "/opt/dlbench/theano-compiled"
N_CLASSES = 10

# convolutional_mlp.py's LeNet5 (MNIST)
NKERNS = (20, 50)          # evaluate_lenet5(nkerns=[20, 50])
FILTER = 5
POOL = (2, 2)
N_HIDDEN = 500
PIXEL_SCALE = 1.0 / 256    # mnist.pkl.gz: byte / 256
MNIST_SHAPE = (1, 28, 28)

# The Reslab tutorial's 6_convnet_color.py (CIFAR-10)
RESLAB_MAPS = (4, 8)
RESLAB_FILTER = 3
RESLAB_POOLS = (3, 2)
RESLAB_HIDDEN = 100
RESLAB_INIT_STD = 0.1      # init_weights: randn * 0.1, biases too
RESLAB_PIXEL_MAX = 255.0   # load.py: byte / 255.0
CIFAR_SIZE = 32


def compile_directory(scratch):
    """Theano's base_compiledir for this job: ``scratch``/theano where the job has a scratch
    directory of its own ($DLBENCH_COMPILE_DIR, a container's private tmpfs), a path fixed
    because Theano keys each module by the path it was compiled in (the image's modules were
    compiled there, warm.py); else a fresh temporary directory."""
    if not scratch:
        return tempfile.mkdtemp(prefix="dlbench-theano-")
    path = os.path.join(scratch, "theano")
    os.makedirs(path, exist_ok=True)
    return path


def copy_warm_modules(compiledir, warm=WARM_COMPILEDIR):
    """The image's compiled modules copied into ``compiledir`` (new files, owned by the job's
    user, with new times: Theano drops modules it has not used for weeks); how many.  None
    where the image has none (or while warm.py makes them: DLBENCH_NO_WARM_COMPILEDIR)."""
    import shutil

    if os.environ.get("DLBENCH_NO_WARM_COMPILEDIR") or not os.path.isdir(warm):
        return None
    count = 0
    for name in os.listdir(warm):
        shutil.copytree(os.path.join(warm, name), os.path.join(compiledir, name),
                        copy_function=shutil.copyfile)
        count += len(os.listdir(os.path.join(warm, name)))
    return count


def blas_ldflags(blas):
    """How Theano's compiled ops link BLAS for a job that asks for ``blas`` (None: the
    image's OpenBLAS).  OpenBLAS by its own name: Theano then calls
    openblas_set_num_threads(1) inside its OpenMP loops (CorrMM over a batch), as it
    always did here; with the generic -lblas it does not, and OpenBLAS's threads and
    OpenMP's share the CPUs (the quick LeNet trained in 29 s instead of 20).  Any other
    library through libblas.so.3, which the job's LD_LIBRARY_PATH points at it."""
    return "-lopenblas" if blas in (None, "openblas-pthread", "openblas-openmp") else "-lblas"


def theano_flags(threads, compiledir, floatx, gpu=None, blas=None):
    """THEANO_FLAGS for a job on the CPU (``gpu`` None) or on GPU ``gpu`` (device=cudaN)."""
    # on_opt_error, on_shape_error: by default Theano prints a warning and goes on
    # without the optimisation (or with a default shape); here that fails the job.
    flags = ["device=%s" % ("cpu" if gpu is None else "cuda%d" % gpu), "floatX=%s" % floatx,
             "mode=FAST_RUN", "base_compiledir=%s" % compiledir, "blas.ldflags=%s" % blas_ldflags(blas),
             "on_opt_error=raise", "on_shape_error=raise"]
    if gpu is not None:
        flags.append("dnn.enabled=False")
    if threads:
        flags.append("openmp=%s" % ("True" if threads > 1 else "False"))
    return ",".join(flags)


def conv_bound(numpy, filter_shape, poolsize):
    """LeNetConvPoolLayer: sqrt(6 / (fan_in + fan_out)), fan_out divided by
    the pooling area with the tutorial's integer division."""
    fan_in = int(numpy.prod(filter_shape[1:]))
    fan_out = int(filter_shape[0] * numpy.prod(filter_shape[2:])) // int(numpy.prod(poolsize))
    return numpy.sqrt(6.0 / (fan_in + fan_out))


def reslab_shapes(channels):
    """The Reslab convnet's parameters in the script's order (its draw order), as
    (name, shape); the dense layer's input is what the two conv/pool stages leave."""
    size, maps_in, shapes = CIFAR_SIZE, channels, []
    for i, (maps, pool) in enumerate(zip(RESLAB_MAPS, RESLAB_POOLS), start=1):
        shapes += [("w_c%d" % i, (maps, maps_in, RESLAB_FILTER, RESLAB_FILTER)), ("b_c%d" % i, (maps,))]
        size, maps_in = (size - RESLAB_FILTER + 1) // pool, maps
    flat = maps_in * size * size
    return shapes + [("w_h3", (flat, RESLAB_HIDDEN)), ("b_h3", (RESLAB_HIDDEN,)),
                     ("w_o", (RESLAB_HIDDEN, N_CLASSES)), ("b_o", (N_CLASSES,))]


class Adapter:
    """Sets Theano up as the job asks and leaves the rest to its data set's model."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.net = None
        self.robust = None      # the robustness check's functions, compiled at its first call
        self.outputs = None     # the migration check's, likewise

    # -- setup ---------------------------------------------------------------
    def setup(self):
        ctx = self.ctx
        gpu = ctx.gpu is not None
        if gpu:
            try:
                import pygpu  # noqa: F401  (the gpuarray back-end's library)
            except ImportError:
                raise ValueError("this theano image is a CPU build (Debian's Theano without "
                                 "libgpuarray/pygpu or CUDA); device %r is not available"
                                 % ctx.device)
        if ctx.dataset not in NETS:
            raise ValueError("no theano model for %s" % ctx.dataset)
        scratch = os.environ.get("DLBENCH_COMPILE_DIR")
        if scratch:
            # Theano finds g++'s -march=native flags by compiling and running a test program
            # in the temporary directory; a job's /tmp is noexec, where it silently compiled
            # every module without them: its temporary files go to the exec scratch instead.
            os.environ["TMPDIR"] = scratch
            tempfile.tempdir = None
        self.compiledir = compile_directory(scratch)
        self.warm_modules = copy_warm_modules(self.compiledir)
        os.environ["THEANO_FLAGS"] = theano_flags(ctx.threads, self.compiledir, ctx.hp["dtype"],
                                                  ctx.gpu, ctx.spec.get("blas"))
        import numpy
        import theano
        self.np, self.theano = numpy, theano
        self.device_name = None
        if gpu:
            import theano.gpuarray
            if not theano.gpuarray.pygpu_activated:
                raise RuntimeError("Theano did not start its gpuarray back-end on %s"
                                   % theano.config.device)
            context = theano.gpuarray.type.get_context(None)
            self.device_name = getattr(context, "devname", None) or theano.config.device
        if not theano.config.cxx:
            raise RuntimeError("Theano found no C++ compiler (config.cxx is empty): it would "
                               "run its ops in Python, about 60x slower")
        if not theano.config.blas.ldflags:
            raise RuntimeError("Theano links no BLAS (blas.ldflags=%r)"
                               % theano.config.blas.ldflags)
        self.net = NETS[ctx.dataset](ctx, numpy, theano)
        self.net.load(ctx.load_data())
        self.net.build()
        self.net.sync = gpu_sync(self.net.updated) if gpu else None
        self.conv_ops = compiled_conv_ops(self.net.train_fn)
        if self.net.sync:
            self.net.sync()

    def train(self):
        self.net.train()

    def synchronize(self):
        """On the GPU, wait for the updates of the last training call (the runner's
        clock reads); on the CPU Theano's calls are done when they return."""
        net = getattr(self, "net", None)
        if net is not None and net.sync:
            net.sync()

    def test(self):
        return self.net.test()

    # -- the robustness check: T.grad through the net's preprocessing ----------------------
    def _robust(self):
        """The robustness check's compiled functions (gradient and predictions,
        predictions, loss, logits, the logits' vector-Jacobian product and predictions),
        compiled at its first call, after every timed span: the net's
        probabilities with its input replaced by its preprocessing of the pixels
        (theano.clone), the input gradient T.grad of the summed training loss with
        respect to the pixels."""
        if self.robust is None:
            theano, net = self.theano, self.net
            T = theano.tensor
            pixels, model_input = net.pixel_input()
            y = T.ivector("y")
            p_y_given_x = theano.clone(net.p_y_given_x, replace={net.x: model_input})
            loss, predicted = net.summed_loss(p_y_given_x, y), T.argmax(p_y_given_x, axis=1)
            logits = p_y_given_x.owner.inputs[0]       # softmax's input: the net's logits
            output_gradient = T.matrix("output_gradient", dtype=logits.dtype)
            self.robust = (theano.function([pixels, y], [T.grad(loss, pixels), predicted]),
                           theano.function([pixels], predicted),
                           theano.function([pixels, y], loss),
                           theano.function([pixels], logits),
                           theano.function([pixels, output_gradient],
                                           [theano.gradient.Lop(logits, pixels, output_gradient),
                                            predicted]))
        return self.robust

    def _floatx(self, pixels):
        """Pixels in floatX, the net's type (float32 pixels widened, or the gradient
        check's float64 ones rounded, for a float32 net)."""
        return self.np.asarray(pixels, dtype=self.theano.config.floatX)

    def input_gradient(self, pixels, labels):
        """T.grad of the summed loss in floatX (the gradient the attacks followed before:
        the gradient check still compares it)."""
        gradient, predicted = self._robust()[0](self._floatx(pixels), labels.astype("int32"))
        return gradient, predicted

    def attack_logits(self, pixels):
        """The net's logits, the softmax's input (``logits`` gives its probabilities, the
        graph's output), in floatX."""
        return self._robust()[3](self._floatx(pixels))

    def input_vjp(self, pixels, output_gradient):
        """theano.gradient.Lop of the logits with respect to the pixels: the vector-Jacobian
        product of ``output_gradient(logits)``, by Theano's own differentiation."""
        x = self._floatx(pixels)
        g = output_gradient(self.attack_logits(x))
        gradient, predicted = self._robust()[4](x, self.np.asarray(g, dtype=self.theano.config.floatX))
        return gradient, predicted

    def predict(self, pixels):
        return self._robust()[1](self._floatx(pixels))

    def loss(self, pixels, labels):
        return float(self._robust()[2](self._floatx(pixels), labels.astype("int32")))

    # -- migration: the trained net as a layer list, for the host's ONNX graph ---------
    def logits(self, pixels):
        """The net's outputs for pixels: the softmax's probabilities (p_y_given_x, the
        graph's output), in floatX."""
        if self.outputs is None:
            theano, net = self.theano, self.net
            pixels_in, model_input = net.pixel_input()
            self.outputs = theano.function(
                [pixels_in], theano.clone(net.p_y_given_x, replace={net.x: model_input}))
        return self.outputs(self._floatx(pixels))

    def export_layers(self, pixels):
        """The net as a layer list from the pixels (its ``layers``), its arrays in floatX."""
        return self.net.layers()

    # -- save ----------------------------------------------------------------
    def save(self, folder):
        """The trained shared variables pickled, as Theano's "Loading and Saving" guide
        and the tutorials (best_model.pkl) save a model."""
        import pickle
        with open(os.path.join(folder, "model.pkl"), "wb") as f:
            pickle.dump(self.net.params, f, protocol=pickle.HIGHEST_PROTOCOL)

    # -- describe ------------------------------------------------------------
    def describe(self):
        np, theano = self.np, self.theano
        import scipy
        config = theano.config
        return {
            "framework_version": theano.__version__,
            "param_count": int(sum(p.get_value(borrow=True).size for p in self.net.params)),
            "param_bytes": int(sum(p.get_value(borrow=True).size * np.dtype(p.dtype).itemsize
                                   for p in self.net.params)),
            "device_name": self.device_name,
            "threads": {"requested": self.ctx.threads,
                        "framework": {"theano.config.openmp": bool(config.openmp),
                                      "theano.config.openmp_elemwise_minsize":
                                          int(config.openmp_elemwise_minsize),
                                      "theano.config.blas.ldflags": config.blas.ldflags,
                                      "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                                      "openblas_get_num_threads": blas.openblas_threads()}},
            "libraries": {"numpy": np.__version__, "scipy": scipy.__version__,
                          "theano_debian": DEBIAN_VERSION, "openblas": _openblas_config(),
                          "cxx": "%s %s" % (config.cxx, _cxx_version(config.cxx))},
            # Kept in result.json (the stored row has no columns for them).
            "theano": {"floatX": config.floatX, "mode": str(config.mode),
                       "linker": str(config.linker), "conv_ops": self.conv_ops,
                       "warm_modules": self.warm_modules},
            "early_stopping": self.net.early_stopping,
            "periodic_passes": self.net.periodic_passes,
            # The spans GTDLBench's method timed: the paper profile only (None otherwise).
            "paper_train_time_s": self.net.paper_train_time_s,
            "paper_test_time_s": self.net.paper_test_time_s,
        }


def gpu_sync(variables):
    """A function that waits until the GPU has finished its work on these shared
    variables (GpuArray.sync); the updates of one training call are its last work.
    Each call looks the arrays up again: an update may store a new one."""
    def sync():
        for variable in variables:
            variable.get_value(borrow=True, return_internal_type=True).sync()
    return sync


def compiled_conv_ops(train_fn):
    """Fail loudly if the graph did not become C code: every node of the training
    function must have a C implementation and the convolutions must be CorrMM
    (GpuCorrMM on the GPU); returns the CorrMM ops."""
    if type(train_fn.fn).__name__ != "CVM":
        raise RuntimeError("Theano runs the training function with %s, not its C virtual "
                           "machine (CVM): lazylinker_c did not compile"
                           % type(train_fn.fn).__name__)
    fgraph = train_fn.maker.fgraph
    ops = sorted({type(node.op).__name__ for node in fgraph.apply_nodes})
    if not any(op.startswith(("CorrMM", "GpuCorrMM")) for op in ops):
        raise RuntimeError("the convolutions were not compiled to CorrMM (ops: %s)"
                           % ", ".join(ops))
    thunks = train_fn.fn
    python_ops = []
    for node, thunk in zip(getattr(thunks, "nodes", []), getattr(thunks, "thunks", [])):
        if not hasattr(thunk, "cthunk"):
            python_ops.append(type(node.op).__name__)
    if python_ops:
        raise RuntimeError("ops without C code in the training function: %s"
                           % ", ".join(sorted(set(python_ops))))
    return [op for op in ops if op.startswith(("CorrMM", "GpuCorrMM"))]


def does_periodic_work(ctx):
    """Whether the job does the originals' periodic work in its training loop: the
    paper profile only."""
    return ctx.spec.get("profile") == contract.PAPER_PROFILE


class LeNet5:
    """convolutional_mlp.py's evaluate_lenet5() on MNIST."""

    def __init__(self, ctx, np, theano):
        self.ctx, self.hp, self.np, self.theano = ctx, ctx.hp, np, theano
        self.paper = does_periodic_work(ctx)
        self.early_stopping = None
        self.periodic_passes = None
        self.paper_train_time_s = self.paper_test_time_s = None
        self.sync = None                # set by the adapter on the GPU

    def load(self, arrays):
        np, theano, hp = self.np, self.theano, self.hp
        floatX = theano.config.floatX
        n_valid = hp["validation_images"]
        images, labels = arrays["train_images"], arrays["train_labels"]
        if not 0 < n_valid < len(labels):
            raise ValueError("validation_images must be between 1 and %d" % (len(labels) - 1))
        n_train = len(labels) - n_valid

        def shared(x, y):
            x = x.reshape(len(x), -1).astype(floatX)
            x *= np.asarray(PIXEL_SCALE, dtype=floatX)      # in place
            return (theano.shared(x, borrow=True),
                    theano.shared(y.astype("int32"), borrow=True))

        # mnist.pkl.gz's split: the first 50,000 for training, the rest for validation.
        self.train_x, self.train_y = shared(images[:n_train], labels[:n_train])
        self.valid_x, self.valid_y = shared(images[n_train:], labels[n_train:])
        self.test_x, self.test_y = shared(arrays["test_images"], arrays["test_labels"])
        self.n_train, self.n_valid = n_train, n_valid
        self.n_test = len(arrays["test_labels"])
        self.ctx.train_samples = n_train

    def build(self):
        np, theano, hp = self.np, self.theano, self.hp
        T = theano.tensor
        from theano.tensor.nnet import conv2d
        from theano.tensor.signal import pool
        floatX = theano.config.floatX
        rng = np.random.RandomState(self.ctx.seed)
        batch = hp["batch_size"]
        channels, height, width = MNIST_SHAPE

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
        self.x, self.p_y_given_x = x, p_y_given_x
        errors = T.mean(T.neq(y_pred, y))

        # The tutorial's order: layer3 + layer2 + layer1 + layer0.
        self.params = params
        lr = np.asarray(hp["learning_rate"], dtype=floatX)
        updates = [(p, p - lr * g) for p, g in zip(params, T.grad(cost, params))]
        self.updated = params

        def window(data):
            return data[index * batch:(index + 1) * batch]

        self.train_fn = theano.function(
            [index], [cost, errors], updates=updates,
            givens={x: window(self.train_x), y: window(self.train_y)})
        self.validate_fn = theano.function(
            [index], errors, givens={x: window(self.valid_x), y: window(self.valid_y)})
        self.test_fn = theano.function(      # and the classes, for the migration check
            [index], [cost, errors, y_pred], givens={x: window(self.test_x), y: window(self.test_y)})
        if self.paper:
            # the tutorial's test_model: the error rate of one minibatch, nothing else
            self.test_model = theano.function(
                [index], errors, givens={x: window(self.test_x), y: window(self.test_y)})

    def pixel_input(self):
        """The robustness check's pixels (N x 28 x 28, byte / 255) and the net's input
        made of them: flattened and rescaled to mnist.pkl.gz's byte / 256."""
        T, floatX = self.theano.tensor, self.theano.config.floatX
        pixels = T.tensor3("pixels")
        return pixels, pixels.flatten(2) * self.np.asarray(255 * PIXEL_SCALE, dtype=floatX)

    def layers(self):
        """The graph of ``build`` as a layer list (``orchestrator/checks/onnx_layers.py``), from
        pixels (``pixel_input``'s scale, then the 1 x 28 x 28 image) to p_y_given_x:
        conv2d is a true convolution (filter_flip), so the kernels are flipped for the
        list's cross-correlation; the bias is added after the pooling."""
        values = [p.get_value() for p in self.params]
        w_out, b_out, w_hidden, b_hidden = values[:4]
        stages = [values[i:i + 2] for i in range(len(values) - 2, 3, -2)]     # layer0 first
        layers = [{"op": "affine", "scale": 255 * PIXEL_SCALE}, {"op": "reshape", "shape": list(MNIST_SHAPE)}]
        for w, b in stages:
            layers += [{"op": "conv", "weight": w[:, :, ::-1, ::-1]},
                       {"op": "pool", "mode": "max", "kernel": list(POOL), "stride": list(POOL)},
                       {"op": "affine", "shift": b.reshape(-1, 1, 1)}, {"op": "tanh"}]
        return layers + [{"op": "flatten"}, {"op": "dense", "weight": w_hidden.T, "bias": b_hidden},
                         {"op": "tanh"}, {"op": "dense", "weight": w_out.T, "bias": b_out},
                         {"op": "softmax"}]

    def summed_loss(self, p_y_given_x, y):
        """The tutorial's negative log-likelihood, summed over the batch."""
        T = self.theano.tensor
        return -T.sum(T.log(p_y_given_x)[T.arange(y.shape[0]), y])

    def train(self):
        np, hp, ctx, paper = self.np, self.hp, self.ctx, self.paper
        clock = ctx.now          # the GPU synchronised first (Adapter.synchronize)
        batch = hp["batch_size"]
        n_train_batches = self.n_train // batch
        n_valid_batches = self.n_valid // batch
        # the tutorial's test passes take whole minibatches only
        n_test_batches = self.n_test // batch if paper else None
        if n_train_batches == 0 or n_valid_batches == 0 or (paper and n_test_batches == 0):
            raise ValueError("batch_size %d is larger than the training, validation or test set"
                             % batch)
        patience = hp["patience"]
        validation_frequency = min(n_train_batches, patience // 2)
        best_validation_loss, best_iter, best_params = np.inf, 0, None
        test_score = 0.0
        stopped_at = None
        # Seconds of the loop that are not training steps; of those, dlbench's weight copies.
        copying = 0.0
        passes, validation_s, test_s, last_test_s = [], 0.0, 0.0, None
        if paper:
            print("... training")
        start_time = clock()
        epoch, done_looping, it = 0, False, 0
        while epoch < hp["epochs"] and not done_looping:
            epoch += 1
            ctx.epoch_start()
            loss_sum, error_sum, seen = 0.0, 0.0, 0
            for minibatch_index in range(n_train_batches):
                it = (epoch - 1) * n_train_batches + minibatch_index
                if paper and it % 100 == 0:
                    t0 = clock()
                    print("training @ iter = ", it)
                    ctx.train_excluded_s += clock() - t0   # as it happens: out of the epoch's time too
                cost, errors = self.train_fn(minibatch_index)
                loss_sum += float(cost) * batch
                error_sum += float(errors) * batch
                seen += batch
                ctx.progress(epoch, (minibatch_index + 1) / n_train_batches, cost, step=it + 1)
                if (it + 1) % validation_frequency == 0:
                    t0 = clock()
                    this_validation_loss = float(np.mean(
                        [self.validate_fn(i) for i in range(n_valid_batches)]))
                    validation_s += clock() - t0
                    done = {"iteration": it + 1, "validation_error": this_validation_loss,
                            "test_error": None}
                    if paper:
                        print("epoch %i, minibatch %i/%i, validation error %f %%"
                              % (epoch, minibatch_index + 1, n_train_batches,
                                 this_validation_loss * 100.))
                    if this_validation_loss < best_validation_loss:
                        if this_validation_loss < best_validation_loss * hp["improvement_threshold"]:
                            patience = max(patience, it * hp["patience_increase"])
                        best_validation_loss, best_iter = this_validation_loss, it
                        if paper:           # the tutorial tests every new best
                            t1 = clock()
                            test_score = np.mean([self.test_model(i) for i in range(n_test_batches)])
                            last_test_s = clock() - t1
                            test_s += last_test_s
                            done["test_error"] = float(test_score)
                            print("     epoch %i, minibatch %i/%i, test error of best model %f %%"
                                  % (epoch, minibatch_index + 1, n_train_batches,
                                     test_score * 100.))
                        t1 = clock()
                        best_params = [p.get_value(borrow=False) for p in self.params]
                        copying += clock() - t1
                    passes.append(done)
                    ctx.train_excluded_s += clock() - t0   # as it happens: out of the epoch's time too
                if patience <= it:
                    done_looping, stopped_at = True, it
                    break
            ctx.epoch_done(epoch, loss_sum / seen, 1.0 - error_sum / seen, samples=seen)
        end_time = clock()
        # The tutorial reports the test score of the best validation model.
        if best_params is not None:
            for p, value in zip(self.params, best_params):
                p.set_value(value, borrow=True)
        if paper:
            print("Optimization complete.")
            print("Best validation score of %f %% obtained at iteration %i, "
                  "with test performance %f %%"
                  % (best_validation_loss * 100., best_iter + 1, test_score * 100.))
            print("The code for file convolutional_mlp.py ran for %.2fm"
                  % ((end_time - start_time - copying) / 60.), file=sys.stderr)
            self.paper_train_time_s = end_time - start_time - copying
            self.paper_test_time_s = last_test_s
        self.early_stopping = {
            "epochs_run": epoch, "iterations": it + 1, "stopped_early": done_looping,
            "stopped_at_iteration": None if stopped_at is None else stopped_at + 1,
            "final_patience": patience, "best_iteration": best_iter + 1,
            "best_validation_error": None if best_params is None else best_validation_loss,
            "validation_frequency": validation_frequency,
        }
        self.periodic_passes = {
            "validation": len(passes), "validation_s": validation_s,
            "test": sum(p["test_error"] is not None for p in passes), "test_s": test_s,
            "passes": passes,
        }
        print("theano: trained %d epoch(s), %d iterations; %s; best validation error %s "
              "at iteration %d" % (epoch, it + 1,
                                   "stopped early (patience %d)" % patience if done_looping
                                   else "epoch limit reached",
                                   best_validation_loss, best_iter + 1), flush=True)
        # The loop's other work and everything after it (restoring the best weights,
        # the closing prints) is not training.
        ctx.train_excluded_s += clock() - end_time

    def test(self):
        batch = self.hp["batch_size"]
        loss_sum, error_sum, predicted = 0.0, 0.0, []
        for i in range((self.n_test + batch - 1) // batch):
            count = min(batch, self.n_test - i * batch)
            cost, errors, classes = self.test_fn(i)
            loss_sum += float(cost) * count
            error_sum += float(errors) * count
            predicted.append(classes)
        return {"accuracy": 1.0 - error_sum / self.n_test, "loss": loss_sum / self.n_test,
                "predictions": self.np.concatenate(predicted) if predicted else None}


class ReslabConvnet:
    """The Reslab Theano tutorial's 6_convnet_color.py on CIFAR-10 (6_convnet.py's
    grey input with ``grayscale``)."""

    def __init__(self, ctx, np, theano):
        self.ctx, self.hp, self.np, self.theano = ctx, ctx.hp, np, theano
        self.paper = does_periodic_work(ctx)
        self.early_stopping = None      # the script trains a fixed number of epochs
        self.periodic_passes = None
        self.paper_train_time_s = self.paper_test_time_s = None
        self.channels = 1 if self.hp["grayscale"] else 3
        self.sync = None                # set by the adapter on the GPU

    def load(self, arrays):
        np, floatX = self.np, self.theano.config.floatX

        def images(x):
            # load.py: byte / 255.0 in floatX (in place: the same numbers as its
            # float64 division cast to floatX); grey: the mean of the three channels.
            x = x.reshape(len(x), -1).astype(floatX)
            x /= np.asarray(RESLAB_PIXEL_MAX, dtype=floatX)
            if self.channels == 1:
                x = x.reshape(len(x), 3, CIFAR_SIZE, CIFAR_SIZE).mean(1)
            return x.reshape(len(x), self.channels, CIFAR_SIZE, CIFAR_SIZE)

        def one_hot(labels):
            return np.eye(N_CLASSES, dtype=floatX)[labels]

        self.train_x, self.train_t = images(arrays["train_images"]), one_hot(arrays["train_labels"])
        self.test_x, self.test_t = images(arrays["test_images"]), one_hot(arrays["test_labels"])
        self.labels_test = np.argmax(self.test_t, axis=1)      # the script's labels_test
        self.ctx.train_samples = len(self.train_x)

    def build(self):
        np, theano, hp = self.np, self.theano, self.hp
        T = theano.tensor
        from theano.tensor.nnet import conv2d
        from theano.tensor.signal import pool
        floatX = theano.config.floatX
        rng = np.random.RandomState(self.ctx.seed)
        weights = {name: theano.shared(np.asarray(rng.randn(*shape) * RESLAB_INIT_STD, dtype=floatX),
                                       name=name)
                   for name, shape in reslab_shapes(self.channels)}
        self.params = list(weights.values())

        x = T.tensor4("x")
        t = T.matrix("t")
        layer = x
        for i, ws in enumerate(RESLAB_POOLS, start=1):
            w, b = weights["w_c%d" % i], weights["b_c%d" % i]
            conv = conv2d(layer, w, filter_shape=w.get_value().shape)
            layer = pool.pool_2d(T.maximum(0, conv + b.dimshuffle("x", 0, "x", "x")),
                                 ws=(ws, ws), ignore_border=True)
        hidden = T.maximum(0, T.dot(layer.flatten(2), weights["w_h3"]) + weights["b_h3"])
        p_y_given_x = T.nnet.softmax(T.dot(hidden, weights["w_o"]) + weights["b_o"])
        cost = T.mean(T.nnet.categorical_crossentropy(p_y_given_x, t))
        self.x, self.p_y_given_x = x, p_y_given_x
        correct = T.sum(T.eq(T.argmax(p_y_given_x, axis=1), T.argmax(t, axis=1)))

        # The script's momentum(): v = momentum * v - learning_rate * grad; param + v.
        lr = np.asarray(hp["learning_rate"], dtype=floatX)
        momentum = np.asarray(hp["momentum"], dtype=floatX)
        updates = []
        for p, g in zip(self.params, T.grad(cost, self.params)):
            velocity = theano.shared(np.zeros(p.get_value().shape, dtype=floatX))
            step = momentum * velocity - lr * g
            updates += [(velocity, step), (p, p + step)]
        self.updated = [var for var, _ in updates]

        self.train_fn = theano.function([x, t], [cost, correct], updates=updates)
        self.test_fn = theano.function([x, t], [cost, correct, T.argmax(p_y_given_x, axis=1)])
        if self.paper:
            # the script's predict: the predicted classes, nothing else
            self.predict = theano.function([x], T.argmax(p_y_given_x, axis=1))

    def pixel_input(self):
        """The robustness check's pixels (N x 3 x 32 x 32) and the net's input made of
        them: load.py's byte / 255.0 is their scale; grey, the mean of the three channels."""
        T = self.theano.tensor
        pixels = T.tensor4("pixels")
        if self.channels == 3:
            return pixels, pixels
        return pixels, T.unbroadcast(pixels.mean(axis=1, keepdims=True), 1)

    def layers(self):
        """The graph of ``build`` as a layer list (``orchestrator/checks/onnx_layers.py``), from
        pixels (grey: their channels' mean, as a 1 x 1 convolution by 1/3) to
        p_y_given_x; conv2d's kernels flipped, as in LeNet5's ``layers``."""
        np = self.np
        values = {p.name: p.get_value() for p in self.params}
        layers = []
        if self.channels == 1:
            layers.append({"op": "conv", "weight": np.full((1, 3, 1, 1), 1.0 / 3, dtype=values["w_c1"].dtype)})
        for i, ws in enumerate(RESLAB_POOLS, start=1):
            layers += [{"op": "conv", "weight": values["w_c%d" % i][:, :, ::-1, ::-1],
                        "bias": values["b_c%d" % i]},
                       {"op": "relu"}, {"op": "pool", "mode": "max", "kernel": [ws, ws], "stride": [ws, ws]}]
        return layers + [{"op": "flatten"}, {"op": "dense", "weight": values["w_h3"].T, "bias": values["b_h3"]},
                         {"op": "relu"}, {"op": "dense", "weight": values["w_o"].T, "bias": values["b_o"]},
                         {"op": "softmax"}]

    def summed_loss(self, p_y_given_x, y):
        """The script's categorical cross-entropy, summed over the batch (against the
        class indices: the same as against its one-hot rows)."""
        return self.theano.tensor.nnet.categorical_crossentropy(p_y_given_x, y).sum()

    def train(self):
        np, hp, ctx, paper = self.np, self.hp, self.ctx, self.paper
        clock = ctx.now          # the GPU synchronised first (Adapter.synchronize)
        batch, n = hp["batch_size"], len(self.train_x)
        step = 0
        outside, test_s, last_test_s, tests = 0.0, 0.0, None, 0
        start_time = clock()
        for epoch in range(1, hp["epochs"] + 1):
            if paper:
                t0 = clock()
                print("iteration %d" % epoch)
                outside += clock() - t0
            ctx.epoch_start()
            loss_sum, correct_sum = 0.0, 0
            for start in range(0, n, batch):
                x = self.train_x[start:start + batch]
                cost, correct = self.train_fn(x, self.train_t[start:start + batch])
                loss_sum += float(cost) * len(x)
                correct_sum += int(correct)
                step += 1
                ctx.progress(epoch, (start + len(x)) / n, cost, step=step)
            ctx.epoch_done(epoch, loss_sum / n, correct_sum / n, samples=n)
            if paper:                   # the script tests after every epoch
                t0 = clock()
                predictions_test = self.predict(self.test_x)
                accuracy = np.mean(predictions_test == self.labels_test)
                last_test_s = clock() - t0
                test_s += last_test_s
                tests += 1
                print("accuracy: %.5f" % accuracy)
                print()
                outside += clock() - t0
                ctx.epochs[-1]["test_accuracy"] = float(accuracy)
        end_time = clock()
        if paper:
            self.paper_train_time_s = end_time - start_time
            self.paper_test_time_s = last_test_s
        self.periodic_passes = {"validation": 0, "validation_s": 0.0, "test": tests, "test_s": test_s}
        ctx.train_excluded_s += outside

    def test(self):
        # The script predicts the whole test set in one call.
        cost, correct, predicted = self.test_fn(self.test_x, self.test_t)
        return {"accuracy": int(correct) / len(self.test_x), "loss": float(cost), "predictions": predicted}


NETS = {"mnist": LeNet5, "cifar10": ReslabConvnet}


def _cxx_version(cxx):
    try:
        return subprocess.run([cxx, "-dumpfullversion", "-dumpversion"], capture_output=True,
                              text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _openblas_config():
    import ctypes
    library = blas.openblas()
    if library is None or not hasattr(library, "openblas_get_config"):
        return None
    library.openblas_get_config.restype = ctypes.c_char_p
    return library.openblas_get_config().decode()
