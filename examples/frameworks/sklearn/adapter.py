"""scikit-learn's MLPClassifier on MNIST: an example of a framework added to dlbench.

The runner (dlbench_runner) times each phase itself and writes the result; an adapter
only does the framework's work, in four methods.  ``ctx`` is the runner's Context:
``ctx.hp`` the resolved hyper-parameters (models.json's defaults, then the profile's,
then the user's ``--set``), ``ctx.seed``, ``ctx.threads`` (the thread variables are set
before setup() runs), ``ctx.load_data()`` the data set as numpy arrays, and the
progress calls.  scikit-learn is imported in setup() only, so that the module loads
wherever numpy does.
"""

import os


class Adapter:
    def __init__(self, ctx):
        self.ctx = ctx
        self.hp = ctx.hp

    def setup(self):
        """Import the framework, load the data, build the model (timed as setup)."""
        import numpy as np
        from sklearn.neural_network import MLPClassifier

        self.np = np
        arrays = self.ctx.load_data()       # cut to train_subset images where it is set
        self.x, self.y = self._inputs(arrays["train_images"]), arrays["train_labels"]
        self.test_x, self.test_y = self._inputs(arrays["test_images"]), arrays["test_labels"]
        self.model = MLPClassifier(
            hidden_layer_sizes=(self.hp["hidden_units"],), solver="adam",
            learning_rate_init=self.hp["learning_rate"], alpha=self.hp["alpha"],
            batch_size=self.hp["batch_size"], random_state=self.ctx.seed)
        self.classes = np.arange(10)

    def _inputs(self, images):
        return images.reshape(len(images), -1).astype("float64") / 255.0

    def train(self):
        """The training loop (timed as training): one partial_fit per batch, in an order
        drawn from the seed each epoch, so that progress and the loss are reported as
        training goes."""
        ctx, np, batch = self.ctx, self.np, self.hp["batch_size"]
        order = np.random.RandomState(ctx.seed)
        n = len(self.y)
        steps = -(-n // batch)
        for epoch in range(1, self.hp["epochs"] + 1):
            ctx.epoch_start()
            permutation, losses = order.permutation(n), []
            for step, start in enumerate(range(0, n, batch)):
                index = permutation[start:start + batch]
                self.model.partial_fit(self.x[index], self.y[index], classes=self.classes)
                losses.append(self.model.loss_)
                ctx.progress(epoch, (step + 1) / steps, self.model.loss_,
                             step=(epoch - 1) * steps + step + 1)
            # The training set's accuracy for the epoch's record is not training: its time
            # is kept out of the training time and the epoch's.
            started = ctx.now()
            accuracy = self.model.score(self.x, self.y)
            ctx.train_excluded_s += ctx.now() - started
            ctx.epoch_done(epoch, float(np.mean(losses)), accuracy, samples=n)

    def test(self):
        """One pass over the test set (timed as testing)."""
        from sklearn.metrics import log_loss

        probabilities = self.model.predict_proba(self.test_x)
        predicted = self.classes[probabilities.argmax(axis=1)]
        return {"accuracy": float((predicted == self.test_y).mean()),
                "loss": float(log_loss(self.test_y, probabilities, labels=self.classes))}

    def describe(self):
        """What the result records of the framework (after the test)."""
        import sklearn
        import threadpoolctl

        pools = threadpoolctl.threadpool_info()
        return {
            "framework_version": sklearn.__version__,
            "param_count": int(sum(w.size for w in self.model.coefs_)
                               + sum(b.size for b in self.model.intercepts_)),
            "threads": {"requested": self.ctx.threads,
                        "framework": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                                      "threadpoolctl": [{"api": p.get("internal_api"),
                                                         "threads": p.get("num_threads")}
                                                        for p in pools]}},
            "libraries": {"numpy": self.np.__version__},
        }
