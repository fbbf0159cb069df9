#![allow(clippy::unwrap_used)]
//! `#[derive(Module)]` against PyTorch: a derived model's parameter names, `state_dict` keys
//! and order, `named_modules`, `children`, `apply` order, counts and print-out equal
//! PyTorch's for the same structure (`reference/derive_names.py`); `to(device)` moves all
//! of it; forward hooks and pre-hooks; `requires_grad_`; BatchNorm's `momentum=None`,
//! `track_running_stats=False` and `affine=False` against PyTorch's numbers
//! (`reference/batchnorm_options.py`). On `cpu` and the emulated `cuda:0`.

use std::sync::{Arc, Mutex};

use ember_device::cuda;
use ember_device::driver::emulator::EmulatorConfig;
use ember_nn::layers::{
    BatchNorm1d, BatchNorm2d, BatchNormConfig, Embedding, LayerNorm, Linear, ReLU, Sequential,
};
use ember_nn::{Module, ModuleHooks, ModuleParts, NnError, Result, StateDict, Tensor};
use ember_tensor::{DType, Device};

/// Layer initialisation draws from the process-wide generator: tests take turns.
static RNG: Mutex<()> = Mutex::new(());

fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn devices() -> Vec<Device> {
    if std::env::var_os("EMBER_GPU_TEST").is_none() {
        cuda::use_emulator(EmulatorConfig::devices(2)).unwrap();
    }
    vec![Device::Cpu, Device::Cuda(0)]
}

// ---- the model of reference/derive_names.py ----

#[derive(Debug, Module)]
struct Block {
    fc: Linear,
    norm: Option<LayerNorm>,
    act: ReLU,
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
#[module(name = "Net")]
struct MyNet {
    #[param]
    scale: Tensor,
    embed: Embedding,
    blocks: Vec<Block>,
    extra: Option<Linear>,
    head: Sequential,
    shared_a: Arc<Linear>,
    shared_b: Arc<Linear>,
    decoder: Linear,
    #[buffer]
    step: Tensor,
    #[module(skip)]
    scratch: Arc<Linear>,
    width: usize,
    hooks: ModuleHooks,
}

impl Module for MyNet {
    fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        let mut x = self.embed.call(idx)?.mul(&self.scale)?;
        for b in &self.blocks {
            x = b.call(&x)?;
        }
        x = self.head.call(&x)?;
        x = self.shared_b.call(&self.shared_a.call(&x)?)?;
        self.decoder.call(&x)
    }
}

fn my_net(d: Device) -> MyNet {
    let block = |norm: bool| Block {
        fc: Linear::new(4, 4, d).unwrap(),
        norm: norm.then(|| LayerNorm::new(&[4], d).unwrap()),
        act: ReLU::new(),
    };
    let embed = Embedding::new(10, 4, d).unwrap();
    let mut decoder = Linear::new(4, 10, d).unwrap();
    decoder.weight = embed.weight.clone(); // tied: `self.decoder.weight = self.embed.weight`
    let shared = Arc::new(Linear::new(4, 4, d).unwrap());
    MyNet {
        scale: ember_nn::parameter(ember_tensor::Tensor::ones([4], d).unwrap()).unwrap(),
        embed,
        blocks: vec![block(true), block(false)],
        extra: None,
        head: Sequential::new()
            .add(Linear::new(4, 4, d).unwrap())
            .add(BatchNorm1d::new(4, d).unwrap())
            .add(ReLU::new()),
        shared_a: shared.clone(),
        shared_b: shared,
        decoder,
        step: Tensor::zeros([], d).unwrap(),
        scratch: Arc::new(Linear::new(4, 4, d).unwrap()),
        width: 4,
        hooks: ModuleHooks::default(),
    }
}

fn names(v: Vec<(String, Tensor)>) -> Vec<String> {
    v.into_iter().map(|(n, _)| n).collect()
}

// `python reference/derive_names.py`, PyTorch 2.15.0:
const NAMED_PARAMETERS: &[&str] = &[
    "scale",
    "embed.weight",
    "blocks.0.fc.weight",
    "blocks.0.fc.bias",
    "blocks.0.norm.weight",
    "blocks.0.norm.bias",
    "blocks.1.fc.weight",
    "blocks.1.fc.bias",
    "head.0.weight",
    "head.0.bias",
    "head.1.weight",
    "head.1.bias",
    "shared_a.weight",
    "shared_a.bias",
    "decoder.bias",
];
const STATE_DICT: &[&str] = &[
    "scale",
    "step",
    "embed.weight",
    "blocks.0.fc.weight",
    "blocks.0.fc.bias",
    "blocks.0.norm.weight",
    "blocks.0.norm.bias",
    "blocks.1.fc.weight",
    "blocks.1.fc.bias",
    "head.0.weight",
    "head.0.bias",
    "head.1.weight",
    "head.1.bias",
    "head.1.running_mean",
    "head.1.running_var",
    "head.1.num_batches_tracked",
    "shared_a.weight",
    "shared_a.bias",
    "shared_b.weight",
    "shared_b.bias",
    "decoder.weight",
    "decoder.bias",
];
const NAMED_BUFFERS: &[&str] = &[
    "step",
    "head.1.running_mean",
    "head.1.running_var",
    "head.1.num_batches_tracked",
];
const NAMED_MODULES: &[(&str, &str)] = &[
    ("", "Net"),
    ("embed", "Embedding"),
    ("blocks", "ModuleList"),
    ("blocks.0", "Block"),
    ("blocks.0.fc", "Linear"),
    ("blocks.0.norm", "LayerNorm"),
    ("blocks.0.act", "ReLU"),
    ("blocks.1", "Block"),
    ("blocks.1.fc", "Linear"),
    ("blocks.1.act", "ReLU"),
    ("head", "Sequential"),
    ("head.0", "Linear"),
    ("head.1", "BatchNorm1d"),
    ("head.2", "ReLU"),
    ("shared_a", "Linear"),
    ("decoder", "Linear"),
];
const CHILDREN: &[&str] = &["Embedding", "ModuleList", "Sequential", "Linear", "Linear"];
const APPLY: &[&str] = &[
    "Embedding",
    "Linear",
    "LayerNorm",
    "ReLU",
    "Block",
    "Linear",
    "ReLU",
    "Block",
    "ModuleList",
    "Linear",
    "BatchNorm1d",
    "ReLU",
    "Sequential",
    "Linear",
    "Linear",
    "Net",
];
const PARAMETERS: usize = 15;
const NUMEL: usize = 150;
const REPR: &str = "Net(\n  (embed): Embedding(10, 4)\n  (blocks): ModuleList(\n    (0): Block(\n      (fc): Linear(in_features=4, out_features=4, bias=True)\n      (norm): LayerNorm((4,), eps=1e-05, elementwise_affine=True, bias=True)\n      (act): ReLU()\n    )\n    (1): Block(\n      (fc): Linear(in_features=4, out_features=4, bias=True)\n      (act): ReLU()\n    )\n  )\n  (head): Sequential(\n    (0): Linear(in_features=4, out_features=4, bias=True)\n    (1): BatchNorm1d(4, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True)\n    (2): ReLU()\n  )\n  (shared_a): Linear(in_features=4, out_features=4, bias=True)\n  (shared_b): Linear(in_features=4, out_features=4, bias=True)\n  (decoder): Linear(in_features=4, out_features=10, bias=True)\n)";

#[test]
fn a_derived_model_has_pytorchs_names_order_and_print_out() {
    let _rng = rng_lock();
    let net = my_net(Device::Cpu);
    assert_eq!(names(net.named_parameters()), NAMED_PARAMETERS);
    let sd = net.state_dict().unwrap();
    let keys: Vec<&str> = sd.keys().map(String::as_str).collect();
    assert_eq!(keys, STATE_DICT);
    assert_eq!(names(net.named_buffers()), NAMED_BUFFERS);
    let modules: Vec<(String, &str)> = net
        .named_modules()
        .into_iter()
        .map(|(n, m)| (n, m.name()))
        .collect();
    let want: Vec<(String, &str)> = NAMED_MODULES
        .iter()
        .map(|(n, t)| (n.to_string(), *t))
        .collect();
    assert_eq!(modules, want);
    assert_eq!(net.modules().len(), NAMED_MODULES.len());
    let children: Vec<&str> = net.children().iter().map(|m| m.name()).collect();
    assert_eq!(children, CHILDREN);
    let mut order = Vec::new();
    net.apply(&mut |m| order.push(m.name()));
    assert_eq!(order, APPLY);
    assert_eq!(net.parameters().len(), PARAMETERS);
    assert_eq!(net.num_parameters(), NUMEL);
    assert_eq!(net.describe(), REPR);
    // The skipped field and plain data are not registered; the tie holds.
    assert!(!net.parameters().iter().any(|p| p.same(&net.scratch.weight)));
    assert!(net.decoder.weight.same(&net.embed.weight));
    assert_eq!(net.width, 4);
    net.eval();
    assert_eq!(net.modules().iter().filter(|m| m.is_training()).count(), 0);
    net.train(true);
    assert!(net.modules().iter().all(|m| m.is_training()));
}

#[test]
fn state_dict_round_trips_with_shared_keys_and_keeps_pytorchs_order() {
    let _rng = rng_lock();
    let a = my_net(Device::Cpu);
    let b = my_net(Device::Cpu);
    b.load_state_dict(&a.state_dict().unwrap()).unwrap();
    for ((na, pa), (nb, pb)) in a
        .state_dict()
        .unwrap()
        .iter()
        .zip(b.state_dict().unwrap().iter())
    {
        assert_eq!(na, nb);
        assert_eq!(
            pa.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
            pb.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
            "{na}"
        );
    }
    // Every key is expected, the shared ones included.
    let mut sd = a.state_dict().unwrap();
    sd.remove("shared_b.bias");
    let e = b.load_state_dict(&sd).unwrap_err().to_string();
    assert!(
        e.contains("Missing key(s) in state_dict: \"shared_b.bias\"."),
        "{e}"
    );
    // An ordered dict: 10 after 9, insertion order kept, replacing keeps the place.
    let mut sd = StateDict::new();
    for i in [2, 10, 1] {
        sd.insert(format!("{i}.weight"), Tensor::zeros([1], ()).unwrap());
    }
    sd.insert("10.weight".into(), Tensor::ones([1], ()).unwrap());
    let keys: Vec<&String> = sd.keys().collect();
    assert_eq!(keys, ["2.weight", "10.weight", "1.weight"]);
    assert_eq!(sd["10.weight"].to_vec::<f32>().unwrap(), [1.0]);
    assert_eq!(sd.len(), 3);
}

#[test]
#[allow(clippy::needless_borrows_for_generic_args)] // `to(&device)` is what is tested
fn to_moves_a_derived_model_by_value_by_reference_and_with_a_dtype() {
    let _rng = rng_lock();
    for d in devices() {
        let net = my_net(Device::Cpu);
        let held = net.parameters();
        net.to(d).unwrap();
        for (n, t) in net.state_dict().unwrap() {
            assert_eq!(t.device(), d, "{n}");
        }
        assert!(held.iter().all(|p| p.device() == d), "moved in place");
        assert!(net.decoder.weight.same(&net.embed.weight));
        // The skipped layer stays where it was, as an unregistered attribute does.
        assert_eq!(net.scratch.weight.device(), Device::Cpu);
        net.to(&Device::Cpu).unwrap();
        assert_eq!(held[0].device(), Device::Cpu);
        net.to((d, DType::F64)).unwrap();
        assert!(
            held.iter()
                .all(|p| p.device() == d && p.dtype() == DType::F64)
        );
        let steps = &net.named_buffers()[3];
        assert_eq!(steps.0, "head.1.num_batches_tracked");
        assert_eq!(
            steps.1.dtype(),
            DType::I64,
            "integer buffers keep their dtype"
        );
        let idx = Tensor::from_vec(vec![1i64, 2, 3], [3], &d).unwrap();
        let y = net.call(&idx).unwrap();
        assert_eq!((y.dims(), y.device()), (vec![3, 10], d));
        // Boxed and as a bare trait object.
        let boxed: Box<dyn Module> = Box::new(Linear::new(2, 2, ()).unwrap());
        boxed.to(d).unwrap();
        assert_eq!(boxed.parameters()[0].device(), d);
        let dynamic: &dyn Module = &net;
        dynamic.to_target(&Device::Cpu).unwrap();
        assert!(held.iter().all(|p| p.device() == Device::Cpu));
    }
}

#[test]
fn hooks_replace_input_and_output_run_in_order_and_come_off() {
    let _rng = rng_lock();
    for d in devices() {
        let fc = Linear::new(2, 2, (d, DType::F64)).unwrap();
        {
            let _g = ember_autograd::no_grad();
            fc.weight
                .data()
                .copy_(&ember_tensor::Tensor::eye(2, (d, DType::F64)).unwrap())
                .unwrap();
            fc.bias.as_ref().unwrap().data().zero_().unwrap();
        }
        let x = Tensor::from_vec(vec![1.0f64, -2.0], [1, 2], d).unwrap();
        let log = Arc::new(Mutex::new(Vec::<String>::new()));
        let l = log.clone();
        let pre = fc
            .register_forward_pre_hook(Box::new(move |m, x| {
                l.lock().unwrap().push(format!("pre {}", m.name()));
                Ok(Some(x.mul(10.0)?)) // replaces the input
            }))
            .unwrap();
        let l = log.clone();
        let first = fc
            .register_forward_hook(Box::new(move |_, x, y| {
                // Sees the input the pre-hook left.
                l.lock()
                    .unwrap()
                    .push(format!("hook1 {:?}", x.to_vec::<f64>()?));
                Ok(Some(y.add(1.0)?))
            }))
            .unwrap();
        let l = log.clone();
        let _second = fc
            .register_forward_hook(Box::new(move |_, _, y| {
                l.lock()
                    .unwrap()
                    .push(format!("hook2 {:?}", y.to_vec::<f64>()?));
                Ok(None) // keeps the output
            }))
            .unwrap();
        assert_eq!(fc.hooks().unwrap().forward_hooks(), 2);
        let y = fc.call(&x).unwrap().to_vec::<f64>().unwrap();
        assert_eq!(y, [11.0, -19.0]);
        assert_eq!(
            *log.lock().unwrap(),
            ["pre Linear", "hook1 [10.0, -20.0]", "hook2 [11.0, -19.0]"]
        );
        // `forward` skips hooks, as in PyTorch.
        assert_eq!(
            fc.forward(&x).unwrap().to_vec::<f64>().unwrap(),
            [1.0, -2.0]
        );
        pre.remove();
        first.remove();
        first.remove(); // removing twice does nothing
        assert_eq!(fc.call(&x).unwrap().to_vec::<f64>().unwrap(), [1.0, -2.0]);
        assert_eq!(fc.hooks().unwrap().forward_pre_hooks(), 0);
        assert_eq!(fc.hooks().unwrap().forward_hooks(), 1);
    }
}

#[test]
fn hooks_on_children_run_inside_containers_and_derived_models() {
    let _rng = rng_lock();
    let net = my_net(Device::Cpu);
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    // The usual pattern: a hook on every module, named from `named_modules()`.
    for (name, m) in net.named_modules() {
        if m.hooks().is_none() {
            continue; // `Block` and the `ModuleList` keep no hooks
        }
        let s = seen.clone();
        m.register_forward_hook(Box::new(move |_, _, y| {
            s.lock().unwrap().push(format!("{name} {:?}", y.dims()));
            Ok(None)
        }))
        .unwrap();
    }
    let idx = Tensor::from_vec(vec![1i64, 2], [2], Device::Cpu).unwrap();
    net.call(&idx).unwrap();
    let seen = seen.lock().unwrap().clone();
    // Hooks run as each call returns: children before the module that called them. The
    // shared Linear is one module with one set of hooks, called twice.
    assert_eq!(
        seen,
        [
            "embed [2, 4]",
            "blocks.0.fc [2, 4]",
            "blocks.0.norm [2, 4]",
            "blocks.0.act [2, 4]",
            "blocks.1.fc [2, 4]",
            "blocks.1.act [2, 4]",
            "head.0 [2, 4]",
            "head.1 [2, 4]",
            "head.2 [2, 4]",
            "head [2, 4]",
            "shared_a [2, 4]",
            "shared_a [2, 4]",
            "decoder [2, 10]",
            " [2, 10]",
        ]
    );
}

#[test]
fn a_module_without_hook_storage_refuses_hooks() {
    let _rng = rng_lock();
    let block = Block {
        fc: Linear::new(2, 2, ()).unwrap(),
        norm: None,
        act: ReLU::new(),
    };
    let e = block
        .register_forward_hook(Box::new(|_, _, _| Ok(None)))
        .unwrap_err();
    assert!(
        matches!(e.downcast_ref::<NnError>(), Some(NnError::Invalid { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("Block keeps no hooks"), "{e}");
    // Without its own flag, a module reports its children's mode.
    block.eval();
    assert!(!block.is_training());
}

#[test]
fn requires_grad_freezes_and_apply_reaches_every_module() {
    let _rng = rng_lock();
    let net = my_net(Device::Cpu);
    net.blocks[0].requires_grad_(false).unwrap();
    let frozen: Vec<String> = net
        .named_parameters()
        .into_iter()
        .filter(|(_, p)| !p.requires_grad())
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        frozen,
        [
            "blocks.0.fc.weight",
            "blocks.0.fc.bias",
            "blocks.0.norm.weight",
            "blocks.0.norm.bias"
        ]
    );
    net.requires_grad_(true).unwrap();
    assert!(net.parameters().iter().all(Tensor::requires_grad));
    // `apply` as `model.apply(init_weights)`: zero every Linear's bias.
    net.apply(&mut |m| {
        if m.name() == "Linear" {
            for (n, p) in m.local_parameters() {
                if n == "bias" {
                    let _g = ember_autograd::no_grad();
                    p.data().zero_().unwrap();
                }
            }
        }
    });
    for (n, p) in net.named_parameters() {
        if n.ends_with("bias") && !n.contains("norm") && !n.starts_with("head.1") {
            assert!(p.to_vec::<f32>().unwrap().iter().all(|v| *v == 0.0), "{n}");
        }
    }
}

// ---- generics, tuple structs, unit structs ----

#[derive(Debug, Module)]
struct Residual<M: Module> {
    inner: M,
    #[param]
    gate: Option<Tensor>,
}

impl<M: Module> Module for Residual<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.add(&self.inner.call(x)?)
    }
}

#[derive(Debug, Module)]
struct Pair(Linear, #[module(skip)] f64, Linear);

impl Module for Pair {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.2.call(&self.0.call(x)?)?.mul(self.1)
    }
}

#[derive(Debug, Module)]
struct Identity;

impl Module for Identity {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }
}

#[test]
fn generic_tuple_and_unit_structs_derive() {
    let _rng = rng_lock();
    let r = Residual {
        inner: Pair(
            Linear::new(3, 3, ()).unwrap(),
            0.5,
            Linear::new(3, 3, ()).unwrap(),
        ),
        gate: None,
    };
    assert_eq!(r.name(), "Residual");
    assert_eq!(
        names(r.named_parameters()),
        [
            "inner.0.weight",
            "inner.0.bias",
            "inner.2.weight",
            "inner.2.bias"
        ]
    );
    assert_eq!(
        r.call(&Tensor::ones([2, 3], ()).unwrap()).unwrap().dims(),
        [2, 3]
    );
    let two = Sequential::new().add(Identity).add(Identity);
    // Zero-sized modules are never taken for one another.
    assert_eq!(two.named_modules().len(), 3);
    assert_eq!(
        two.describe(),
        "Sequential(\n  (0): Identity()\n  (1): Identity()\n)"
    );
}

// ---- BatchNorm's options against reference/batchnorm_options.py (PyTorch 2.15.0) ----

/// `x[i] = ((37 i + 11 k) % 17) / 4 - 2`, as the script makes batch `k`.
fn batch(k: usize, shape: &[usize], d: Device) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| ((37 * i + 11 * k) % 17) as f64 / 4.0 - 2.0)
        .collect();
    Tensor::from_vec(v, shape, d).unwrap()
}

fn close(got: &Tensor, want: &[f64], what: &str) {
    let got = got.to_vec::<f64>().unwrap();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-12 * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs PyTorch {w}"
        );
    }
}

#[test]
fn batch_norm_momentum_none_keeps_a_cumulative_average() {
    let _rng = rng_lock();
    for d in devices() {
        let config = BatchNormConfig {
            momentum: None,
            ..BatchNormConfig::default()
        };
        let bn = BatchNorm1d::with_config(3, config, (d, DType::F64)).unwrap();
        let mut y = None;
        for k in 0..3 {
            y = Some(bn.call(&batch(k, &[4, 3], d)).unwrap());
        }
        close(
            &y.unwrap(),
            &[
                -1.104310951250723,
                0.8682388677282473,
                0.8682388677282473,
                0.8834487610005785,
                -1.1163071156506037,
                -1.1163071156506037,
                -0.8834487610005785,
                1.1163071156506037,
                1.1163071156506037,
                1.104310951250723,
                -0.8682388677282473,
                -0.8682388677282473,
            ],
            "train output",
        );
        close(
            bn.running_mean.as_ref().unwrap(),
            &[
                -0.12500000000000003,
                -0.08333333333333326,
                -0.041666666666666664,
            ],
            "running_mean",
        );
        close(
            bn.running_var.as_ref().unwrap(),
            &[1.590277777777778, 1.4722222222222223, 1.590277777777778],
            "running_var",
        );
        let nbt = bn.num_batches_tracked.as_ref().unwrap();
        assert_eq!(nbt.item::<i64>().unwrap(), 3);
        bn.eval();
        close(
            &bn.call(&batch(3, &[4, 3], d)).unwrap(),
            &[
                1.6850821330939787,
                -1.167560828269664,
                -0.5616940443646596,
                0.0991224784172929,
                0.6868004872174494,
                1.222510567146612,
                -1.486837176259393,
                -0.9615206821044291,
                -0.3634490875300739,
                0.29736743525187864,
                0.8928406333826842,
                1.4207555239811978,
            ],
            "eval output",
        );
        assert_eq!(
            bn.describe(),
            "BatchNorm1d(3, eps=1e-05, momentum=None, affine=True, bias=True, track_running_stats=True)"
        );
    }
}

#[test]
fn batch_norm_without_running_stats_uses_the_batch_in_eval_too() {
    let _rng = rng_lock();
    const OUT: [f64; 16] = [
        -0.14583344915128538,
        0.17083331016974293,
        0.48750006949077124,
        0.8041668288117996,
        1.9927012481763489,
        -4.101526748110034,
        -2.7956207489058094,
        -1.4897147497015844,
        0.593055655931114,
        0.9097224152521424,
        -0.5680557949126565,
        -0.2513890355916282,
        -2.3603187491710678,
        -1.0544127499668428,
        0.25149324923738225,
        1.5573992484416073,
    ];
    for d in devices() {
        let config = BatchNormConfig {
            track_running_stats: false,
            ..BatchNormConfig::default()
        };
        let bn = BatchNorm2d::with_config(2, config, (d, DType::F64)).unwrap();
        {
            let _g = ember_autograd::no_grad();
            let w = ember_tensor::Tensor::from_vec(vec![0.5f64, 2.0], [2], d).unwrap();
            let b = ember_tensor::Tensor::from_vec(vec![0.25f64, -1.0], [2], d).unwrap();
            bn.weight.as_ref().unwrap().data().copy_(&w).unwrap();
            bn.bias.as_ref().unwrap().data().copy_(&b).unwrap();
        }
        let x = batch(5, &[2, 2, 2, 2], d);
        close(&bn.call(&x).unwrap(), &OUT, "train output");
        bn.eval();
        close(&bn.call(&x).unwrap(), &OUT, "eval output");
        let keys: Vec<String> = bn.state_dict().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["weight", "bias"]);
        assert!(bn.buffers().is_empty());
        assert_eq!(
            bn.describe(),
            "BatchNorm2d(2, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=False)"
        );
        // Eval with batch statistics still needs more than one value per channel.
        let one = batch(0, &[1, 2, 1, 1], d);
        assert!(bn.call(&one).is_err());
    }
    let config = BatchNormConfig {
        affine: false,
        ..BatchNormConfig::default()
    };
    let bn = BatchNorm1d::with_config(3, config, ()).unwrap();
    assert_eq!(bn.parameters().len(), 0);
    let keys: Vec<String> = bn.state_dict().unwrap().keys().cloned().collect();
    assert_eq!(keys, ["running_mean", "running_var", "num_batches_tracked"]);
    assert_eq!(
        bn.describe(),
        "BatchNorm1d(3, eps=1e-05, momentum=0.1, affine=False, bias=False, track_running_stats=True)"
    );
}
