//! "Working on GPUs" (docs/walkthroughs.md), replayed: devices and `try_gpu`, tensors on
//! devices, the explicit cross-device copy, `Z.cuda(1) is Z`, a network moved with
//! `to(device)`, and the training loop's sweet spot (the model moved once, the optimizer
//! after it, each batch at the loop's boundary). What the text displays, the program prints
//! or asserts. `cargo run --example d2l_working_on_gpus` (`EMBER_CUDA_EMULATOR=2`: two
//! emulated GPUs).

use ember::prelude::*;
use ember::{try_all_gpus, try_gpu};

/// The walk-through with `gpu0` and `gpu1` as `try_gpu()` and `try_gpu(1)`: the loop's
/// epoch losses.
pub fn run(gpu0: Device, gpu1: Device) -> Result<Vec<f64>> {
    println!("{}, {}, {}", Device::Cpu, Device::Cuda(0), Device::Cuda(1));
    println!("num_gpus() = {}", cuda::device_count());
    println!("{}, {}, {:?}", try_gpu(0), try_gpu(10), try_all_gpus());
    let x = Tensor::from_vec(vec![1i64, 2, 3], [3], Device::Cpu)?;
    assert_eq!(x.device(), Device::Cpu);
    let big_x = Tensor::ones([2, 3], gpu0)?;
    let big_y = Tensor::rand([2, 3], gpu1)?;
    println!("X = {big_x}\nY = {big_y}");
    if gpu0 != gpu1 {
        // Tensors on different devices are not combined: copy explicitly.
        println!("X + Y: {}", big_x.add(&big_y).expect_err("two devices"));
    }
    let z = big_x.to(gpu1)?; // Z = X.cuda(1)
    println!("X = {big_x}\nZ = {z}\nY + Z = {}", big_y.add(&z)?);
    assert!(z.to(gpu1)?.same(&z)); // Z.cuda(1) is Z
    let net = Sequential::new().add(Linear::new(3, 1, ())?);
    net.to(gpu0)?; // net = net.to(device=try_gpu())
    println!("net(X) = {}", net.call(&big_x)?);
    assert_eq!(net.parameters()[0].device(), gpu0); // net[0].weight.data.device

    // The sweet spot: the model moved once, then the optimizer, each batch at the boundary.
    let model = Linear::new(3, 1, ())?;
    model.to(gpu0)?;
    let mut opt = SGD::new(model.parameters(), 0.1)?;
    let inputs = Tensor::randn([64, 3], ())?;
    let targets = inputs.mm(&Tensor::from_vec(vec![1f32, -2., 0.5], [3, 1], Device::Cpu)?)?;
    let loader = DataLoader::new(TensorDataset::new(vec![inputs, targets])?);
    let (loader, mut losses) = (loader.batch_size(16), vec![]);
    for _ in 0..5 {
        let mut total = 0.0;
        for batch in loader.iter()? {
            let batch = batch?;
            let (x, y) = (batch[0].to(gpu0)?, batch[1].to(gpu0)?);
            opt.zero_grad(true)?;
            let loss = F::mse_loss(&model.call(&x)?, &y, ())?;
            loss.backward()?;
            opt.step()?;
            total += loss.item::<f64>()?;
        }
        losses.push(total);
    }
    Ok(losses)
}

#[allow(dead_code)]
fn main() -> Result<()> {
    run(try_gpu(0), try_gpu(1)).map(|_| ())
}
