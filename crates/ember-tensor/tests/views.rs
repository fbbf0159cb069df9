#![allow(clippy::unwrap_used)]
//! Views share storage; layout transforms; cat/stack/chunk/split.

use ember_tensor::{DType, Device, Tensor, TensorError};

fn ar(n: i64) -> Tensor {
    Tensor::arange(0, n, ()).unwrap()
}

fn v(t: &Tensor) -> Vec<i64> {
    t.to_vec::<i64>().unwrap()
}

#[test]
fn views_share_storage_both_ways() {
    let t = ar(12).reshape([3, 4]).unwrap();
    let views = [
        t.t().unwrap(),
        t.narrow(1, 1, 2).unwrap(),
        t.slice(0, .., 2).unwrap(),
        t.select(0, -1).unwrap(),
        t.unsqueeze(0).unwrap(),
        t.view([2, 6]).unwrap(),
        t.permute([1, 0]).unwrap(),
        t.flatten_all().unwrap(),
    ];
    for view in &views {
        assert!(view.shares_storage(&t));
    }
    let before = t.version();
    t.select(0, 2)
        .unwrap()
        .select(0, 3)
        .unwrap()
        .fill_(100)
        .unwrap();
    assert!(t.version() > before);
    assert_eq!(
        views[0]
            .select(0, 3)
            .unwrap()
            .select(0, 2)
            .unwrap()
            .item::<i64>()
            .unwrap(),
        100
    );
    assert_eq!(v(&views[3]), vec![8, 9, 10, 100]);
    assert_eq!(views[7].select(0, 11).unwrap().item::<i64>().unwrap(), 100);
    // and writing through a view shows in the base
    views[1].zero_().unwrap();
    assert_eq!(v(&t.select(0, 0).unwrap()), vec![0, 0, 0, 3]);
    assert_eq!(views[1].version(), t.version());
}

#[test]
fn reshape_views_when_possible_and_copies_otherwise() {
    let t = ar(24).reshape([2, 3, 4]).unwrap();
    let p = t.transpose(1, 2).unwrap(); // [2, 4, 3]
    assert!(!p.is_contiguous());
    assert!(matches!(
        p.view([2, 12]).unwrap_err().downcast_ref::<TensorError>(),
        Some(TensorError::ViewStrides)
    ));
    let r = p.reshape([2, 12]).unwrap();
    assert!(!r.shares_storage(&t));
    assert_eq!(v(&r.select(0, 0).unwrap())[..4], [0, 4, 8, 1]);
    let ok = p.view([2, 4, 3, 1]).unwrap();
    assert!(ok.shares_storage(&t));
    assert_eq!(ok.strides(), &[12, 1, 4, 4]);
    assert_eq!(t.reshape([-1]).unwrap().dims(), &[24]);
    assert!(t.reshape([5, -1]).is_err());
    assert_eq!(
        t.view([7]).unwrap_err().to_string(),
        "view: shape [7] is invalid for input of size 24"
    );
    let s = Tensor::scalar(5i64, Device::Cpu).unwrap();
    assert_eq!(s.reshape([1, 1]).unwrap().dims(), &[1, 1]);
    assert_eq!(
        Tensor::zeros([0, 3], ())
            .unwrap()
            .reshape([3, 0, 5])
            .unwrap()
            .dims(),
        &[3, 0, 5]
    );
}

#[test]
fn permute_transpose_t() {
    let t = ar(24).reshape([2, 3, 4]).unwrap();
    let p = t.permute([2, 0, 1]).unwrap();
    assert_eq!(
        (p.dims(), p.strides()),
        (vec![4usize, 2, 3], vec![1usize, 12, 4])
    );
    assert_eq!(v(&p.contiguous().unwrap())[..6], [0, 4, 8, 12, 16, 20]);
    assert!(t.permute([0, 0, 1]).is_err());
    assert!(t.permute([0, 1]).is_err());
    assert_eq!(t.transpose(-1, 0).unwrap().dims(), &[4, 3, 2]);
    let e = t.transpose(3, 0).unwrap_err().to_string();
    assert_eq!(
        e,
        "transpose: dimension out of range (expected to be in range of [-3, 2], but got 3)"
    );
    assert!(t.t().is_err());
    assert_eq!(ar(3).t().unwrap().dims(), &[3]);
}

#[test]
fn narrow_slice_select() {
    let t = ar(10);
    assert_eq!(v(&t.narrow(0, 2, 3).unwrap()), vec![2, 3, 4]);
    assert!(t.narrow(0, 8, 3).is_err());
    assert_eq!(
        v(&t.slice_with(0, Some(1), Some(-1), 3).unwrap()),
        vec![1, 4, 7]
    );
    assert_eq!(v(&t.slice(0, -3.., 1).unwrap()), vec![7, 8, 9]);
    assert_eq!(v(&t.slice(0, ..=-2, 4).unwrap()), vec![0, 4, 8]);
    assert_eq!(t.slice_with(0, Some(5), Some(2), 1).unwrap().numel(), 0);
    assert_eq!(v(&t.slice(0, -100..100, 5).unwrap()), vec![0, 5]);
    assert!(t.slice(0, .., 0).is_err());
    let m = ar(6).reshape([2, 3]).unwrap();
    assert_eq!(v(&m.select(1, -1).unwrap()), vec![2, 5]);
    let e = m.select(0, 2).unwrap_err().to_string();
    assert_eq!(
        e,
        "select: index 2 is out of bounds for dimension 0 with size 2"
    );
    assert!(
        Tensor::scalar(1f32, Device::Cpu)
            .unwrap()
            .select(0, 0)
            .is_err()
    );
}

#[test]
fn squeeze_unsqueeze_expand_flatten() {
    let t = Tensor::zeros([1, 3, 1, 2], ()).unwrap();
    assert_eq!(t.squeeze().unwrap().dims(), &[3, 2]);
    assert_eq!(t.squeeze_dim(2).unwrap().dims(), &[1, 3, 2]);
    assert_eq!(t.squeeze_dim(1).unwrap().dims(), &[1, 3, 1, 2]);
    assert_eq!(t.unsqueeze(-1).unwrap().dims(), &[1, 3, 1, 2, 1]);
    assert_eq!(t.unsqueeze(4).unwrap().dims(), &[1, 3, 1, 2, 1]);
    assert!(t.unsqueeze(5).is_err());
    let c = ar(3).reshape([3, 1]).unwrap();
    let e = c.expand([2, -1, 4]).unwrap();
    assert_eq!(
        (e.dims(), e.strides()),
        (vec![2usize, 3, 4], vec![0usize, 1, 0])
    );
    assert_eq!(
        v(&e.select(0, 1).unwrap().select(0, 2).unwrap()),
        vec![2; 4]
    );
    assert!(c.expand([5, 3, 2]).is_ok());
    assert!(c.expand([3, 2, 2]).is_err());
    assert!(c.expand([2, 2]).is_err());
    assert!(c.expand([-1, 3, 1]).is_err());
    let f = ar(24).reshape([2, 3, 4]).unwrap();
    assert_eq!(f.flatten(1, 2).unwrap().dims(), &[2, 12]);
    assert_eq!(f.flatten(0, -2).unwrap().dims(), &[6, 4]);
    assert!(f.flatten(2, 1).is_err());
    assert_eq!(
        Tensor::scalar(1f32, Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .dims(),
        &[1]
    );
}

#[test]
fn in_place_refuses_expanded_views() {
    let e = Tensor::zeros([3], ()).unwrap().expand([2, 3]).unwrap();
    assert!(matches!(
        e.fill_(1).unwrap_err().downcast_ref::<TensorError>(),
        Some(TensorError::InPlaceOverlap { .. })
    ));
    assert!(e.add_(1).is_err());
    assert!(e.copy_(&Tensor::ones([2, 3], ()).unwrap()).is_err());
    // but a view with size-1 stride-0 dims is fine
    let ok = Tensor::zeros([3], ()).unwrap().expand([1, 3]).unwrap();
    ok.fill_(2).unwrap();
}

#[test]
fn cat_stack_chunk_split() {
    let a = ar(6).reshape([2, 3]).unwrap();
    let b = Tensor::ones([2, 2], DType::F32).unwrap();
    let c = Tensor::cat(&[&a, &b], 1).unwrap();
    assert_eq!(c.dtype(), DType::F32);
    assert_eq!(
        c.to_vec2::<f32>().unwrap(),
        vec![vec![0., 1., 2., 1., 1.], vec![3., 4., 5., 1., 1.]]
    );
    let e = Tensor::cat(&[&a, &b], 0).unwrap_err().to_string();
    assert!(
        e.starts_with("cat: sizes of tensors must match except in dimension 0"),
        "{e}"
    );
    assert!(Tensor::cat(&[], 0).is_err());
    let empty = Tensor::zeros([0], DType::I64).unwrap();
    assert_eq!(Tensor::cat(&[&a, &empty], 0).unwrap().dims(), &[2, 3]);
    // cat of a tensor with itself (sources share storage with each other)
    assert_eq!(
        v(&Tensor::cat(&[&a.t().unwrap(), &a.t().unwrap()], 0).unwrap())[..4],
        [0, 3, 1, 4]
    );

    let s = Tensor::stack(&[&a, &a], 1).unwrap();
    assert_eq!(s.dims(), &[2, 2, 3]);
    assert_eq!(v(&s.select(1, 1).unwrap()), v(&a));
    assert!(Tensor::stack(&[&a, &a.t().unwrap()], 0).is_err());
    // Empty tensors stack into empty slices past their empty storage's end.
    let e = Tensor::zeros([0, 3], DType::F32).unwrap();
    assert_eq!(Tensor::stack(&[&e, &e], -1).unwrap().dims(), &[0, 3, 2]);
    assert_eq!(Tensor::stack(&[&e, &e], 0).unwrap().dims(), &[2, 0, 3]);

    let parts = ar(10).chunk(3, 0).unwrap();
    assert_eq!(
        parts.iter().map(|p| p.numel()).collect::<Vec<_>>(),
        vec![4, 4, 2]
    );
    assert_eq!(ar(6).chunk(4, 0).unwrap().len(), 3); // torch.chunk gives 3 pieces of 2
    let sp = ar(7).split(3, 0).unwrap();
    assert_eq!(
        sp.iter().map(v).collect::<Vec<_>>(),
        vec![vec![0, 1, 2], vec![3, 4, 5], vec![6]]
    );
    let ss = ar(7).split_sizes(&[2, 5], 0).unwrap();
    assert_eq!(v(&ss[1]), vec![2, 3, 4, 5, 6]);
    assert!(ar(7).split_sizes(&[2, 4], 0).is_err());
    assert!(ar(7).chunk(0, 0).is_err());
    assert!(ar(7).split(0, 0).is_err());
}

#[test]
fn copy_between_views_of_one_storage() {
    let t = ar(6);
    // overlapping source and destination in one storage: the source is read first
    t.narrow(0, 1, 5)
        .unwrap()
        .copy_(&t.narrow(0, 0, 5).unwrap())
        .unwrap();
    assert_eq!(v(&t), vec![0, 0, 1, 2, 3, 4]);
    let m = ar(4).reshape([2, 2]).unwrap();
    m.copy_(&m.t().unwrap()).unwrap();
    assert_eq!(v(&m), vec![0, 2, 1, 3]);
    let w = ar(3);
    w.add_(&w).unwrap();
    assert_eq!(v(&w), vec![0, 2, 4]);
}
