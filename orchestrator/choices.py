"""The fixed choices of two of a run's options, in a module that imports nothing: the
command line lists them before it loads anything heavier (``cli/``: ``dlbench --help``
starts without pydantic), and ``options.py`` holds the values to them."""

VARIANTS = ("cpu", "gpu")           # the images of a framework: build.image_tag(framework, variant)
SCHEDULERS = ("local", "slurm")     # where a run's jobs run: ``schedulers.SCHEDULERS`` makes each
