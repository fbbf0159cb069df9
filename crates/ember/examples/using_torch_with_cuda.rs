//! The PyTorch walk-through "Using torch with CUDA" (docs/walkthroughs.md), replayed in Rust:
//! checking for CUDA, device-agnostic setup, moving tensors and models (to a second GPU too),
//! memory statistics and `empty_cache`, and the common error of mixing CPU and GPU tensors,
//! with its fix. (`DataParallel` and mixed precision come with their own crates.)
//!
//! `cargo run --example using_torch_with_cuda`

use ember::nn::{Linear, Module, NnError};
use ember::{Device, Error, Tensor, cuda, memory, no_grad};

fn ensure(ok: bool, what: &str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(NnError::invalid("walk-through", what).into())
    }
}

/// Runs the walk-through on `device` (and `second` in the role of `cuda:1`).
pub fn run(device: Device, second: Device) -> Result<(), Error> {
    println!("CUDA ready: {}", cuda::is_available());
    println!("GPUs: {}", cuda::device_count());

    // device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    let x = Tensor::randn([5, 5], ())?.to(device)?;
    let model = Linear::new(5, 3, ())?;
    model.to(device)?;
    ensure(
        x.device() == device && model.weight.device() == device,
        "moved",
    )?;

    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
    let x_cuda = x.to(device)?;
    let x_cpu = x_cuda.to("cpu")?;
    ensure(x_cpu.to_vec::<f32>()? == [1.0, 2.0], "there and back")?;

    for i in 0..cuda::device_count() {
        println!("{}", cuda::get_device_name(i)?);
    }
    model.to(second)?; // model = model.to('cuda:1')
    ensure(
        model.weight.device() == second
            && model.bias.as_ref().is_some_and(|b| b.device() == second),
        "model on the second GPU",
    )?;
    model.to(device)?;

    println!(
        "allocated {} bytes, reserved {} bytes",
        memory::memory_allocated(device)?,
        memory::memory_reserved(device)?
    );
    memory::empty_cache(device)?;

    // Mixing CPU and GPU tensors: .to(device) both inputs before the operation.
    let input = Tensor::randn([4, 5], ())?;
    if device != Device::Cpu {
        let e = model
            .call(&input)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        println!("model(cpu input): {e}");
        ensure(
            e.contains("Expected all tensors to be on the same device") && e.contains("`weight`"),
            "the mix is an error naming the parameter",
        )?;
    }
    let out = model.call(&input.to(device)?)?;
    ensure(out.device() == device, "fixed by moving the input")?;

    // Out of memory: smaller batches, or no_grad for inference.
    let _g = no_grad();
    ensure(
        model.call(&input.to(device)?)?.grad_fn_name().is_none(),
        "no graph kept",
    )?;
    Ok(())
}

#[allow(dead_code)]
fn main() -> Result<(), Error> {
    run(ember::try_gpu(0), ember::try_gpu(1))
}
