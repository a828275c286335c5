"""White-box robustness of the trained model: FGSM and PGD, written once for every framework.

The attacks work in the [0, 1] pixel scale on the first ``robust_images`` test images, in
the data set's own layout (MNIST N x 28 x 28, CIFAR-10 N x 3 x 32 x 32), whatever the
model's own preprocessing; every adversarial image is clipped to valid pixels.  What
the framework gives, through methods of its adapter, is its model's view of pixels:

    def logits(self, pixels):
        # -> the model's scores for ``pixels``, N x classes: its logits, or its
        #    log-probabilities (anything whose softmax is the model's probabilities);
        #    an adapter whose ``logits`` are other outputs (Theano's probabilities) gives
        #    ``attack_logits`` besides, which the attacks take instead
    def input_vjp(self, pixels, output_gradient):
        # -> (d(sum(g * logits)) / d pixels, the vector-Jacobian product of those logits,
        #     computed by the framework's own backward pass through the model's
        #     preprocessing, with g = output_gradient(logits as numpy, N x classes), an
        #     N x classes float32 array; the classes the model predicts for ``pixels``)
    def predict(self, pixels):
        # -> the classes the model predicts

The direction the attacks follow is the sign of the input gradient of the cross entropy,
but not as the framework's float32 loss gives it: for an image the model classifies
confidently, float32's softmax rounds the true class's probability to 1, its output
gradient p - onehot loses its main term, and what reaches the pixels is rounding (an
image with a loss below some 1e-7 gets a gradient of noise, or none: gradient masking,
which made models look robust).  Instead the runner computes the output gradient itself,
in float64 and log-space, from the framework's logits z: with y the true class,

    g_j = softmax over the classes other than y of z_j   (j != y),    g_y = -1

which is the cross entropy's output gradient p - onehot divided by 1 - p_y (the sum of
the other classes' probabilities, written without rounding 1 - p_y), i.e. the gradient
of the soft margin M = logsumexp_{j != y} z_j - z_y, of which the cross entropy is
softplus(M).  Each image's g is scaled to max |g| = 1, so nothing underflows in the
framework's float32 backward pass, and a positive scale per image changes no sign: the
FGSM and PGD steps are those of the exact cross entropy.  ``ATTACK_LOSS`` names it in
every row.

An adapter without ``input_vjp`` (or one that raises ``NoInputGradient`` for its model)
gets rows with an empty accuracy and the reason, never a number that is wrong.

Rows, one per attack and epsilon (``contract.ROBUSTNESS`` has the settings):
    none  epsilon 0: the clean accuracy on the same images
    fgsm  x + eps * sign(gradient at x), at each of ``epsilons``; its ``time_s`` is the
          gradient pass (shared by every epsilon) plus its own prediction pass
    pgd   BIM from a uniform random start in the eps-ball (numpy's RandomState(seed)),
          ``contract.PGD_STEPS`` steps of ``STEP_FACTOR * eps / steps``, each projected
          onto the eps-ball and the valid pixels, at ``pgd_epsilon``
An attack's row also holds ``attack_loss`` and ``vanished_gradients``: how many of its
images had an input gradient that vanished (``vanished``: all zero, or its largest
|component| at most ``VANISHED`` times the largest of any attacked image's, each image's
output gradient being of max 1; PGD: at any of its steps).  An attack along a vanished
gradient is no attack (the sign of zeros is zero), and the report flags a job where more
than 1% vanished.

The FGSM images at ``pgd_epsilon`` (the middle epsilon of both data sets' defaults) are
also kept, for the host to try every other framework's model on them (transfer attacks):
``attack`` writes them with their labels to ``transfer`` (``/out/transfer.npz``, compressed,
no pickles): ``images`` float32 in the [0, 1] scale and the data set's layout (x + eps *
sign(gradient) is not a byte in general), ``labels`` uint8, ``epsilon`` a float64 scalar.
About 0.45 MB for 1,000 MNIST images and 4 MB for 1,000 CIFAR-10 ones (the quick profile's
100: a tenth).  Only from a gradient that passed its check: else no file, and the rows say
why.  A file past ``contract.MAX_TRANSFER_BYTES`` (some 4,000 CIFAR-10 images) is not kept
either, and the log says so.

``gradient_check`` compares the framework's vector-Jacobian product with central finite
differences of the soft margin, computed in float64 from the framework's logits, at a few
pixels of two real images (one the model gets wrong, and the one it classifies most
confidently, where float32's cross-entropy gradient vanishes): the test of every
adapter's gradient.
"""

import os
import sys

import numpy as np

from . import contract
from .output import remove, write_atomic

BATCH = 100             # images per call to the adapter
STEP_FACTOR = 2.5       # PGD's step is 2.5 eps / steps (Madry et al.'s choice)
CHECK_PIXELS = 8        # pixels the finite-difference check perturbs
CHECK_OUTLIERS = 1      # of which may disagree (a kink within every step of one pixel)
CHECK_STEPS = (1e-2, 1e-3, 1e-4, 1e-5)     # its steps, in the pixel scale
CHECK_JITTER = 1e-2     # the checked image's random move: 2.55 byte steps at most
# The most the check lets a gradient differ from its finite differences: a float32 model
# differs by a few tenths of a percent at the best step; a wrong gradient by 100% and more.
GRADIENT_TOLERANCE = 0.05
# An image's input gradient has vanished where its largest |component| is at most this
# times the largest of any image attacked with it: float32's resolution (2^-23), below
# which a float32 backward pass cannot tell the image's gradient from rounding.
VANISHED = float(np.finfo(np.float32).eps)
# What every attack's row says its direction follows (the module's docstring has why).
ATTACK_LOSS = ("cross entropy: its output gradient (softmax - onehot) / (1 - p_true) computed "
               "exactly from the logits in float64, back-propagated by the framework as a "
               "vector-Jacobian product")


class NoInputGradient(Exception):
    """The framework cannot give its model's gradient with respect to the input."""


def settings(hp):
    """(images, FGSM epsilons, PGD epsilon) of a job's hyper-parameters."""
    return (hp.get("robust_images") or 0, contract.epsilons(hp["epsilons"]),
            contract.epsilons(hp["pgd_epsilon"])[0])


def pixels_of(images):
    """The data set's uint8 images in the [0, 1] pixel scale, float32."""
    return images.astype(np.float32) / np.float32(255.0)


def _batched(fn, x, y=None):
    """``fn`` over batches of BATCH images, its results concatenated (each a tuple)."""
    parts = []
    for start in range(0, len(x), BATCH):
        args = (x[start:start + BATCH],) + (() if y is None else (y[start:start + BATCH],))
        found = fn(*args)
        parts.append(found if isinstance(found, tuple) else (found,))
    return tuple(np.concatenate([np.asarray(p[i]) for p in parts]) for i in range(len(parts[0])))


def _logsumexp(z, axis=1):
    top = np.max(z, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return (top + np.log(np.sum(np.exp(z - top), axis=axis, keepdims=True))).squeeze(axis)


def _others(logits, labels):
    """The logits as float64, and those of the classes other than each image's label
    (the label's set to -inf)."""
    z = np.asarray(logits, dtype=np.float64).reshape(len(labels), -1)
    others = z.copy()
    others[np.arange(len(z)), np.asarray(labels, dtype=np.int64)] = -np.inf
    return z, others


def soft_margin(logits, labels):
    """Each image's soft margin logsumexp_{j != y} z_j - z_y, float64: the cross entropy
    is softplus of it, and the gradient the attacks follow is its gradient."""
    z, others = _others(logits, labels)
    return _logsumexp(others) - z[np.arange(len(z)), np.asarray(labels, dtype=np.int64)]


def cross_entropy(logits, labels):
    """Each image's cross entropy from its logits, float64 and without rounding a
    confident image's loss to 0: softplus of the soft margin."""
    margin = soft_margin(logits, labels)
    return np.maximum(margin, 0.0) + np.log1p(np.exp(-np.abs(margin)))


def output_gradient(logits, labels):
    """The cross entropy's output gradient (softmax - onehot) of each image divided by
    1 - p_y, computed without p_y: the softmax of the other classes' logits at j != y and
    -1 at y; max |g| is 1, float32."""
    z, others = _others(logits, labels)
    g = np.exp(others - _logsumexp(others)[:, None])
    g[np.arange(len(z)), np.asarray(labels, dtype=np.int64)] = -1.0
    return g.astype(np.float32)


def _direction(adapter, x, y):
    """The input gradient the attacks follow (``output_gradient`` through the adapter's
    ``input_vjp``), in batches; and which images' gradient vanished (``vanished``)."""
    def one(pixels, labels):
        return adapter.input_vjp(pixels, lambda logits: output_gradient(logits, labels))
    gradient = _batched(one, x, y)[0]
    return gradient, vanished(gradient)


def vanished(gradient):
    """Which images' gradients vanished: all zero, or their largest |component| at most
    ``VANISHED`` times the largest of all of them."""
    largest = np.abs(np.asarray(gradient, dtype=np.float64)).reshape(len(gradient), -1).max(1)
    return largest <= VANISHED * largest.max() if len(largest) else largest.astype(bool)


def _accuracy(adapter, x, y):
    predicted, = _batched(adapter.predict, x)
    return float(np.mean(predicted == y))


def _row(attack, epsilon, steps, images, accuracy=None, time_s=None, reason=None, vanished_count=None):
    return {"attack": attack, "epsilon": float(epsilon), "steps": steps, "images": images,
            "accuracy": accuracy, "time_s": time_s, "reason": reason,
            "attack_loss": None if attack == "none" or accuracy is None else ATTACK_LOSS,
            "vanished_gradients": vanished_count}


def attack(adapter, images, labels, hp, seed, now, check=None, transfer=None):
    """Every row of the robustness check (none if ``robust_images`` is 0); ``now`` is the
    runner's clock (it waits for the device).  ``check``: ``gradient_check``'s finding,
    made first; a gradient off by more than ``GRADIENT_TOLERANCE`` attacks nothing (each
    row says why), as one the framework cannot give.  ``transfer``: where to keep the
    FGSM images at ``pgd_epsilon`` (``keep_transfer``), written only once they are made,
    and only where the gradient passed ``check`` (none without one)."""
    count, fgsm_epsilons, pgd_epsilon = settings(hp)
    if not count:
        return []
    x, y = pixels_of(images[:count]), np.asarray(labels[:count])
    plan = ([("none", 0.0, 0)] + [("fgsm", e, 1) for e in fgsm_epsilons]
            + [("pgd", pgd_epsilon, contract.PGD_STEPS)])
    try:
        if not hasattr(adapter, "input_vjp"):
            raise NoInputGradient("this framework's adapter computes no gradient to the input yet")
        if check is not None and not check["relative_error"] <= GRADIENT_TOLERANCE:
            raise NoInputGradient("the input gradient failed its finite-difference check "
                                  "(relative error %.3g at %d of %d pixels)"
                                  % (check["relative_error"],
                                     sum(e > GRADIENT_TOLERANCE for e in check["errors"]),
                                     len(check["pixels"])))
        # images are kept from a checked gradient only
        return _attacks(adapter, x, y, fgsm_epsilons, pgd_epsilon, seed, now,
                        transfer if check is not None else None)
    except NoInputGradient as exc:
        return [_row(name, eps, steps, len(x), reason=str(exc)) for name, eps, steps in plan]


def _attacks(adapter, x, y, fgsm_epsilons, pgd_epsilon, seed, now, transfer=None):
    rows, kept = [], None
    t0 = now()
    rows.append(_row("none", 0.0, 0, len(x), _accuracy(adapter, x, y), now() - t0))
    t0 = now()
    gradient, gone = _direction(adapter, x, y)
    direction = np.sign(gradient).astype(x.dtype)
    gradient_s = now() - t0
    for eps in fgsm_epsilons:
        t0 = now()
        adversarial = np.clip(x + np.float32(eps) * direction, 0.0, 1.0)
        accuracy = _accuracy(adapter, adversarial, y)
        rows.append(_row("fgsm", eps, 1, len(x), accuracy, gradient_s + now() - t0,
                         vanished_count=int(gone.sum())))
        if eps == pgd_epsilon:
            kept = adversarial
    if transfer is not None:
        if kept is None:        # settings whose PGD epsilon is none of FGSM's
            kept = np.clip(x + np.float32(pgd_epsilon) * direction, 0.0, 1.0)
        keep_transfer(transfer, kept, y, pgd_epsilon)
    t0 = now()
    adversarial, gone = pgd(adapter, x, y, pgd_epsilon, contract.PGD_STEPS, np.random.RandomState(seed))
    rows.append(_row("pgd", pgd_epsilon, contract.PGD_STEPS, len(x), _accuracy(adapter, adversarial, y),
                     now() - t0, vanished_count=int(gone.sum())))
    return rows


def keep_transfer(path, images, labels, epsilon):
    """The FGSM images (float32 pixels) and their labels as a compressed .npz at ``path``;
    removed again, with a line in the log, where past ``contract.MAX_TRANSFER_BYTES``."""
    write_atomic(path, lambda f: np.savez_compressed(
        f, images=np.asarray(images, dtype=np.float32), labels=np.asarray(labels).astype(np.uint8),
        epsilon=np.float64(epsilon)))
    size = os.path.getsize(path)
    if size > contract.MAX_TRANSFER_BYTES:
        remove(path)
        sys.stderr.write("dlbench: the FGSM images for transfer attacks are not kept: %d bytes, "
                         "more than the %d a job may keep\n" % (size, contract.MAX_TRANSFER_BYTES))


def pgd(adapter, x, y, eps, steps, rng):
    """BIM from a random start: the adversarial images (the prediction pass is the
    caller's), and which images' gradient vanished at any step."""
    eps32 = np.float32(eps)
    low, high = np.clip(x - eps32, 0.0, 1.0), np.clip(x + eps32, 0.0, 1.0)
    step = np.float32(STEP_FACTOR * eps / steps)
    adversarial = np.clip(x + rng.uniform(-eps, eps, size=x.shape).astype(x.dtype), low, high)
    gone = np.zeros(len(x), bool)
    for _ in range(steps):
        gradient, now_gone = _direction(adapter, adversarial, y)
        gone |= now_gone
        adversarial = np.clip(adversarial + step * np.sign(gradient).astype(x.dtype), low, high)
    return adversarial, gone


def scores(adapter):
    """The adapter's scores for the attacks: ``attack_logits`` where it has them, else
    ``logits``."""
    return getattr(adapter, "attack_logits", None) or adapter.logits


def _jittered(x, rng):
    """``x`` (float64) moved by less than ``CHECK_JITTER`` per pixel, at random, into
    [CHECK_JITTER / 4, 1 - CHECK_JITTER / 4]: an image of bytes has runs of equal pixels,
    which tie the maxima of pooling windows, each tie a kink at the very point checked."""
    x = np.asarray(x, dtype=np.float64)
    noise = rng.uniform(-CHECK_JITTER / 4, CHECK_JITTER / 4, x.shape)
    return CHECK_JITTER / 2 + (1 - CHECK_JITTER) * x + noise


def gradient_check(adapter, images, labels, seed=1, pixels=CHECK_PIXELS, among=BATCH):
    """The adapter's input gradient (``input_vjp`` of ``output_gradient``) against central
    finite differences of the soft margin (``soft_margin``, the function whose gradient
    it is), computed in float64 from the framework's logits, at two images of the first
    ``among``: the first the model gets wrong (else the one with the largest loss), and
    the one it classifies most confidently (the smallest cross entropy), where float32's
    own cross-entropy gradient vanishes and the old check never looked.  Each image is
    checked as ``check_image`` says; the returned check is the first image's, its
    ``relative_error`` the larger of the two, with the second's under ``confident``.
    None where the adapter has no ``input_vjp`` or ``logits``, or gives no gradient
    (``NoInputGradient``: ``attack`` has its reason)."""
    if not hasattr(adapter, "input_vjp") or not (hasattr(adapter, "logits")
                                                  or hasattr(adapter, "attack_logits")):
        return None
    x, y = pixels_of(images[:among]), np.asarray(labels[:among])
    try:
        z = scores(adapter)(x)
    except NoInputGradient:
        return None
    z = np.asarray(z, dtype=np.float64).reshape(len(x), -1)
    losses = cross_entropy(z, y)
    wrong = np.flatnonzero(z.argmax(1) != y)
    first = int(wrong[0]) if len(wrong) else int(np.argmax(losses))
    right = np.flatnonzero(z.argmax(1) == y)
    confident = int(right[np.argmin(losses[right])]) if len(right) else int(np.argmin(losses))
    rng = np.random.RandomState(seed)
    try:
        check = check_image(adapter, x[first], y[first], images[first], rng, pixels)
        other = check_image(adapter, x[confident], y[confident], images[confident], rng, pixels)
    except NoInputGradient:
        return None
    check.update(image=first, confident=dict(other, image=confident),
                 relative_error=max(check["relative_error"], other["relative_error"]))
    return check


def check_image(adapter, pixels_of_image, label, original, rng, pixels=CHECK_PIXELS):
    """One image's check, at ``pixels`` pixels drawn at random (``rng``) among those whose
    gradient is at least the image's mean absolute gradient and whose byte (``original``)
    is neither 0 nor 255 (where none is, as in an image of black and white only, any of
    them).  The image is checked not at its bytes but moved at random by less than
    ``CHECK_JITTER`` per pixel (``_jittered``), off the kinks that runs of equal bytes put
    at the very point: a trained MNIST model checked at its bytes failed at 6 of 24 seeds
    (relative error up to 0.46, the gradient one subgradient of a max-pooling tie,
    outside both one-sided derivatives), and passed at all 24 when moved (at most 0.0024).
    Each pixel is tried at every step h of ``CHECK_STEPS``, three ways, each where it keeps
    the pixel in [0, 1]: the central difference (M(x + h e) - M(x - h e)) / 2h and the
    one-sided ones (M(x + h e) - M(x)) / h and (M(x) - M(x - h e)) / h; its error is the
    smallest of |difference - gradient| / max(|difference|, |gradient|).  A step too
    large for the model's curvature there, or too small for a float32 model's rounding,
    agrees less than the right one; and where a pixel sits on a kink (a tie in a
    max-pooling window, a ReLU at 0) the framework's gradient is one of the one-sided
    derivatives, which the central difference averages.  A kink can still leave one
    pixel out (a local contrast normalisation dividing by a standard deviation at its
    floor is steep over a far smaller step), so the check's figure, ``relative_error``,
    is the error of the pixel ranked ``pixels - CHECK_OUTLIERS`` (the largest but one): a
    wrong gradient is wrong at every pixel.  Where the adapter also has the framework's
    own float32 cross-entropy gradient (``input_gradient``), its error at the same pixels
    against the exact one (the soft margin's times 1 - p_y) is kept as
    ``cross_entropy_errors``: what the attacks followed before, for the record.  Returns
    {"pixels", "steps", "loss" (the image's cross entropy), "gradient",
    "finite_differences" (per pixel, per step: [central, forward, backward], each None
    where its step leaves [0, 1]), "errors", "relative_error"}."""
    original = np.asarray(original).reshape(-1).astype(np.float64) / 255.0
    inside = (original > 0) & (original < 1)
    x = _jittered(pixels_of_image[None], rng)
    y = np.array([label])
    gradient = np.asarray(adapter.input_vjp(x, lambda logits: output_gradient(logits, y))[0],
                          dtype=np.float64).reshape(-1)
    flat = x.reshape(-1)
    magnitude = np.abs(gradient)
    significant = (magnitude >= magnitude.mean()) & (magnitude > 0)
    for where in (significant & inside, significant, magnitude > 0, np.ones(flat.size, bool)):
        candidates = np.flatnonzero(where)
        if len(candidates):
            break
    chosen = np.sort(rng.choice(candidates, size=min(pixels, len(candidates)), replace=False))
    # every image the differences need, the centre first, then each pixel moved by +-h
    # where that keeps it in [0, 1]: their logits in batches
    moved, where = [flat], {}
    for index in chosen:
        for h in CHECK_STEPS:
            for sign in (1, -1):
                if 0 <= flat[index] + sign * h <= 1:
                    image_moved = flat.copy()
                    image_moved[index] += sign * h
                    where[index, h, sign] = len(moved)
                    moved.append(image_moved)
    logits, = _batched(scores(adapter), np.stack(moved).reshape((len(moved),) + x.shape[1:]))
    margins = soft_margin(logits, np.full(len(moved), label))
    centre = margins[0]
    differences, errors = [], []
    for index in chosen:
        expected, found = gradient[index], []
        for h in CHECK_STEPS:
            above, below = (margins[where[index, h, sign]] if (index, h, sign) in where else None
                            for sign in (1, -1))
            found.append([None if above is None or below is None else float(above - below) / (2 * h),
                          None if above is None else float(above - centre) / h,
                          None if below is None else float(centre - below) / h])
        differences.append(found)
        errors.append(_error(found, expected))
    ranked = sorted(errors)
    found = {"pixels": [int(i) for i in chosen], "steps": list(CHECK_STEPS),
             "loss": float(cross_entropy(logits[:1], y)[0]),
             "gradient": gradient[chosen].tolist(), "finite_differences": differences,
             "errors": errors, "relative_error": float(ranked[max(0, len(ranked) - 1 - CHECK_OUTLIERS)])}
    if hasattr(adapter, "input_gradient"):
        found["cross_entropy_errors"] = _cross_entropy_errors(adapter, x, y, centre, gradient, chosen)
    return found


def _error(found, expected):
    """The smallest relative difference of a pixel's finite differences from ``expected``."""
    return min(abs(d - expected) / max(abs(d), abs(expected), 1e-300)
               for three in found for d in three if d is not None)


def _cross_entropy_errors(adapter, x, y, margin, gradient, chosen):
    """The framework's own float32 cross-entropy gradient (``input_gradient``) at the
    ``chosen`` pixels against the exact one, the soft margin's gradient times
    d softplus(M) / dM = 1 - p_y; None where the adapter gives none."""
    try:
        found = np.asarray(adapter.input_gradient(x, y)[0], dtype=np.float64).reshape(-1)
    except NoInputGradient:
        return None
    scale = np.exp(-np.logaddexp(0.0, -margin))     # sigmoid(M), without overflow
    exact = scale * gradient
    return [float(abs(found[i] - exact[i]) / max(abs(found[i]), abs(exact[i]), 1e-300)) for i in chosen]
