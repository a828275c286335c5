"""The attacks' direction on a confidently classified image: float32's own cross-entropy
gradient vanishes there (gradient masking), the runner's exact output gradient pushed
through a float32 backward pass (a vector-Jacobian product) does not."""

import numpy as np

from dlbench_runner import robustness

PIXELS = 16
CLASSES = 3


class Float32Model:
    """A linear model of 4 x 4 pixels, computed in float32 as a framework computes it:
    ``input_gradient`` is a framework's own gradient of the summed cross entropy (float32
    log-softmax, then p - onehot, then back through the weights), ``input_vjp`` the
    runner's path (the output gradient it is given, back through the same weights)."""

    def __init__(self):
        rng = np.random.RandomState(0)
        self.w = (rng.uniform(-1, 1, (PIXELS, CLASSES)) * 20).astype(np.float32)
        # class 0's weights on the first image's bright pixels: a logit margin of some 40
        self.w[:8, 0] += np.float32(10.0)

    def logits(self, pixels):
        return np.asarray(pixels, np.float32).reshape(len(pixels), -1) @ self.w

    def predict(self, pixels):
        return self.logits(pixels).argmax(1)

    def input_gradient(self, pixels, labels):
        z = self.logits(pixels)
        log_p = z - (z.max(1, keepdims=True) + np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)))
        g = np.exp(log_p)
        g[np.arange(len(z)), labels] -= np.float32(1.0)
        return (g @ self.w.T).reshape(np.shape(pixels)), z.argmax(1)

    def input_vjp(self, pixels, output_gradient):
        z = self.logits(pixels)
        g = np.asarray(output_gradient(z), np.float32)
        return (g @ self.w.T).reshape(np.shape(pixels)), z.argmax(1)


def images_and_labels():
    """Image 0: bright where class 0's weights are large, its label 0 (classified with a
    cross entropy far below float32's resolution); image 1: the same with label 1 (wrong,
    a large loss); images 2-3: dim, their labels what the model predicts."""
    images = np.full((4, 4, 4), 20, np.uint8)
    images[:2].reshape(2, -1)[:, :8] = 250
    model = Float32Model()
    labels = np.array([0, 1, 0, 0])
    labels[2:] = model.predict(robustness.pixels_of(images[2:]))
    return model, images, labels


def exact_gradient(model, pixels, labels):
    """The soft margin's gradient in float64 by hand: W (softmax of the other logits) - W_y."""
    w = model.w.astype(np.float64)
    z = np.asarray(pixels, np.float64).reshape(len(pixels), -1) @ w
    g = np.asarray(robustness.output_gradient(z, labels), np.float64)
    return g @ w.T


def test_the_float32_cross_entropy_gradient_of_a_confident_image_vanishes_and_the_vjp_does_not():
    model, images, labels = images_and_labels()
    x = robustness.pixels_of(images)
    z = model.logits(x[:1]).astype(np.float64)
    assert robustness.cross_entropy(z, labels[:1])[0] < 1e-12     # confidently right
    old = model.input_gradient(x, labels)[0]
    assert robustness.vanished(old).tolist() == [True, False, False, False]
    new, = robustness._batched(lambda p, y: model.input_vjp(
        p, lambda logits: robustness.output_gradient(logits, y)), x, labels)[:1]
    assert not robustness.vanished(new).any()
    exact = exact_gradient(model, x, labels)
    # the old direction of the confident image is not the exact one; the new one is
    assert np.mean(np.sign(old[0]).reshape(-1) == np.sign(exact[0])) < 0.9
    assert np.array_equal(np.sign(new[0]).reshape(-1), np.sign(exact[0]))
    assert np.allclose(new.reshape(len(x), -1), exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


def test_the_gradient_check_holds_the_confident_images_vjp_to_finite_differences_of_the_margin():
    """The check's second image is the most confident one; its VJP agrees with finite
    differences of the float64 soft margin of the float32 logits, where the framework's
    own float32 cross-entropy gradient is off by 20% and more at every pixel."""
    model, images, labels = images_and_labels()
    check = robustness.gradient_check(model, images, labels)
    assert check["image"] == 1 and check["confident"]["image"] == 0
    assert check["confident"]["loss"] < 1e-12
    assert check["relative_error"] < 1e-3 and max(check["confident"]["errors"]) < 1e-3
    assert max(check["cross_entropy_errors"]) < 1e-3             # the wrong image: still right
    assert min(check["confident"]["cross_entropy_errors"]) > 0.2  # the confident one: masked


def test_the_attack_counts_no_vanished_gradient_and_fools_the_confident_image():
    model, images, labels = images_and_labels()
    hp = {"robust_images": 4, "epsilons": "0.3", "pgd_epsilon": "0.3"}
    rows = robustness.attack(model, images, labels, hp, 1, lambda: 0.0)
    assert [r["vanished_gradients"] for r in rows] == [None, 0, 0]
    assert all(r["attack_loss"] == robustness.ATTACK_LOSS for r in rows[1:])

    class Masked(Float32Model):
        """The attacks along the framework's float32 cross-entropy gradient, as before."""
        def input_vjp(self, pixels, output_gradient):
            return self.input_gradient(pixels, labels[:len(pixels)])

    masked = robustness.attack(Masked(), images, labels, hp, 1, lambda: 0.0)
    assert [r["vanished_gradients"] for r in masked][1:] == [1, 1]
