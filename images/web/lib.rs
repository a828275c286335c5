//! The web platform's inference engine: tract's ONNX runtime, compiled to WebAssembly
//! (wasm32-unknown-unknown, one thread), behind a plain C ABI.  The page (web.js) calls it
//! through `WebAssembly.instantiate` and the module's memory, with no generated glue: it
//! asks for a buffer (`engine_alloc`), writes the model's bytes or an input there, and
//! reads what the engine wrote from the pointers it returns.
//!
//!     engine_alloc(size) -> ptr           a buffer of the module's memory (16-byte aligned)
//!     engine_free(ptr, size)
//!     engine_load(model, model_len, shape, rank) -> handle
//!                                         the ONNX model parsed, its input fixed to `shape`
//!                                         (u32s: the batch, then one image's dimensions),
//!                                         optimized and made runnable; 0 where it failed
//!     engine_run(handle, input, len) -> 1 the model run on `len` float32s (the input's
//!                                         shape, in order); 0 where it failed
//!     engine_output(handle), engine_output_len(handle)
//!                                         the last run's first output, as float32s
//!     engine_drop(handle)
//!     engine_error(), engine_error_len()  the last failure's message (UTF-8)
//!
//! A failure is tract's error chain, on one line.  A panic aborts (a trap the page catches),
//! its message kept first by the panic hook.  The module's one import is `env.random_fill`,
//! the page's `crypto.getRandomValues`, which seeds tract's random operators (getrandom has
//! no source of its own on wasm32-unknown-unknown).

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::sync::Once;

use tract_onnx::prelude::tract_data::internal::ensure;
use tract_onnx::prelude::*;

const ALIGN: usize = 16;

/// A loaded model: its plan, its input's shape, and its last output.
struct Model {
    plan: TypedRunnableModel<TypedModel>,
    shape: Vec<usize>,
    input_len: usize,
    output: Vec<f32>,
}

thread_local! {
    // handle - 1 -> model; one thread, so a plain cell
    static MODELS: RefCell<Vec<Option<Model>>> = const { RefCell::new(Vec::new()) };
    static ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

static PANIC_HOOK: Once = Once::new();

fn set_error(message: String) {
    ERROR.with(|error| {
        if let Ok(mut error) = error.try_borrow_mut() {
            *error = message.split_whitespace().collect::<Vec<_>>().join(" ");
        }
    });
}

// -- the randomness tract's random operators seed from: the browser's ---------------------
#[link(wasm_import_module = "env")]
extern "C" {
    fn random_fill(ptr: *mut u8, len: usize);
}

fn browser_random(buffer: &mut [u8]) -> Result<(), getrandom::Error> {
    // SAFETY: the page writes exactly `len` bytes at `ptr`, inside this buffer
    unsafe { random_fill(buffer.as_mut_ptr(), buffer.len()) };
    Ok(())
}

getrandom::register_custom_getrandom!(browser_random);

// -- memory --------------------------------------------------------------------------------
#[no_mangle]
pub extern "C" fn engine_alloc(size: usize) -> *mut u8 {
    match Layout::from_size_align(size.max(1), ALIGN) {
        // SAFETY: the layout's size is not zero
        Ok(layout) => unsafe { alloc::alloc(layout) },
        Err(_) => std::ptr::null_mut(),
    }
}

/// # Safety
/// `ptr` must come from `engine_alloc(size)` and not be freed yet.
#[no_mangle]
pub unsafe extern "C" fn engine_free(ptr: *mut u8, size: usize) {
    if !ptr.is_null() {
        alloc::dealloc(ptr, Layout::from_size_align_unchecked(size.max(1), ALIGN));
    }
}

// -- models --------------------------------------------------------------------------------
fn load(bytes: &[u8], shape: &[usize]) -> TractResult<Model> {
    let model = tract_onnx::onnx().model_for_read(&mut &*bytes)?;
    let inputs = model.input_outlets()?.len();
    ensure!(inputs == 1, "the model has {inputs} inputs; the engine feeds one");
    let plan = model
        .with_input_fact(0, f32::fact(shape).into())?
        .into_optimized()?
        .into_runnable()?;
    Ok(Model { plan, shape: shape.to_vec(), input_len: shape.iter().product(), output: Vec::new() })
}

/// # Safety
/// `model` must point at `model_len` bytes and `shape` at `rank` u32s.
#[no_mangle]
pub unsafe extern "C" fn engine_load(model: *const u8, model_len: usize, shape: *const u32,
                                     rank: usize) -> u32 {
    PANIC_HOOK.call_once(|| {
        std::panic::set_hook(Box::new(|info| set_error(format!("panic: {info}"))));
    });
    let bytes = std::slice::from_raw_parts(model, model_len);
    let shape: Vec<usize> =
        std::slice::from_raw_parts(shape, rank).iter().map(|&d| d as usize).collect();
    match load(bytes, &shape) {
        Ok(loaded) => MODELS.with(|models| {
            let mut models = models.borrow_mut();
            models.push(Some(loaded));
            models.len() as u32
        }),
        Err(error) => {
            set_error(format!("{error:#}"));
            0
        }
    }
}

/// The model of `handle`, given to `f`; None where there is none.
fn with_model<T>(handle: u32, f: impl FnOnce(&mut Model) -> T) -> Option<T> {
    MODELS.with(|models| {
        let mut models = models.borrow_mut();
        let index = (handle as usize).checked_sub(1)?;
        models.get_mut(index)?.as_mut().map(f)
    })
}

fn run(model: &mut Model, data: &[f32]) -> TractResult<()> {
    ensure!(data.len() == model.input_len,
            "{} values given for an input of shape {:?}", data.len(), model.shape);
    let input = Tensor::from_shape(&model.shape, data)?;
    let outputs = model.plan.run(tvec!(input.into()))?;
    let output = outputs[0].cast_to::<f32>()?;
    model.output.clear();
    model.output.extend_from_slice(output.as_slice::<f32>()?);
    Ok(())
}

/// # Safety
/// `input` must point at `len` float32s, 4-byte aligned.
#[no_mangle]
pub unsafe extern "C" fn engine_run(handle: u32, input: *const f32, len: usize) -> u32 {
    let data = std::slice::from_raw_parts(input, len);
    match with_model(handle, |model| run(model, data)) {
        Some(Ok(())) => 1,
        Some(Err(error)) => {
            set_error(format!("{error:#}"));
            0
        }
        None => {
            set_error(format!("no model {handle}"));
            0
        }
    }
}

#[no_mangle]
pub extern "C" fn engine_output(handle: u32) -> *const f32 {
    with_model(handle, |model| model.output.as_ptr()).unwrap_or(std::ptr::null())
}

#[no_mangle]
pub extern "C" fn engine_output_len(handle: u32) -> usize {
    with_model(handle, |model| model.output.len()).unwrap_or(0)
}

#[no_mangle]
pub extern "C" fn engine_drop(handle: u32) {
    if let Some(index) = (handle as usize).checked_sub(1) {
        MODELS.with(|models| {
            if let Some(slot) = models.borrow_mut().get_mut(index) {
                *slot = None;
            }
        });
    }
}

// -- the last failure ----------------------------------------------------------------------
#[no_mangle]
pub extern "C" fn engine_error() -> *const u8 {
    ERROR.with(|error| error.borrow().as_ptr())
}

#[no_mangle]
pub extern "C" fn engine_error_len() -> usize {
    ERROR.with(|error| error.borrow().len())
}
