#![allow(clippy::unwrap_used)]
//! PyTorch's spellings where a new user reaches for them (issue 45): one checkpoint of a
//! nested state (`torch.save` of a dict), one `StateDict` type for modules, optimizers and
//! schedulers, `BatchNorm1d`/`2d`/`3d` as types, `Conv2d` and the pools with builder
//! options, `print(model)`, `random_split`/`Subset`/`ConcatDataset`, and `manual_seed`
//! fixing the split and the loader's shuffle. On `cpu` and the emulated `cuda:0`.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ember_nn::data::{ConcatDataset, DataLoader, Dataset, Subset, TensorDataset, random_split};
use ember_nn::layers::{
    AvgPool2d, BatchNorm1d, BatchNorm2d, BatchNorm3d, Conv2d, Conv2dConfig, Linear, MaxPool2d,
    Padding, ReLU, Sequential,
};
use ember_nn::optim::{Adam, AdamOptions, LrScheduler, OneCycleLR, OneCycleLrOptions, Optimizer};
use ember_nn::{Module, ModuleParts, StateDict, Tensor, Value, io};
use ember_tensor::random::manual_seed;
use ember_tensor::{Conv2dOptions, DType, Device, MaxPool2dOptions};
use ember_testing::{assert_close, test_device, values};

/// Seeds are process-wide: the tests that seed and draw take turns.
static RNG: Mutex<()> = Mutex::new(());

fn rng_lock() -> MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(PoisonError::into_inner)
}

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("ember-surface-{}-{name}", std::process::id()))
}

#[derive(Debug, Module)]
struct Net {
    fc1: Linear,
    act: ReLU,
    fc2: Linear,
}

impl Module for Net {
    fn forward(&self, x: &Tensor) -> ember_nn::Result<Tensor> {
        self.fc2.call(&self.act.call(&self.fc1.call(x)?)?)
    }
}

fn net(device: &Device) -> Net {
    Net {
        fc1: Linear::new(4, 8, device).unwrap(),
        act: ReLU::new(),
        fc2: Linear::new(8, 3, device).unwrap(),
    }
}

/// A few Adam steps under OneCycleLR, so the optimizer and the scheduler have state.
fn trained(device: &Device) -> (Net, Adam, OneCycleLR) {
    let model = net(device);
    let mut opt = Adam::new(model.parameters(), AdamOptions::default()).unwrap();
    let mut sched = OneCycleLR::new(&mut opt, 0.01, 10, OneCycleLrOptions::default()).unwrap();
    for _ in 0..3 {
        opt.zero_grad(true).unwrap();
        let x = Tensor::randn([5, 4], device).unwrap();
        model
            .call(&x)
            .unwrap()
            .square()
            .unwrap()
            .mean_all()
            .unwrap()
            .backward()
            .unwrap();
        opt.step().unwrap();
        sched.step(&mut opt).unwrap();
    }
    (model, opt, sched)
}

/// `torch.save({"model", "optimizer", "scheduler", "epoch", "config"})` and back into fresh
/// objects: every tensor equal, every value of its type, the next step identical.
fn checkpoint_of_everything(device: &Device) {
    let _g = rng_lock();
    manual_seed(3);
    let (model, mut opt, mut sched) = trained(device);
    let state = StateDict::new()
        .with("model", model.state_dict().unwrap())
        .with("optimizer", opt.state_dict().unwrap())
        .with("scheduler", sched.state_dict().unwrap())
        .with("epoch", 7usize)
        .with("best", 0.25)
        .with("config.arch", "mlp")
        .with("config.amp", false)
        .with("seed", u64::MAX);
    // Keys as PyTorch names them.
    assert!(state.contains_key("model.fc1.weight"), "{state:?}");
    assert!(state.contains_key("optimizer.state.0.exp_avg"), "{state:?}");
    assert!(
        state.contains_key("optimizer.param_groups.0.lr"),
        "{state:?}"
    );
    assert!(state.contains_key("scheduler.last_epoch"), "{state:?}");
    let path = tmp(&format!("all-{device}.safetensors"));
    io::save(&state, &path).unwrap();

    let back = io::load(&path, device).unwrap();
    assert_eq!(back.item::<usize>("epoch").unwrap(), 7);
    assert_eq!(back.item::<f64>("best").unwrap(), 0.25);
    assert_eq!(back.item::<String>("config.arch").unwrap(), "mlp");
    assert!(!back.item::<bool>("config.amp").unwrap());
    assert_eq!(back.item::<u64>("seed").unwrap(), u64::MAX);
    assert_eq!(back.value("epoch"), Some(&Value::Int(7)));
    for (k, t) in &state {
        let l = back.get(k).unwrap();
        assert_eq!((l.dtype(), l.dims()), (t.dtype(), t.dims()), "{k}");
        assert_eq!(values(&l.data()), values(&t.data()), "{k}");
    }

    let model2 = net(device);
    let mut opt2 = Adam::new(model2.parameters(), AdamOptions::default()).unwrap();
    let mut sched2 = OneCycleLR::new(&mut opt2, 0.01, 10, OneCycleLrOptions::default()).unwrap();
    model2.load_state_dict(&back.sub("model")).unwrap();
    opt2.load_state_dict(&back.sub("optimizer")).unwrap();
    sched2.load_state_dict(&back.sub("scheduler")).unwrap();
    assert_eq!(sched2.get_last_lr(), sched.get_last_lr());
    // The same next step from both.
    let x = Tensor::randn([5, 4], device).unwrap();
    for (m, o, s) in [
        (
            &model,
            &mut opt as &mut dyn Optimizer,
            &mut sched as &mut dyn LrScheduler,
        ),
        (&model2, &mut opt2, &mut sched2),
    ] {
        o.zero_grad(true).unwrap();
        m.call(&x)
            .unwrap()
            .square()
            .unwrap()
            .mean_all()
            .unwrap()
            .backward()
            .unwrap();
        o.step().unwrap();
        s.step(o).unwrap();
    }
    assert_eq!(
        values(&model.fc1.weight.data()),
        values(&model2.fc1.weight.data())
    );
    // A module refuses the plain values and the other prefixes it does not have.
    let e = model2.load_state_dict(&back).unwrap_err().to_string();
    assert!(
        e.contains("Unexpected key(s)") && e.contains("\"epoch\""),
        "{e}"
    );
    std::fs::remove_file(&path).unwrap();
}
test_device!(checkpoint_of_everything, checkpoint_of_everything);

#[test]
fn reserved_and_wrong_typed_values_are_errors() {
    let path = tmp("reserved.safetensors");
    let e = io::save(&StateDict::new().with("ember.checksum", "x"), &path)
        .unwrap_err()
        .to_string();
    assert!(e.contains("reserved"), "{e}");
    let d = StateDict::new()
        .with("epoch", -1)
        .with("w", Tensor::zeros([2], ()).unwrap());
    let e = d.item::<usize>("epoch").unwrap_err().to_string();
    assert!(
        e.contains("\"epoch\": expected an integer of type usize, found an integer (-1)"),
        "{e}"
    );
    let e = d.item::<f64>("w").unwrap_err().to_string();
    assert!(
        e.contains("expected one value, found a tensor of shape [2]"),
        "{e}"
    );
    // A tensor and a value never share a key: the last one set wins.
    let d = d.with("w", 3);
    assert_eq!(
        (d.get("w").is_none(), d.item::<i32>("w").unwrap()),
        (true, 3)
    );
    // Nesting and taking back out.
    let inner = StateDict::new()
        .with("a", 1)
        .with("b.c", Tensor::ones([1], ()).unwrap());
    let outer = StateDict::new().with("x", inner).with("xy", 2);
    let keys: Vec<&String> = outer.plain().map(|(k, _)| k).collect();
    assert_eq!(keys, ["x.a", "xy"]);
    assert!(outer.contains_key("x.b.c"));
    let back = outer.sub("x");
    assert_eq!((back.len(), back.item::<i64>("a").unwrap()), (2, 1));
    assert!(back.contains_key("b.c") && !back.contains_key("xy"));
    assert!(outer.sub("nothing").is_empty());
}

/// Adam's `exp_avg` of the wrong shape is reported once, as a size mismatch (not also as
/// missing).
#[test]
fn a_misshapen_optimizer_state_is_only_a_size_mismatch() {
    let _g = rng_lock();
    let (_, opt, _) = trained(&Device::Cpu);
    let mut sd = opt.state_dict().unwrap();
    sd.insert("state.0.exp_avg".into(), Tensor::zeros([2, 2], ()).unwrap());
    let mut fresh = Adam::new(net(&Device::Cpu).parameters(), AdamOptions::default()).unwrap();
    let e = fresh.load_state_dict(&sd).unwrap_err().to_string();
    assert!(e.contains("size mismatch for state.0.exp_avg"), "{e}");
    assert!(!e.contains("Missing key(s)"), "{e}");
    // A plain value has no place there.
    let e = fresh
        .load_state_dict(&opt.state_dict().unwrap().with("epoch", 1))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Unexpected key(s)") && e.contains("\"epoch\""),
        "{e}"
    );
}

/// BatchNorm3d equals BatchNorm2d over the input with its depth folded into its height
/// (both normalise each channel over every other dimension); each refuses another rank
/// with an error naming the layer.
fn batch_norm_types(device: &Device) {
    let _g = rng_lock();
    let x = Tensor::randn([2, 3, 4, 5, 6], device).unwrap();
    let bn3 = BatchNorm3d::new(3, device).unwrap();
    let bn2 = BatchNorm2d::new(3, device).unwrap();
    let y3 = bn3.call(&x).unwrap();
    let y2 = bn2.call(&x.reshape([2, 3, 20, 6]).unwrap()).unwrap();
    assert_close(&y3.data(), &y2.reshape([2, 3, 4, 5, 6]).unwrap().data());
    assert_close(
        &bn3.running_var.as_ref().unwrap().data(),
        &bn2.running_var.as_ref().unwrap().data(),
    );
    for (layer, bad, want) in [
        (
            &bn3 as &dyn Module,
            vec![2, 3, 4, 5],
            "BatchNorm3d: expected 5D input [N, C, D, H, W] (got 4D input",
        ),
        (
            &bn2,
            vec![2, 3],
            "BatchNorm2d: expected 4D input [N, C, H, W] (got 2D input",
        ),
        (
            &BatchNorm1d::new(3, device).unwrap(),
            vec![2, 3, 4, 5],
            "BatchNorm1d: expected 2D or 3D input [N, C] or [N, C, L] (got 4D input",
        ),
    ] {
        let e = layer
            .call(&Tensor::zeros(bad.as_slice(), device).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
    }
    let e = bn2
        .call(&Tensor::zeros([2, 4, 3, 3], device).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected input with 3 channels"), "{e}");
    assert_eq!(bn3.name(), "BatchNorm3d");
}
test_device!(batch_norm_types, batch_norm_types);

/// The builder gives what the functional conv gives with the same options; `groups` makes
/// the grouped weight; `"same"` keeps the size; a bad padding string is PyTorch's error.
fn conv_builder_matches_functional(device: &Device) {
    let _g = rng_lock();
    let x = Tensor::randn([2, 4, 9, 9], device).unwrap();
    let conv = Conv2d::new(4, 6, (3, 5), device)
        .unwrap()
        .stride(2)
        .padding((1, 2))
        .dilation((2, 1))
        .groups(2)
        .unwrap()
        .bias(false);
    assert_eq!(conv.weight.dims(), [6, 2, 3, 5]);
    assert!(conv.bias.is_none() && conv.parameters().len() == 1);
    let opts = Conv2dOptions::new()
        .stride(2)
        .padding((1, 2))
        .dilation((2, 1))
        .groups(2);
    let want = x.conv2d(&conv.weight, None, &opts).unwrap();
    assert_close(&conv.call(&x).unwrap().data(), &want.data());
    assert_eq!(
        conv.to_string(),
        "Conv2d(4, 6, kernel_size=(3, 5), stride=(2, 2), padding=(1, 2), dilation=(2, 1), groups=2, bias=False)"
    );
    // The same through the config struct, `padding: 1` converting.
    let cfg = Conv2d::with_config(
        4,
        6,
        3,
        Conv2dConfig {
            padding: 1.into(),
            ..Default::default()
        },
        device,
    )
    .unwrap();
    assert_eq!(cfg.call(&x).unwrap().dims(), [2, 6, 9, 9]);
    let same = Conv2d::new(4, 6, (3, 4), device).unwrap().padding("same");
    assert_eq!(same.call(&x).unwrap().dims(), [2, 6, 9, 9]);
    assert!(same.to_string().contains("padding=same"), "{same}");
    let valid = Conv2d::new(4, 6, 3, device)
        .unwrap()
        .padding(Padding::Valid);
    assert_eq!(valid.call(&x).unwrap().dims(), [2, 6, 7, 7]);
    let bad = Conv2d::new(4, 6, 3, device).unwrap().padding("sme");
    let e = bad.call(&x).unwrap_err().to_string();
    assert!(
        e.contains("Invalid padding string 'sme', should be one of {'valid', 'same'}"),
        "{e}"
    );
    let e = Conv2d::new(4, 6, 3, device)
        .unwrap()
        .groups(4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("must be divisible by groups (4)"), "{e}");
    // The pools: builder options, the functional op's numbers.
    let pool = MaxPool2d::new(3).stride(2).padding(1);
    let want = x
        .max_pool2d(&MaxPool2dOptions::new(3).stride(2).padding(1))
        .unwrap();
    assert_close(&pool.call(&x).unwrap().data(), &want.data());
    let avg = AvgPool2d::new(2)
        .stride(1)
        .count_include_pad(false)
        .padding(1);
    assert_eq!(avg.call(&x).unwrap().dims(), [2, 4, 10, 10]);
}
test_device!(conv_builder, conv_builder_matches_functional);

#[test]
fn modules_print_as_pytorch_prints_them() {
    let model = net(&Device::Cpu);
    assert_eq!(
        model.to_string(),
        "Net(\n  (fc1): Linear(in_features=4, out_features=8, bias=True)\n  (act): ReLU()\n  (fc2): Linear(in_features=8, out_features=3, bias=True)\n)"
    );
    let seq = Sequential::new()
        .add(Conv2d::new(1, 2, 3, ()).unwrap().padding(1))
        .add(BatchNorm2d::new(2, ()).unwrap());
    assert_eq!(
        format!("{seq}"),
        "Sequential(\n  (0): Conv2d(1, 2, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))\n  (1): BatchNorm2d(2, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True)\n)"
    );
    let boxed: Box<dyn Module> = Box::new(ReLU::new());
    assert_eq!(boxed.to_string(), "ReLU()");
}

fn dataset(n: usize) -> Arc<dyn Dataset> {
    let x = Tensor::arange(0, n as i64, DType::F32)
        .unwrap()
        .reshape([n, 1])
        .unwrap();
    let y = Tensor::arange(0, n as i64, DType::I64).unwrap();
    Arc::new(TensorDataset::new(vec![x, y]).unwrap())
}

/// The ids (the `y` field) of a dataset's samples, one `get` at a time.
fn ids(d: &dyn Dataset) -> Vec<i64> {
    (0..d.len())
        .map(|i| d.get(i).unwrap()[1].item::<i64>().unwrap())
        .collect()
}

#[test]
fn random_split_covers_the_dataset_and_follows_the_seed() {
    let _g = rng_lock();
    let ds = dataset(10);
    // PyTorch's fractions rule: floor(10 * f) each, the remainder from the first split on.
    let lens = |l: &[f64]| -> Vec<usize> {
        random_split(ds.clone(), l)
            .unwrap()
            .iter()
            .map(Dataset::len)
            .collect()
    };
    assert_eq!(lens(&[0.8, 0.2]), [8, 2]);
    assert_eq!(lens(&[0.33, 0.33, 0.34]), [4, 3, 3]);
    let [a, b] = random_split(ds.clone(), [0.3, 0.7]).unwrap();
    assert_eq!((a.len(), b.len()), (3, 7));
    let parts = random_split(ds.clone(), vec![3usize, 7]).unwrap();
    let mut all: Vec<i64> = parts.iter().flat_map(|p| ids(p)).collect();
    all.sort_unstable();
    assert_eq!(all, (0..10).collect::<Vec<_>>());
    // A seed fixes the split; the split moves the generator on; another seed, another split.
    manual_seed(5);
    let a = random_split(ds.clone(), [5, 5]).unwrap()[0]
        .indices()
        .to_vec();
    let a2 = random_split(ds.clone(), [5, 5]).unwrap()[0]
        .indices()
        .to_vec();
    manual_seed(5);
    let b = random_split(ds.clone(), [5, 5]).unwrap()[0]
        .indices()
        .to_vec();
    manual_seed(6);
    let c = random_split(ds.clone(), [5, 5]).unwrap()[0]
        .indices()
        .to_vec();
    assert_eq!(a, b);
    assert_ne!(a, a2);
    assert_ne!(a, c);
    // Errors in PyTorch's words.
    let e = random_split(ds.clone(), [3, 3]).unwrap_err().to_string();
    assert!(
        e.contains("Sum of input lengths does not equal the length of the input dataset"),
        "{e}"
    );
    let e = random_split(ds.clone(), [1.5, -0.5])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Fraction at index 0 is not between 0 and 1"),
        "{e}"
    );
    // A subset batches through its dataset: get_batch equals the gets.
    let sub = Subset::new(ds.clone(), vec![9, 0, 4]).unwrap();
    assert_eq!(ids(&sub), [9, 0, 4]);
    let batch = sub.get_batch(&[2, 0]).unwrap();
    assert_eq!(batch[1].to_vec::<i64>().unwrap(), [4, 9]);
    assert!(Subset::new(ds.clone(), vec![10]).is_err());
    assert!(sub.get(3).is_err());
}

#[test]
fn concat_dataset_chains_and_batches_across() {
    let cat = ConcatDataset::new(vec![dataset(3), dataset(0), dataset(2)]).unwrap();
    assert_eq!(cat.len(), 5);
    assert_eq!(cat.cumulative_sizes(), [3, 3, 5]);
    assert_eq!(ids(&cat), [0, 1, 2, 0, 1]);
    let across = cat.get_batch(&[4, 0, 3]).unwrap();
    assert_eq!(across[1].to_vec::<i64>().unwrap(), [1, 0, 0]);
    assert_eq!(across[0].dims(), [3, 1]);
    let within = cat.get_batch(&[2, 1]).unwrap();
    assert_eq!(within[1].to_vec::<i64>().unwrap(), [2, 1]);
    let e = cat.get(5).unwrap_err().to_string();
    assert!(
        e.contains("index 5 is out of range for a dataset of length 5"),
        "{e}"
    );
    assert!(ConcatDataset::new(vec![]).is_err());
    // Through a loader, every sample once.
    let loader = DataLoader::new(Arc::new(cat)).batch_size(2).shuffle(true);
    let mut seen: Vec<i64> = loader
        .iter()
        .unwrap()
        .flat_map(|b| b.unwrap()[1].to_vec::<i64>().unwrap())
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, [0, 0, 1, 1, 2]);
}

#[test]
fn manual_seed_fixes_the_loaders_shuffle() {
    let _g = rng_lock();
    let order = |seed: u64| -> Vec<Vec<usize>> {
        manual_seed(seed);
        let loader = DataLoader::new(dataset(20)).batch_size(5).shuffle(true);
        (0..3)
            .map(|e| loader.batch_indices(e).unwrap().concat())
            .collect()
    };
    let a = order(11);
    assert_eq!(a, order(11));
    assert_ne!(a, order(12));
    // A new order each epoch.
    assert_ne!(a[0], a[1]);
}
