"""The child's side of ``untrusted``: a job's ONNX model run by a process of its own.

``untrusted`` starts this file by its path, ``python -I untrusted_child.py FOLDER ...``,
in an empty working directory: isolated mode reads no ``PYTHON*`` variable, puts neither
the working directory nor this file's folder on ``sys.path``, and this module imports
nothing of dlbench, so the child's start is Python, numpy, onnxruntime and onnx's
protobuf classes, nothing else.  onnx's package itself is not imported: it imports
``ml_dtypes`` and its helpers, a second of the child's start for nothing it uses; the
walk of the file needs its generated ``onnx_ml_pb2`` alone (``_onnx_package_unrun``).

The limits, the refusal of external data and what the child writes are those of
``untrusted``'s docstring; its exit status: 0 when every set has its arrays or its
reason, 3 with ``reason.txt`` when the model cannot be loaded.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import signal
import sys
from pathlib import Path

import numpy as np

CLASSES = 10
BATCH = 500                     # images per onnxruntime call
ALARM_MARGIN = 10               # the child's own alarm, after dlbench's deadline
REASON_CHARS = 500              # of a reason the child writes


class Refused(Exception):
    """Why the model cannot be checked (``untrusted.Refused`` on the host's side)."""


def onnx_messages():
    """onnx's generated protobuf module (``ModelProto``, ``TensorProto``)."""
    from onnx import onnx_ml_pb2
    return onnx_ml_pb2


def _onnx_package_unrun() -> None:
    """onnx's package registered without running it, so that its generated module is
    imported alone: in the child only, before anything imports onnx (the host's onnx
    is the whole package)."""
    spec = importlib.util.find_spec("onnx")
    if spec is not None and "onnx" not in sys.modules:
        sys.modules["onnx"] = importlib.util.module_from_spec(spec)


def stored_outside(model) -> str | None:
    """Where the first tensor stored as ONNX external data is in a parsed model (an
    ``onnx.ModelProto``), and the file it names; None when every tensor is in the file.
    Every message of the model is visited, without recursion, whatever its depth."""
    from google.protobuf.message import Message

    TensorProto = onnx_messages().TensorProto
    pending = [(model, "")]
    while pending:
        message, where = pending.pop()
        if isinstance(message, TensorProto) and (message.data_location == TensorProto.EXTERNAL
                                                 or len(message.external_data)):
            location = next((e.value for e in message.external_data if e.key == "location"), "")
            return f"the tensor {message.name!r} ({where.strip(' /')}) is stored as external data ({location!r})"
        for field, value in message.ListFields():
            if field.type != field.TYPE_MESSAGE or field.message_type.GetOptions().map_entry:
                continue
            for index, item in enumerate([value] if isinstance(value, Message) else value):
                name = getattr(item, "name", "")
                named = f" {name!r}" if isinstance(name, str) and name else (
                    "" if isinstance(value, Message) else f" {index}")
                pending.append((item, f"{where} / {field.name}{named}"))
    return None


def _limit_self(wall: int, cpu: int, memory: int, output: int) -> None:
    """This process's limits, before it reads the model."""
    for kind, value in ((resource.RLIMIT_AS, (memory, memory)), (resource.RLIMIT_CPU, (cpu, cpu + 5)),
                        (resource.RLIMIT_CORE, (0, 0)), (resource.RLIMIT_FSIZE, (output, output))):
        resource.setrlimit(kind, value)
    signal.alarm(wall + ALARM_MARGIN)


def _session(model: bytes, threads: int, memory: int):
    """onnxruntime's session of the model, once nothing in it is stored outside it."""
    import onnxruntime

    try:
        parsed = onnx_messages().ModelProto.FromString(model)
    except Exception as exc:        # protobuf's DecodeError, a recursion limit
        raise Refused(f"the ONNX model cannot be read: {_one_line(exc, memory)}") from None
    outside = stored_outside(parsed)
    if outside is not None:
        raise Refused(f"{outside}: dlbench runs one self-contained ONNX file and reads no other")
    del parsed
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3              # its warnings would go to dlbench's terminal
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    try:
        return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as exc:        # onnxruntime's own errors share no base class but Exception
        raise Refused(f"onnxruntime: {_one_line(exc, memory)}") from None


def _run(session, images: np.ndarray, first: int, memory: int):
    """The model's classes for the images and its outputs for the ``first`` of them."""
    inputs = session.get_inputs()
    if len(inputs) != 1:
        raise Refused(f"the ONNX model takes {len(inputs)} inputs, not the pixels alone")
    name, parts = inputs[0].name, []
    try:
        for start in range(0, len(images), BATCH):
            pixels = images[start:start + BATCH]
            if pixels.dtype == np.uint8:    # the runner's pixels: bytes / 255 in float32
                pixels = pixels.astype(np.float32) / np.float32(255.0)     # (robustness.pixels_of)
            output = np.asarray(session.run(None, {name: pixels})[0])
            if output.shape != (len(pixels), CLASSES):
                raise Refused(f"the ONNX model's output is {'x'.join(map(str, output.shape))}, "
                              f"not {len(pixels)}x{CLASSES} for {len(pixels)} images")
            parts.append(output)
    except Refused:
        raise
    except Exception as exc:
        raise Refused(f"onnxruntime: {_one_line(exc, memory)}") from None
    outputs = np.concatenate(parts)
    return outputs.argmax(1).astype(np.int64), outputs[:first]


def _one_line(exc: BaseException, memory: int) -> str:
    """The exception as one line; an allocation that failed says the limit it met."""
    text = (" ".join(str(exc).split()) or type(exc).__name__)[:REASON_CHARS]
    if isinstance(exc, MemoryError) or "alloc" in text.lower():
        text += f" (the host's limit: {memory >> 30} GiB of memory)"
    return text


def child(folder: Path, sets: int, first: int, wall: int, cpu: int, memory: int, output: int,
          threads: int) -> int:
    """The child's work: 0 when every set has its arrays or its reason, 3 with
    ``reason.txt`` when the model cannot be loaded."""
    _limit_self(wall, cpu, memory, output)
    try:
        session = _session((folder / "model.onnx").read_bytes(), threads, memory)
    except Refused as exc:
        (folder / "reason.txt").write_text(str(exc))
        return 3
    except MemoryError:
        (folder / "reason.txt").write_text(f"the ONNX model needs more than the host's limit of "
                                           f"{memory >> 30} GiB of memory")
        return 3
    for index in range(sets):
        images = np.load(folder / f"images-{index}.npy", allow_pickle=False)
        try:
            classes, outputs = _run(session, images, first, memory)
        except Refused as exc:
            (folder / f"reason-{index}.txt").write_text(str(exc))
            continue
        np.save(folder / f"classes-{index}.npy", classes, allow_pickle=False)
        np.save(folder / f"outputs-{index}.npy", outputs, allow_pickle=False)
    return 0


if __name__ == "__main__":
    _onnx_package_unrun()
    status = child(Path(sys.argv[1]), *map(int, sys.argv[2:9]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)     # its files are written and closed: no interpreter teardown (onnxruntime's is slow)
