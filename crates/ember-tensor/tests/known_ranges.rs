#![allow(clippy::unwrap_used)]
//! Note [Known index ranges] (`crates/ember-tensor/src/cuda/nn.rs`): an index tensor whose
//! values the host knows — uploaded from host memory, made by `randint`, max-pool indices —
//! lets the indexing kernels skip reading their error slot back, so the host does not wait
//! for the device (the emulator counts such waits per thread: `thread_host_waits`); every
//! other index tensor, and one written in place after it was made, is still checked at the
//! same call, with the CPU's error. Results are compared with the CPU's.

mod common_cuda;

use common_cuda::{CPU, GPU, assert_matches, setup};
use ember_device::driver::emulator::thread_host_waits;
use ember_tensor::{CrossEntropyOptions, DType, MaxPool2dOptions, NllLossOptions, Tensor};

/// `f`'s result and how many times it made this thread's host wait for the device. Only the
/// emulator counts: `None` on a real GPU (`cargo xtask gpu-test`).
fn waits_in<R>(f: impl FnOnce() -> R) -> (R, Option<u64>) {
    let total = || thread_host_waits().values().sum::<u64>();
    let before = total();
    let r = f();
    let n = total() - before;
    (r, ember_device::cuda::is_emulated().then_some(n))
}

/// Scores `[6, 5]` on `d`, the same values on every device.
fn scores(d: ember_tensor::Device) -> Tensor {
    let v: Vec<f32> = (0..30).map(|i| ((i * 7) % 11) as f32 * 0.3 - 1.0).collect();
    Tensor::from_slice(&v, [6, 5], d).unwrap()
}

const TARGETS: [i64; 6] = [0, 4, 2, 1, 3, 0];

#[test]
fn uploaded_indices_need_no_read_back() {
    setup();
    let opts = CrossEntropyOptions::new();
    let cpu = scores(CPU).cross_entropy(&Tensor::from_slice(&TARGETS, [6], CPU).unwrap(), &opts);
    let x = scores(GPU);
    // i64 and i32 targets, and a view of an uploaded storage (its elements are some of the
    // storage's, inside the storage's range).
    let t64 = Tensor::from_slice(&TARGETS, [6], GPU).unwrap();
    let t32 = Tensor::from_slice(&TARGETS.map(|v| v as i32), [6], GPU).unwrap();
    let wide = Tensor::from_slice(&[9i64, 0, 4, 2, 1, 3, 0], [7], CPU)
        .unwrap()
        .to_device(GPU)
        .unwrap();
    for (what, t) in [
        ("i64", t64.clone()),
        ("i32", t32),
        ("view", wide.narrow(0, 1, 6).unwrap()),
    ] {
        if what == "view" {
            // The storage holds a 9, which is no class: its range proves nothing.
            let (r, w) = waits_in(|| x.cross_entropy(&t, &opts).unwrap());
            assert_matches("cross_entropy over a view", cpu.as_ref().unwrap(), &r);
            assert!(
                w.is_none_or(|w| w > 0),
                "the view's storage range includes 9"
            );
            continue;
        }
        let (r, w) = waits_in(|| x.cross_entropy(&t, &opts).unwrap());
        assert_matches(&format!("cross_entropy {what}"), cpu.as_ref().unwrap(), &r);
        assert!(
            w.is_none_or(|w| w == 0),
            "cross_entropy {what}: {w:?} waits"
        );
    }
    // The unfused path (log_softmax then nll_loss), index_select and gather.
    let nll = NllLossOptions::new();
    let (r, w) = waits_in(|| x.log_softmax(1).unwrap().nll_loss(&t64, &nll).unwrap());
    let c = scores(CPU)
        .log_softmax(1)
        .unwrap()
        .nll_loss(&t64.to_device(CPU).unwrap(), &nll)
        .unwrap();
    assert_matches("nll_loss", &c, &r);
    assert!(w.is_none_or(|w| w == 0), "nll_loss: {w:?} waits");
    let rows = Tensor::from_slice(&[5i64, 0, 5, 2], [4], GPU).unwrap();
    let (r, w) = waits_in(|| x.index_select(0, &rows).unwrap());
    let c = scores(CPU)
        .index_select(0, &rows.to_device(CPU).unwrap())
        .unwrap();
    assert_matches("index_select", &c, &r);
    assert!(w.is_none_or(|w| w == 0), "index_select: {w:?} waits");
    let cols = Tensor::from_slice(&TARGETS, [6, 1], GPU).unwrap();
    let (r, w) = waits_in(|| x.gather(1, &cols).unwrap());
    let c = scores(CPU)
        .gather(1, &cols.to_device(CPU).unwrap())
        .unwrap();
    assert_matches("gather", &c, &r);
    assert!(w.is_none_or(|w| w == 0), "gather: {w:?} waits");
}

#[test]
fn randint_and_max_pool_indices_need_no_read_back() {
    setup();
    let x = scores(GPU);
    let t = Tensor::randint(0, 5, [6], (GPU, DType::I64)).unwrap();
    let opts = CrossEntropyOptions::new();
    let (r, w) = waits_in(|| x.cross_entropy(&t, &opts).unwrap());
    let c = scores(CPU)
        .cross_entropy(&t.to_device(CPU).unwrap(), &opts)
        .unwrap();
    assert_matches("cross_entropy of randint targets", &c, &r);
    assert!(w.is_none_or(|w| w == 0), "randint targets: {w:?} waits");
    // Max-pool indices scattered back into the planes (the pool's backward).
    let img = Tensor::randn([2, 3, 6, 6], GPU).unwrap();
    let (y, idx) = img
        .max_pool2d_with_indices(&MaxPool2dOptions::new(2))
        .unwrap();
    let (g, i) = (y.reshape([6, 9]).unwrap(), idx.reshape([6, 9]).unwrap());
    let (r, w) = waits_in(|| {
        Tensor::zeros([6, 36], GPU)
            .unwrap()
            .scatter_add(1, &i, &g)
            .unwrap()
    });
    let c = Tensor::zeros([6, 36], CPU)
        .unwrap()
        .scatter_add(1, &i.to_device(CPU).unwrap(), &g.to_device(CPU).unwrap())
        .unwrap();
    assert_matches("scatter_add of max-pool indices", &c, &r);
    assert!(w.is_none_or(|w| w == 0), "max-pool indices: {w:?} waits");
}

/// The CPU's and the CUDA backend's errors for the same call, as text.
fn same_error(what: &str, cpu: ember_tensor::Result<Tensor>, gpu: ember_tensor::Result<Tensor>) {
    let c = cpu.expect_err(&format!("{what}: the CPU accepted it"));
    let g = gpu.expect_err(&format!("{what}: CUDA accepted it"));
    assert_eq!(c.to_string(), g.to_string(), "{what}");
}

#[test]
fn indices_the_host_cannot_vouch_for_are_still_checked() {
    setup();
    let opts = CrossEntropyOptions::new();
    let ce = |d, t: &[i64]| scores(d).cross_entropy(&Tensor::from_slice(t, [6], d)?, &opts);
    // Uploaded, but with a class out of range: the range proves nothing, the kernel finds it.
    let bad = [0, 4, 2, 5, 3, 0];
    let (g, w) = waits_in(|| ce(GPU, &bad));
    same_error("an uploaded bad target", ce(CPU, &bad), g);
    assert!(w.is_none_or(|w| w > 0), "a bad target is read back");
    // Written in place after the upload: the write forgets the range, also through a view.
    let x = scores(GPU);
    let t = Tensor::from_slice(&TARGETS, [6], GPU).unwrap();
    t.narrow(0, 3, 1).unwrap().add_(10i64).unwrap();
    let host = t.to_device(CPU).unwrap();
    same_error(
        "a target written in place",
        scores(CPU).cross_entropy(&host, &opts),
        x.cross_entropy(&t, &opts),
    );
    let t = Tensor::randint(0, 5, [6], (GPU, DType::I64)).unwrap();
    t.fill_(7i64).unwrap();
    same_error(
        "randint targets filled in place",
        scores(CPU).cross_entropy(&t.to_device(CPU).unwrap(), &opts),
        x.cross_entropy(&t, &opts),
    );
    // Computed on the device: a fresh storage without a range.
    let shifted = Tensor::from_slice(&TARGETS, [6], GPU)
        .unwrap()
        .add(&Tensor::from_slice(&[0i64, 0, 0, 0, 5, 0], [6], GPU).unwrap())
        .unwrap();
    let (g, w) = waits_in(|| x.cross_entropy(&shifted, &opts));
    same_error(
        "a target computed on the device",
        scores(CPU).cross_entropy(&shifted.to_device(CPU).unwrap(), &opts),
        g,
    );
    assert!(w.is_none_or(|w| w > 0), "a computed target is read back");
    let rows = Tensor::from_slice(&[1i64, -1], [2], GPU).unwrap();
    same_error(
        "index_select of a negative index",
        scores(CPU).index_select(0, &rows.to_device(CPU).unwrap()),
        x.index_select(0, &rows),
    );
}

#[test]
fn ignore_index_targets() {
    setup();
    let opts = CrossEntropyOptions::new();
    let x = scores(GPU);
    // Only ignored rows: proven (the range is exactly ignore_index); the mean is NaN (0/0),
    // as PyTorch's.
    let all = Tensor::full([6], -100i64, CPU)
        .unwrap()
        .to_device(GPU)
        .unwrap();
    let (r, w) = waits_in(|| x.cross_entropy(&all, &opts).unwrap());
    assert!(r.item::<f32>().unwrap().is_nan());
    assert!(
        w.is_none_or(|w| w == 0),
        "only ignored targets: {w:?} waits"
    );
    // Some ignored: the range [-100, 4] does not prove the rest, so they are checked.
    let some = [0i64, -100, 2, 1, -100, 4];
    let t = Tensor::from_slice(&some, [6], GPU).unwrap();
    let (r, w) = waits_in(|| x.cross_entropy(&t, &opts).unwrap());
    let c = scores(CPU)
        .cross_entropy(&Tensor::from_slice(&some, [6], CPU).unwrap(), &opts)
        .unwrap();
    assert_matches("cross_entropy with ignored rows", &c, &r);
    assert!(w.is_none_or(|w| w > 0), "mixed targets are read back");
}

#[test]
fn scalar_operands_are_filled_on_the_device() {
    setup();
    let x = scores(GPU);
    let (r, w) = waits_in(|| {
        let y = x.mul(2.0).unwrap();
        y.add_(1.0).unwrap();
        y
    });
    let c = scores(CPU).mul(2.0).unwrap().add(1.0).unwrap();
    assert_matches("x * 2 + 1", &c, &r);
    assert!(w.is_none_or(|w| w == 0), "scalar operands: {w:?} waits");
}
