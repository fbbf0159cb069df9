#![allow(clippy::unwrap_used)]
//! Replicas (`Replicate`, `Module::replicate_boxed`; Note [Replicas of a module]): for every
//! built-in layer, a `Sequential` of boxed layers and a derived model with nested children,
//! tied weights and a shared `Arc` child, the replica has the original's names, print-out,
//! values, shapes, dtypes, devices and `requires_grad`, in tensors of its own (writing into
//! the replica leaves the original as it was), no gradients, the same training mode and
//! hooks in tables of its own, and computes the same outputs. On `cpu` and the emulated
//! `cuda:0`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

mod common;

use common::devices;
use ember_nn::layers::{
    AvgPool2d, BatchNorm1d, BatchNorm2d, BatchNormConfig, Conv2d, Dropout, Embedding, Flatten,
    GELU, LayerNorm, Linear, MaxPool2d, ReLU, Sequential, SiLU, Sigmoid, Tanh,
};
use ember_nn::{Module, ModuleHooks, ReplicaMemo, Replicate, Result, Tensor};
use ember_tensor::{Approximate, DType, Device};

/// Layer initialisation draws from the process-wide generator: tests take turns.
static RNG: Mutex<()> = Mutex::new(());

fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `sum(m(x)).backward()`.
fn backward_of_sum(m: &dyn Module, x: &Tensor) {
    m.call(x).unwrap().sum_all().unwrap().backward().unwrap();
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_device(Device::Cpu).unwrap().to_vec::<f64>().unwrap()
}

/// Every parameter and buffer, by name (each tensor once).
fn members(m: &dyn Module) -> Vec<(String, Tensor)> {
    m.named_parameters()
        .into_iter()
        .chain(m.named_buffers())
        .collect()
}

/// The replica `copy` of `orig`, checked against it; `input` (if any) gives both the same
/// output. Ends by writing 7 into every tensor of the replica and checking that the
/// original kept its values.
fn check_replica(what: &str, orig: &dyn Module, copy: &dyn Module, input: Option<&Tensor>) {
    assert_eq!(copy.describe(), orig.describe(), "{what}: print-out");
    let sd = |m: &dyn Module| m.state_dict().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(sd(copy), sd(orig), "{what}: state_dict keys");
    let names = |v: Vec<(String, Tensor)>| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(
        names(copy.named_parameters()),
        names(orig.named_parameters()),
        "{what}: parameters"
    );
    assert_eq!(
        names(copy.named_buffers()),
        names(orig.named_buffers()),
        "{what}: buffers"
    );
    let (a, b) = (members(orig), members(copy));
    assert_eq!(a.len(), b.len(), "{what}");
    for ((n, t), (_, c)) in a.iter().zip(&b) {
        assert!(!c.same(t), "{what}: `{n}` is the original's tensor");
        assert_eq!(c.dims(), t.dims(), "{what}: `{n}` shape");
        assert_eq!(c.dtype(), t.dtype(), "{what}: `{n}` dtype");
        assert_eq!(c.device(), t.device(), "{what}: `{n}` device");
        assert_eq!(
            c.requires_grad(),
            t.requires_grad(),
            "{what}: `{n}` requires_grad"
        );
        assert!(c.is_leaf(), "{what}: `{n}` is a leaf");
        assert!(c.grad().is_none(), "{what}: `{n}` has no gradient");
        assert_eq!(values(c), values(t), "{what}: `{n}` values");
    }
    assert_eq!(copy.is_training(), orig.is_training(), "{what}: mode");
    for ((n, o), (_, c)) in orig.named_modules().iter().zip(copy.named_modules()) {
        assert_eq!(c.is_training(), o.is_training(), "{what}: `{n}` mode");
        let count = |m: &dyn Module| {
            m.hooks()
                .map(|h| (h.forward_pre_hooks(), h.forward_hooks()))
        };
        assert_eq!(count(c), count(*o), "{what}: `{n}` hooks");
    }
    if let Some(x) = input {
        let (y, z) = (orig.call(x).unwrap(), copy.call(x).unwrap());
        assert_eq!(values(&z), values(&y), "{what}: output");
    }
    // Tensors of its own: writing into the replica leaves the original alone.
    let before: Vec<Vec<f64>> = a.iter().map(|(_, t)| values(t)).collect();
    for (_, c) in &b {
        c.data().fill_(7).unwrap();
    }
    for (((n, t), (_, c)), old) in a.iter().zip(&b).zip(before) {
        assert_eq!(values(t), old, "{what}: `{n}` changed with the replica");
        assert!(values(c).iter().all(|v| *v == 7.0), "{what}: `{n}` written");
    }
}

/// `m.replicate()` and `m.replicate_boxed()`, each checked against `make()`'s module.
fn check_layer<M: Module + Replicate + 'static>(
    what: &str,
    make: impl Fn(Device) -> Result<M>,
    input: impl Fn(Device) -> Tensor,
) {
    for d in devices() {
        let what = format!("{what} on {d}");
        let m = make(d).unwrap();
        // A gradient on the original, which the replica does not copy.
        if let Some(p) = m.parameters().iter().find(|p| p.requires_grad()) {
            p.sum_all().unwrap().backward().unwrap();
        }
        m.eval(); // dropout off, batch norm on its running statistics: outputs comparable
        let x = input(d);
        check_replica(&what, &m, &m.replicate().unwrap(), Some(&x));
        let boxed: Box<dyn Module> = Box::new(make(d).unwrap());
        boxed.eval();
        check_replica(
            &format!("{what}, boxed"),
            boxed.as_ref(),
            boxed.replicate_boxed().unwrap().as_ref(),
            Some(&x),
        );
    }
}

fn randn(dims: &[usize], d: Device) -> Tensor {
    Tensor::randn(dims.to_vec(), d).unwrap()
}

#[test]
fn every_layer_replicates_with_tensors_of_its_own() {
    let _rng = rng_lock();
    check_layer("Linear", |d| Linear::new(3, 4, d), |d| randn(&[2, 3], d));
    check_layer(
        "Linear, f64, no bias, frozen weight",
        |d| {
            let l = Linear::with_bias(3, 4, false, (d, DType::F64))?;
            l.weight.requires_grad_(false)?;
            Ok(l)
        },
        |d| randn(&[2, 3], d).to_dtype(DType::F64).unwrap(),
    );
    check_layer(
        "Conv2d",
        |d| Conv2d::new(2, 3, 3, d),
        |d| randn(&[1, 2, 5, 5], d),
    );
    check_layer(
        "BatchNorm1d",
        |d| {
            let bn = BatchNorm1d::new(3, d)?;
            bn.call(&randn(&[4, 3], d))?; // running statistics that are not the defaults
            Ok(bn)
        },
        |d| randn(&[4, 3], d),
    );
    check_layer(
        "BatchNorm2d without affine or running statistics",
        |d| {
            let config = BatchNormConfig {
                affine: false,
                track_running_stats: false,
                ..Default::default()
            };
            BatchNorm2d::with_config(2, config, d)
        },
        |d| randn(&[2, 2, 3, 3], d),
    );
    check_layer(
        "LayerNorm",
        |d| LayerNorm::new(&[4], d),
        |d| randn(&[2, 4], d),
    );
    check_layer(
        "LayerNorm without affine",
        |d| LayerNorm::with_options(&[4], 1e-5, false, d),
        |d| randn(&[2, 4], d),
    );
    check_layer(
        "Embedding",
        |d| Embedding::new(5, 3, d),
        |d| Tensor::randint(0, 5, [2, 2], d).unwrap(),
    );
    check_layer("Dropout", |_| Dropout::new(0.5), |d| randn(&[2, 3], d));
    check_layer("ReLU", |_| Ok(ReLU::new()), |d| randn(&[2, 3], d));
    check_layer("SiLU", |_| Ok(SiLU::new()), |d| randn(&[2, 3], d));
    check_layer("Sigmoid", |_| Ok(Sigmoid::new()), |d| randn(&[2, 3], d));
    check_layer("Tanh", |_| Ok(Tanh::new()), |d| randn(&[2, 3], d));
    check_layer(
        "GELU",
        |_| Ok(GELU::new(Approximate::Tanh)),
        |d| randn(&[2, 3], d),
    );
    check_layer(
        "MaxPool2d",
        |_| Ok(MaxPool2d::new(2)),
        |d| randn(&[1, 1, 4, 4], d),
    );
    check_layer(
        "AvgPool2d",
        |_| Ok(AvgPool2d::new(2)),
        |d| randn(&[1, 1, 4, 4], d),
    );
    check_layer("Flatten", |_| Ok(Flatten::new()), |d| randn(&[2, 3, 4], d));
    check_layer(
        "Sequential of boxed layers",
        |d| {
            let mut s = Sequential::new()
                .add(Conv2d::new(1, 2, 3, d)?)
                .add(BatchNorm2d::new(2, d)?)
                .add(ReLU::new())
                .add(Flatten::new());
            s.push(Box::new(Linear::new(8, 2, d)?));
            Ok(s)
        },
        |d| randn(&[3, 1, 4, 4], d),
    );
}

// ---- a derived model: nested children, a tie, a shared child, hooks, a mode ----

#[derive(Clone, Debug, PartialEq)]
struct Config {
    name: String,
}

#[derive(Debug, Module)]
struct Block {
    fc: Linear,
    norm: Option<LayerNorm>,
    act: Box<dyn Module>,
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = self.fc.call(x)?;
        if let Some(norm) = &self.norm {
            x = norm.call(&x)?;
        }
        self.act.call(&x)
    }
}

#[derive(Debug, Module)]
struct Net {
    #[param]
    scale: Tensor,
    embed: Embedding,
    blocks: Vec<Block>,
    pair: [Linear; 2],
    head: Sequential,
    shared_a: Arc<Linear>,
    shared_b: Arc<Linear>,
    decoder: Linear,
    #[buffer]
    step: Tensor,
    #[module(skip)]
    config: Config,
    width: usize,
    hooks: ModuleHooks,
}

impl Module for Net {
    fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        let mut x = self.embed.call(idx)?.mul(&self.scale)?;
        for b in &self.blocks {
            x = b.call(&x)?;
        }
        x = self.pair[1].call(&self.pair[0].call(&x)?)?;
        x = self.head.call(&x)?;
        x = self.shared_b.call(&self.shared_a.call(&x)?)?;
        self.decoder.call(&x)
    }
}

fn net(d: Device) -> Result<Net> {
    let block = |norm: bool| -> Result<Block> {
        Ok(Block {
            fc: Linear::new(4, 4, d)?,
            norm: if norm {
                Some(LayerNorm::new(&[4], d)?)
            } else {
                None
            },
            act: Box::new(ReLU::new()),
        })
    };
    let embed = Embedding::new(10, 4, d)?;
    let mut decoder = Linear::new(4, 10, d)?;
    decoder.weight = embed.weight.clone(); // tied
    let shared = Arc::new(Linear::new(4, 4, d)?);
    Ok(Net {
        scale: ember_nn::parameter(ember_tensor::Tensor::ones([4], d)?)?,
        embed,
        blocks: vec![block(true)?, block(false)?],
        pair: [Linear::new(4, 4, d)?, Linear::new(4, 4, d)?],
        head: Sequential::new()
            .add(Linear::new(4, 4, d)?)
            .add(BatchNorm1d::new(4, d)?)
            .add(Dropout::new(0.2)?),
        shared_a: shared.clone(),
        shared_b: shared,
        decoder,
        step: Tensor::zeros([], d)?,
        config: Config {
            name: "tiny".into(),
        },
        width: 4,
        hooks: ModuleHooks::default(),
    })
}

#[test]
fn a_derived_model_replicates_keeping_ties_sharing_hooks_and_modes() {
    let _rng = rng_lock();
    for d in devices() {
        let m = net(d).unwrap();
        let idx = Tensor::randint(0, 10, [6], d).unwrap();
        // A training step's worth of state: gradients, running statistics, a step count.
        backward_of_sum(&m, &idx);
        m.step.data().fill_(3).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&calls);
        m.register_forward_hook(Box::new(move |_, _, _| {
            counter.fetch_add(1, Ordering::Relaxed);
            Ok(None)
        }))
        .unwrap();
        m.head.eval(); // one part in eval, the rest in training
        m.head.get(1).unwrap().train(true);

        let copy = m.replicate().unwrap();
        // The tie and the shared child stay so; plain and skipped fields are clones.
        assert!(copy.decoder.weight.same(&copy.embed.weight), "{d}: tie");
        assert!(Arc::ptr_eq(&copy.shared_a, &copy.shared_b), "{d}: sharing");
        assert!(
            !Arc::ptr_eq(&copy.shared_a, &m.shared_a),
            "{d}: a new child"
        );
        assert_eq!(copy.config, m.config);
        assert_eq!(copy.width, 4);
        // The hook was copied: it runs when the replica is called.
        let before = calls.load(Ordering::Relaxed);
        m.eval();
        let eval_copy = m.replicate().unwrap();
        check_replica(&format!("Net on {d}"), &m, &eval_copy, Some(&idx));
        assert_eq!(
            calls.load(Ordering::Relaxed),
            before + 2,
            "{d}: the hook ran twice"
        );
        m.train(true);
        m.head.eval();
        m.head.get(1).unwrap().train(true);
        check_replica(&format!("Net (mixed modes) on {d}"), &m, &copy, None);
        // Modes and hooks of the replica are its own.
        copy.eval();
        assert!(m.is_training() && !copy.is_training());
        copy.register_forward_pre_hook(Box::new(|_, _| Ok(None)))
            .unwrap();
        assert_eq!(m.hooks.forward_pre_hooks(), 0);
        // The replica trains on its own: gradients reach its tensors, not the original's.
        let fresh = m.replicate().unwrap();
        backward_of_sum(&fresh, &idx);
        assert!(fresh.scale.grad().is_some());
        let g = values(&m.scale.grad().unwrap());
        backward_of_sum(&fresh, &idx);
        assert_eq!(values(&m.scale.grad().unwrap()), g, "{d}: original's grad");
        // As a trait object, through replicate_boxed.
        let boxed: Box<dyn Module> = Box::new(net(d).unwrap());
        boxed.eval();
        let copy = boxed.replicate().unwrap(); // Replicate for Box<dyn Module>
        check_replica(
            &format!("boxed Net on {d}"),
            boxed.as_ref(),
            copy.as_ref(),
            Some(&idx),
        );
    }
}

#[test]
fn one_memo_keeps_tensors_shared_across_replicated_parts() {
    let _rng = rng_lock();
    let a = Linear::new(2, 2, ()).unwrap();
    let mut b = Linear::new(2, 2, ()).unwrap();
    b.weight = a.weight.clone();
    let mut memo = ReplicaMemo::new();
    let (ra, rb) = (
        a.replicate_with(&mut memo).unwrap(),
        b.replicate_with(&mut memo).unwrap(),
    );
    assert!(ra.weight.same(&rb.weight) && !ra.weight.same(&a.weight));
    assert!(!ra.bias.as_ref().unwrap().same(rb.bias.as_ref().unwrap()));
    // Separate replicas do not share.
    assert!(
        !a.replicate()
            .unwrap()
            .weight
            .same(&b.replicate().unwrap().weight)
    );
}

// ---- modules without a boxed replica ----

#[derive(Debug, Module)]
#[module(no_replicate)]
struct Logged {
    fc: Linear,
    #[module(skip)]
    log: Mutex<Vec<String>>,
}

impl Module for Logged {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Ok(mut log) = self.log.lock() {
            log.push(format!("forward {:?}", x.dims()));
        }
        self.fc.call(x)
    }
}

#[derive(Debug, Module)]
struct Residual<M: Module> {
    inner: M,
}

impl<M: Module> Module for Residual<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.add(&self.inner.call(x)?)
    }
}

#[test]
fn modules_without_a_boxed_replica_say_so() {
    let _rng = rng_lock();
    let logged = Logged {
        fc: Linear::new(2, 2, ()).unwrap(),
        log: Mutex::new(Vec::new()),
    };
    let seq = Sequential::new().add(ReLU::new()).add(logged);
    let e = seq.replicate().unwrap_err().to_string();
    assert!(e.contains("`Logged` has no replica"), "{e}");
    // A type parameter in a plain field: a typed replica, and no boxed one.
    let c = Configured {
        fc: Linear::new(2, 2, ()).unwrap(),
        cfg: 3u8,
    };
    check_replica("Configured<u8>", &c, &c.replicate().unwrap(), None);
    let e = c.replicate_boxed().unwrap_err().to_string();
    assert!(e.contains("`Configured` has no replica"), "{e}");
}

#[derive(Debug, Module)]
struct Configured<C: Clone + Send + Sync + std::fmt::Debug + 'static> {
    fc: Linear,
    #[module(skip)]
    cfg: C,
}

impl<C: Clone + Send + Sync + std::fmt::Debug + 'static> Module for Configured<C> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc.call(x)
    }
}

/// A generic module of modules (`Residual<M>`, `Stack<M>`): the typed replica, and the
/// boxed one a `Sequential` uses, through the children's boxed replicas (Note [Boxed
/// replicas of generic modules]), also for `M = Box<dyn Module>` and `Arc<dyn Module>`.
#[test]
fn generic_modules_of_modules_have_boxed_replicas() {
    let _rng = rng_lock();
    let x = randn(&[1, 2], Device::Cpu);
    let r = Residual {
        inner: Linear::new(2, 2, ()).unwrap(),
    };
    check_replica("Residual<Linear>", &r, &r.replicate().unwrap(), Some(&x));
    check_replica(
        "boxed Residual<Linear>",
        &r,
        &*r.replicate_boxed().unwrap(),
        Some(&x),
    );
    let seq = Sequential::new()
        .add(Linear::new(2, 2, ()).unwrap())
        .add(Residual {
            inner: Residual {
                inner: Linear::new(2, 2, ()).unwrap(),
            },
        });
    check_replica(
        "Sequential of Residuals",
        &seq,
        &seq.replicate().unwrap(),
        Some(&x),
    );
    let dynamic: Residual<Box<dyn Module>> = Residual {
        inner: Box::new(Linear::new(2, 2, ()).unwrap()),
    };
    check_replica(
        "Residual<Box<dyn Module>>",
        &dynamic,
        &*dynamic.replicate_boxed().unwrap(),
        Some(&x),
    );
    // Shared children stay shared: one Arc held twice is one replica held twice.
    let shared: Arc<dyn Module> = Arc::new(Linear::new(2, 2, ()).unwrap());
    let stack = Stack {
        layers: vec![shared.clone(), shared],
        head: Some(Linear::new(2, 2, ()).unwrap()),
    };
    let copy = stack.replicate_boxed().unwrap();
    check_replica("Stack<Arc<dyn Module>>", &stack, &*copy, Some(&x));
    let p = copy.parameters();
    assert_eq!(p.len(), 4, "the shared layer's parameters are listed once");
    // A child whose replica is of another type than the field's is a named error.
    let odd: Residual<Box<Linear>> = Residual {
        inner: Box::new(Linear::new(2, 2, ()).unwrap()),
    };
    let e = odd.replicate_boxed().unwrap_err().to_string();
    assert!(e.contains("is not a `alloc::boxed::Box<"), "{e}");
    assert!(odd.replicate().is_ok());
}

#[derive(Debug, Module)]
struct Stack<M: Module> {
    layers: Vec<M>,
    head: Option<Linear>,
}

impl<M: Module> Module for Stack<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = x.clone();
        for l in &self.layers {
            x = l.call(&x)?;
        }
        match &self.head {
            Some(h) => h.call(&x),
            None => Ok(x),
        }
    }
}
