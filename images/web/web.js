// The web platform's page script: the model run in the browser by the engine (tract's ONNX
// runtime compiled to WebAssembly, lib.rs), with no other library.  It fetches from the
// server that served it (web.py), under the run's token (the page's first path segment):
//
//   job.json        one image's shape, the counts, the job's batch, warm-up and timed runs
//   engine.wasm     the engine
//   model.onnx      the job's ONNX model
//   images.f32      the test images as float32 pixels, in order (web.py scaled them)
//   adversarial.f32 the adversarial images, where the job has some
//
// then loads the model (its time: parse, optimize, make runnable, the row's conversion),
// times single images, classifies every image (throughput at the job's batch where the
// engine takes the model at that batch, else at 1) and posts what it found to `result`,
// with the token and the browser's user agent.  Any failure is posted as `error`, a line
// that begins with the stage it happened in (`load: ` and tract's error for a model tract
// cannot load); the page never waits on anything but the server.
"use strict";

const TOKEN = location.pathname.split("/")[1];

function oneLine(error) {
  const text = String(error && error.message !== undefined ? error.message : error);
  return text.split(/\s+/).join(" ").trim().slice(0, 400) || "unknown error";
}

async function fetched(name) {
  const response = await fetch(name, { cache: "no-store" });
  if (!response.ok) throw new Error(`${name}: HTTP ${response.status}`);
  return response;
}

// The engine's C ABI, over its memory.  A view of the memory is made anew for every use:
// the memory may grow during any call into the engine, which detaches the old buffer.
class Engine {
  constructor(exports) {
    this.x = exports;
  }

  bytes(ptr, length) {
    return new Uint8Array(this.x.memory.buffer, ptr, length);
  }

  floats(ptr, length) {
    return new Float32Array(this.x.memory.buffer, ptr, length);
  }

  alloc(size) {
    const ptr = this.x.engine_alloc(size);
    if (!ptr) throw new Error(`the engine has no memory for ${size} bytes`);
    return ptr;
  }

  error() {
    return new TextDecoder().decode(this.bytes(this.x.engine_error(), this.x.engine_error_len()).slice());
  }

  // A call into the engine; a trap (a panic aborts) as an error with the panic's message.
  call(name, ...args) {
    try {
      return this.x[name](...args);
    } catch (error) {
      const panic = this.error();
      throw new Error(panic ? `${oneLine(error)} (${panic})` : oneLine(error));
    }
  }

  // The model at input shape `shape` (the batch first); throws tract's error.
  load(model, shape) {
    const modelPtr = this.alloc(model.length);
    this.bytes(modelPtr, model.length).set(model);
    const shapePtr = this.alloc(4 * shape.length);
    new Uint32Array(this.x.memory.buffer, shapePtr, shape.length).set(shape);
    try {
      const handle = this.call("engine_load", modelPtr, model.length, shapePtr, shape.length);
      if (!handle) throw new Error(this.error());
      return new Runner(this, handle, shape);
    } finally {
      this.x.engine_free(shapePtr, 4 * shape.length);
      this.x.engine_free(modelPtr, model.length);
    }
  }
}

// One loaded model: its input buffer in the engine's memory, run on float32s.
class Runner {
  constructor(engine, handle, shape) {
    this.engine = engine;
    this.handle = handle;
    this.batch = shape[0];
    this.length = shape.reduce((a, b) => a * b, 1);
    this.input = engine.alloc(4 * this.length);
  }

  // The model's first output for `values` (this.length float32s): a view, valid until the
  // next call into the engine.
  run(values) {
    const engine = this.engine;
    engine.floats(this.input, this.length).set(values);
    if (!engine.call("engine_run", this.handle, this.input, this.length)) throw new Error(engine.error());
    return engine.floats(engine.x.engine_output(this.handle), engine.x.engine_output_len(this.handle));
  }
}

// numpy's argmax: the first largest value, or the first NaN.
function argmax(values, start, length) {
  let best = 0;
  for (let i = 0; i < length; i++) {
    const value = values[start + i];
    if (Number.isNaN(value)) return i;
    if (value > values[start + best]) best = i;
  }
  return best;
}

// Every image's class, and the outputs of the first `keep`: full batches through `batched`
// (where there is one), the rest through `single`.  The full batches are timed after one
// untimed run of the first (where there is no batched model, every image at batch 1).
function classify(single, batched, images, perImage, keep) {
  const count = images.length / perImage;
  if (batched && count < batched.batch) batched = null;
  const classes = new Array(count);
  const logits = [];
  const take = (output, first, n) => {
    const width = output.length / n;
    for (let j = 0; j < n; j++) {
      classes[first + j] = argmax(output, j * width, width);
      if (first + j < keep) logits.push(Array.from(output.subarray(j * width, (j + 1) * width)));
    }
  };
  let done = 0, seconds = 0, counted = 0, batch = 1;
  if (batched) {
    const size = batched.batch * perImage;
    const chunks = Math.floor(count / batched.batch);
    batched.run(images.subarray(0, size));
    const started = performance.now();
    for (let c = 0; c < chunks; c++) {
      take(batched.run(images.subarray(c * size, (c + 1) * size)), c * batched.batch, batched.batch);
    }
    seconds = (performance.now() - started) / 1000;
    done = counted = chunks * batched.batch;
    batch = batched.batch;
  }
  const started = performance.now();
  for (let i = done; i < count; i++) take(single.run(images.subarray(i * perImage, (i + 1) * perImage)), i, 1);
  if (!batched) {
    seconds = (performance.now() - started) / 1000;
    counted = count;
  }
  return { classes, logits, seconds, counted, batch };
}

async function post(result) {
  result.token = TOKEN;
  result.userAgent = navigator.userAgent;
  await fetch("result", { method: "POST", headers: { "Content-Type": "application/json" },
                          body: JSON.stringify(result) });
  document.getElementById("state").textContent = result.error ? `failed: ${result.error}` : "done";
}

async function main() {
  let stage = "fetch";
  let result;
  try {
    const job = await (await fetched("job.json")).json();
    const buffers = await Promise.all(["engine.wasm", "model.onnx", "images.f32",
                                       ...(job.adversarial ? ["adversarial.f32"] : [])]
      .map(async name => (await fetched(name)).arrayBuffer()));
    const [wasm, model, images, adversarial] = [buffers[0], new Uint8Array(buffers[1]),
      new Float32Array(buffers[2]), buffers[3] && new Float32Array(buffers[3])];

    stage = "instantiate";
    let memory = null;
    const imports = { env: {
      // tract's random operators' seed: the browser's randomness (at most 65,536 bytes a call)
      random_fill: (ptr, length) => {
        for (let at = 0; at < length; at += 65536) {
          crypto.getRandomValues(new Uint8Array(memory.buffer, ptr + at, Math.min(65536, length - at)));
        }
      },
    } };
    const { instance } = await WebAssembly.instantiate(wasm, imports);
    memory = instance.exports.memory;
    const engine = new Engine(instance.exports);

    stage = "load";
    const perImage = job.shape.reduce((a, b) => a * b, 1);
    const count = images.length / perImage;
    let started = performance.now();
    const single = engine.load(model, [1, ...job.shape]);
    const conversionSeconds = (performance.now() - started) / 1000;
    let batched = null, batchedError = null;
    if (job.batch > 1 && count >= job.batch) {
      try {
        batched = engine.load(model, [job.batch, ...job.shape]);
      } catch (error) {     // the model takes one batch only: throughput at batch 1
        batchedError = oneLine(error);
      }
    }

    stage = "run";
    const image = i => images.subarray(i * perImage, (i + 1) * perImage);
    for (let i = 0; i < Math.min(job.warmup, count); i++) single.run(image(i));
    const latencyMs = [];
    for (let i = 0; i < Math.min(job.timed, count); i++) {
      started = performance.now();
      single.run(image(i));
      latencyMs.push(performance.now() - started);
    }
    const found = classify(single, batched, images, perImage, job.logits);
    result = {
      conversion_s: conversionSeconds, latency_ms: latencyMs, classes: found.classes,
      logits: found.logits, throughput_images: found.counted, throughput_s: found.seconds,
      throughput_batch: found.batch, batched_error: batchedError,
      cross_origin_isolated: self.crossOriginIsolated,
    };
    if (adversarial) {
      stage = "adversarial";
      result.adversarial_classes = classify(single, batched, adversarial, perImage, 0).classes;
    }
  } catch (error) {
    result = { error: `${stage}: ${oneLine(error)}` };
  }
  await post(result);
}

main();
