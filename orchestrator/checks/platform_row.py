"""One platform's row as a tool image's program writes it (``checks/platforms.py`` reads
them): a pydantic model, apart, so that a command that only reads stored rows never imports
pydantic."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class PlatformRow(BaseModel):
    """One platform's figures, as the deploy program writes them."""

    model_config = ConfigDict(extra="forbid")

    platform: str
    status: str                         # ok, failed
    reason: str | None = None
    conversion_s: float | None = None
    model_bytes: int | None = None
    converter_layout: str | None = None  # how onnx2tf was told to hold the input
    conversion_shared: bool | None = None  # mobile-int8's model came of mobile's conversion
    accuracy: float | None = None
    mismatches: int | None = None       # images classified otherwise than by the framework
    max_logit_error: float | None = None
    latency_ms: float | None = None     # median, batch 1, after warm-up
    latency_iqr_ms: float | None = None
    throughput: float | None = None     # images per second
    throughput_batch: int | None = None
    peak_memory_bytes: int | None = None  # the runtime's process (the browser's, summed)
    runtime: str | None = None          # what ran the model: the runtime's name and version
    adversarial_images: int | None = None
    adversarial_accuracy: float | None = None
