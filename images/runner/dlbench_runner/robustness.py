"""White-box robustness of the trained model: FGSM and PGD, written once for every framework.

The attacks work in the [0, 1] pixel scale on the first ``robust_images`` test images, in
the data set's own layout (MNIST N x 28 x 28, CIFAR-10 N x 3 x 32 x 32), whatever the
model's own preprocessing; every adversarial image is clipped to valid pixels.  What
the framework gives, through two methods of its adapter, is its model's view of pixels:

    def input_gradient(self, pixels, labels):
        # -> (the gradient of the model's loss, summed over the batch, with respect to
        #     ``pixels``, computed by the framework's own differentiation through the
        #     model's preprocessing; the classes the model predicts for ``pixels``)
    def predict(self, pixels):
        # -> the classes the model predicts
    def loss(self, pixels, labels):
        # -> that loss, a float (for ``gradient_check``)
    def losses(self, pixels, labels):
        # optional: -> each image's loss, N floats (``gradient_check`` then asks once for
        #    its 65 images instead of 65 times)

An adapter without ``input_gradient`` (or one that raises ``NoInputGradient`` for its
model) gets rows with an empty accuracy and the reason, never a number that is wrong.

Rows, one per attack and epsilon (``contract.ROBUSTNESS`` has the settings):
    none  epsilon 0: the clean accuracy on the same images
    fgsm  x + eps * sign(gradient at x), at each of ``epsilons``; its ``time_s`` is the
          gradient pass (shared by every epsilon) plus its own prediction pass
    pgd   BIM from a uniform random start in the eps-ball (numpy's RandomState(seed)),
          ``contract.PGD_STEPS`` steps of ``STEP_FACTOR * eps / steps``, each projected
          onto the eps-ball and the valid pixels, at ``pgd_epsilon``

The FGSM images at ``pgd_epsilon`` (the middle epsilon of both data sets' defaults) are
also kept, for the host to try every other framework's model on them (transfer attacks):
``attack`` writes them with their labels to ``transfer`` (``/out/transfer.npz``, compressed,
no pickles): ``images`` float32 in the [0, 1] scale and the data set's layout (x + eps *
sign(gradient) is not a byte in general), ``labels`` uint8, ``epsilon`` a float64 scalar.
About 0.45 MB for 1,000 MNIST images and 4 MB for 1,000 CIFAR-10 ones (the quick profile's
100: a tenth).  Only from a gradient that passed its check: else no file, and the rows say
why (an adapter without ``loss`` has no check, and keeps no images).  A file past ``contract.MAX_TRANSFER_BYTES`` (some 4,000 CIFAR-10 images) is not kept
either, and the log says so.

``gradient_check`` compares the adapter's gradient with central finite differences of
its loss at a few pixels of one real image: the test of every adapter's gradient.
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


def _gradient(adapter, x, y):
    return _batched(adapter.input_gradient, x, y)


def _accuracy(adapter, x, y):
    predicted, = _batched(adapter.predict, x)
    return float(np.mean(predicted == y))


def _row(attack, epsilon, steps, images, accuracy=None, time_s=None, reason=None):
    return {"attack": attack, "epsilon": float(epsilon), "steps": steps, "images": images,
            "accuracy": accuracy, "time_s": time_s, "reason": reason}


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
        if not hasattr(adapter, "input_gradient"):
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
    direction = np.sign(_gradient(adapter, x, y)[0]).astype(x.dtype)
    gradient_s = now() - t0
    for eps in fgsm_epsilons:
        t0 = now()
        adversarial = np.clip(x + np.float32(eps) * direction, 0.0, 1.0)
        accuracy = _accuracy(adapter, adversarial, y)
        rows.append(_row("fgsm", eps, 1, len(x), accuracy, gradient_s + now() - t0))
        if eps == pgd_epsilon:
            kept = adversarial
    if transfer is not None:
        if kept is None:        # settings whose PGD epsilon is none of FGSM's
            kept = np.clip(x + np.float32(pgd_epsilon) * direction, 0.0, 1.0)
        keep_transfer(transfer, kept, y, pgd_epsilon)
    t0 = now()
    adversarial = pgd(adapter, x, y, pgd_epsilon, contract.PGD_STEPS, np.random.RandomState(seed))
    rows.append(_row("pgd", pgd_epsilon, contract.PGD_STEPS, len(x), _accuracy(adapter, adversarial, y),
                     now() - t0))
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
    """BIM from a random start: the adversarial images (the prediction pass is the caller's)."""
    eps32 = np.float32(eps)
    low, high = np.clip(x - eps32, 0.0, 1.0), np.clip(x + eps32, 0.0, 1.0)
    step = np.float32(STEP_FACTOR * eps / steps)
    adversarial = np.clip(x + rng.uniform(-eps, eps, size=x.shape).astype(x.dtype), low, high)
    for _ in range(steps):
        gradient = _gradient(adapter, adversarial, y)[0]
        adversarial = np.clip(adversarial + step * np.sign(gradient).astype(x.dtype), low, high)
    return adversarial


def _losses(adapter, images, label):
    """The loss of each of ``images`` (all of class ``label``): the adapter's ``losses`` in
    batches of ``BATCH`` where it has one (an adapter whose every call crosses a process
    boundary), else one ``loss`` call per image."""
    labels = np.full(len(images), label)
    if hasattr(adapter, "losses"):
        return np.concatenate([np.asarray(adapter.losses(images[i:i + BATCH], labels[i:i + BATCH]),
                                          dtype=np.float64).reshape(-1)
                               for i in range(0, len(images), BATCH)])
    return np.array([float(adapter.loss(image[None], labels[:1])) for image in images])


def _jittered(x, rng):
    """``x`` (float64) moved by less than ``CHECK_JITTER`` per pixel, at random, into
    [CHECK_JITTER / 4, 1 - CHECK_JITTER / 4]: an image of bytes has runs of equal pixels,
    which tie the maxima of pooling windows, each tie a kink at the very point checked."""
    x = np.asarray(x, dtype=np.float64)
    noise = rng.uniform(-CHECK_JITTER / 4, CHECK_JITTER / 4, x.shape)
    return CHECK_JITTER / 2 + (1 - CHECK_JITTER) * x + noise


def gradient_check(adapter, images, labels, seed=1, pixels=CHECK_PIXELS, among=BATCH):
    """The adapter's input gradient against central finite differences of its loss,
    (loss(x + h e) - loss(x - h e)) / 2h, at ``pixels`` pixels drawn at random
    (RandomState(seed)) among those of one image whose gradient is at least the image's
    mean absolute gradient and whose byte is neither 0 nor 255 (where none is, as in an
    image of black and white only, any of them).  The image: the first of the first
    ``among`` the model gets wrong (its loss stands well above a float32 forward pass's
    rounding), else the one with the largest gradient; checked not at its bytes but
    moved at random by less than ``CHECK_JITTER`` per pixel (``_jittered``), off the
    kinks that runs of equal bytes put at the very point: a trained MNIST model checked
    at its bytes failed at 6 of 24 seeds (relative error up to 0.46, the gradient one
    subgradient of a max-pooling tie, outside both one-sided derivatives), and passed at
    all 24 when moved (at most 0.0024).  Each pixel is tried at every step h of ``CHECK_STEPS``,
    three ways, each where it keeps the pixel in [0, 1]: the central difference, and the one-sided ones
    (loss(x + h e) - loss(x)) / h and (loss(x) - loss(x - h e)) / h; its error is the
    smallest of |difference - gradient| / max(|difference|, |gradient|).  A step too
    large for the model's curvature there, or too small for a float32 model's rounding,
    agrees less than the right one; and where a pixel sits on a kink (a tie in a
    max-pooling window, frequent where the input holds runs of equal bytes, or a ReLU
    at 0) the framework's gradient is one of the one-sided derivatives, which the
    central difference averages (the move takes most such kinks away).  A kink can still leave one pixel out (a local
    contrast normalisation dividing by a standard deviation at its floor is steep over a
    far smaller step), so the check's figure, ``relative_error``, is the error of the
    pixel ranked ``pixels - CHECK_OUTLIERS`` (the largest but one): a wrong gradient is
    wrong at every pixel.  The adapter's ``loss(pixels, labels)`` gives the loss whose
    gradient ``input_gradient`` gives.  Returns {"image", "pixels", "steps",
    "gradient", "finite_differences" (per pixel, per step: [central, forward,
    backward], each None where its step leaves [0, 1]), "errors", "relative_error"}, or
    None where the adapter has no ``loss`` or gives no gradient (``NoInputGradient``:
    ``attack`` has its reason)."""
    if not hasattr(adapter, "loss") or not hasattr(adapter, "input_gradient"):
        return None
    x, y = pixels_of(images[:among]), np.asarray(labels[:among])
    try:
        first, predicted = adapter.input_gradient(x, y)
    except NoInputGradient:
        return None
    wrong = np.flatnonzero(np.asarray(predicted) != y)
    norms = np.abs(np.asarray(first, dtype=np.float64)).reshape(len(x), -1).sum(1)
    image = int(wrong[0]) if len(wrong) else int(np.argmax(norms))
    rng = np.random.RandomState(seed)
    original = x[image].reshape(-1)
    inside = (original > 0) & (original < 1)
    x, y = _jittered(x[image:image + 1], rng), y[image:image + 1]
    gradient = np.asarray(adapter.input_gradient(x, y)[0], dtype=np.float64).reshape(-1)
    flat = x.reshape(-1)
    magnitude = np.abs(gradient)
    significant = (magnitude >= magnitude.mean()) & (magnitude > 0)
    for where in (significant & inside, significant, magnitude > 0, np.ones(flat.size, bool)):
        candidates = np.flatnonzero(where)
        if len(candidates):
            break
    chosen = np.sort(rng.choice(candidates, size=min(pixels, len(candidates)), replace=False))
    # every image the differences need, the centre first, then each pixel moved by +-h
    # where that keeps it in [0, 1]: one batch of losses where the adapter gives them
    moved, where = [flat], {}
    for index in chosen:
        for h in CHECK_STEPS:
            for sign in (1, -1):
                if 0 <= flat[index] + sign * h <= 1:
                    image_moved = flat.copy()
                    image_moved[index] += sign * h
                    where[index, h, sign] = len(moved)
                    moved.append(image_moved)
    losses = _losses(adapter, np.stack(moved).reshape((len(moved),) + x.shape[1:]), y[0])
    centre = losses[0]
    differences, errors = [], []
    for index in chosen:
        expected, found = gradient[index], []
        for h in CHECK_STEPS:
            above, below = (losses[where[index, h, sign]] if (index, h, sign) in where else None
                            for sign in (1, -1))
            found.append([None if above is None or below is None else (above - below) / (2 * h),
                          None if above is None else (above - centre) / h,
                          None if below is None else (centre - below) / h])
        differences.append(found)
        errors.append(min(abs(d - expected) / max(abs(d), abs(expected), 1e-300)
                          for three in found for d in three if d is not None))
    ranked = sorted(errors)
    figure = ranked[max(0, len(ranked) - 1 - CHECK_OUTLIERS)]
    return {"image": image, "pixels": [int(i) for i in chosen], "steps": list(CHECK_STEPS),
            "gradient": gradient[chosen].tolist(), "finite_differences": differences,
            "errors": errors, "relative_error": float(figure)}
