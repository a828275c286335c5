"""dlbench: the GTDLBench study of deep-learning frameworks, reproducible in containers.

The pipeline, one module a stage: plan -> build -> run -> collect -> store -> report.
"""

__version__ = "0.1.0"
