//! What the profiler's test binaries share: a lock (one profiler per process, and it sees
//! every thread), a small model and one training step with the walk-through's ranges.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::{Mutex, MutexGuard};

use ember_autograd::Result;
use ember_nn::layers::Linear;
use ember_nn::optim::{Adam, Optimizer};
use ember_nn::{Module, Tensor, functional as F};
use ember_profiler::{ProfilerActivity, record_function};
use ember_tensor::Device;

pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn both() -> Vec<ProfilerActivity> {
    vec![ProfilerActivity::Cpu, ProfilerActivity::Cuda]
}

pub struct Model {
    fc1: Linear,
    fc2: Linear,
}

impl Model {
    pub fn new(dev: &Device) -> Result<Model> {
        Ok(Model {
            fc1: Linear::new(8, 16, *dev)?,
            fc2: Linear::new(16, 4, *dev)?,
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc2.forward(&self.fc1.forward(x)?.relu()?)
    }
    pub fn params(&self) -> Vec<Tensor> {
        let mut p = self.fc1.parameters();
        p.extend(self.fc2.parameters());
        p
    }
}

/// One training step, with the walk-through's `record_function` ranges.
pub fn train_step(model: &Model, opt: &mut Adam, dev: &Device) -> Result<()> {
    let (x, t) = {
        let _r = record_function("data_loading");
        let x = Tensor::randn([5, 8], *dev)?;
        let t = Tensor::from_vec(vec![0i64, 1, 2, 3, 1], [5], dev)?;
        (x, t)
    };
    let loss = {
        let _r = record_function("forward");
        F::cross_entropy(&model.forward(&x)?, &t, ())?
    };
    {
        let _r = record_function("backward");
        loss.backward()?;
    }
    let _r = record_function("optimizer");
    opt.step()?;
    opt.zero_grad(true)?;
    Ok(())
}

/// A fresh directory under the system's temporary directory.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ember-profiler-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Whether the process's driver can record activity now: CUPTI loads and can be enabled
/// (always on the emulator; on a GPU not, for example, under compute-sanitizer, which holds
/// CUPTI itself). Leaves nothing enabled or recorded.
pub fn activity_api_usable() -> bool {
    let driver = ember_device::cuda::initialized_driver().expect("CUDA ran");
    let usable = driver.activity_version().is_ok() && driver.activity_enable().is_ok();
    if usable {
        driver.activity_disable().unwrap();
        driver.activity_flush().unwrap();
    }
    usable
}
