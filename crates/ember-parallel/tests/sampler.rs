//! DistributedSampler against PyTorch's rule (written out naively below), and through the
//! DataLoader: shards are disjoint, cover the dataset, and reshuffle with `set_epoch`.

use std::collections::BTreeSet;
use std::sync::Arc;

use ember_nn::Tensor;
use ember_nn::data::{DataLoader, Sampler, TensorDataset, shuffled_indices};
use ember_parallel::DistributedSampler;
use ember_tensor::Device;
use proptest::prelude::*;

fn dataset(n: usize) -> Arc<TensorDataset> {
    let x =
        Tensor::from_vec((0..n).map(|i| i as f32).collect(), [n], Device::Cpu).expect("a tensor");
    Arc::new(TensorDataset::new(vec![x]).expect("a dataset"))
}

/// PyTorch's `DistributedSampler.__iter__`, line for line, over a given order.
fn pytorch_shard(order: Vec<usize>, replicas: usize, rank: usize, drop_last: bool) -> Vec<usize> {
    let n = order.len();
    let num_samples = if drop_last && !n.is_multiple_of(replicas) {
        // math.ceil((len - replicas) / replicas), for len >= 0
        let num = n as i64 - replicas as i64;
        if num <= 0 {
            0
        } else {
            (num as usize).div_ceil(replicas)
        }
    } else {
        n.div_ceil(replicas)
    };
    let total = num_samples * replicas;
    let mut indices = order;
    if !drop_last {
        let padding = total - indices.len();
        if padding <= indices.len() {
            let head: Vec<usize> = indices[..padding].to_vec();
            indices.extend(head);
        } else {
            let times = padding.div_ceil(indices.len());
            let head: Vec<usize> = indices.clone();
            for _ in 0..times {
                indices.extend(head.iter().copied());
            }
            indices.truncate(total);
        }
    } else {
        indices.truncate(total);
    }
    indices.into_iter().skip(rank).step_by(replicas).collect()
}

proptest! {
    #[test]
    fn shards_follow_pytorch_rule(n in 1usize..60, replicas in 1usize..6, drop_last: bool,
                                  shuffle: bool, seed in 0u64..4, epoch in 0u64..4) {
        let data = dataset(n);
        let mut union = Vec::new();
        for rank in 0..replicas {
            let s = DistributedSampler::with_replicas(data.as_ref(), replicas, rank)
                .unwrap()
                .shuffle(shuffle)
                .seed(seed)
                .drop_last(drop_last);
            s.set_epoch(epoch);
            let order = if shuffle { shuffled_indices(n, seed, epoch) } else { (0..n).collect() };
            let got = s.indices(123).unwrap();
            prop_assert_eq!(&got, &pytorch_shard(order, replicas, rank, drop_last));
            prop_assert_eq!(got.len(), s.len());
            union.extend(got);
        }
        let distinct: BTreeSet<usize> = union.iter().copied().collect();
        if drop_last {
            // Disjoint, and only the cut tail (fewer than `replicas` samples) is missing.
            prop_assert_eq!(distinct.len(), union.len());
            prop_assert!(n - distinct.len() < replicas);
        } else {
            // Everything covered; only the padding repeats.
            prop_assert_eq!(distinct.len(), n);
            prop_assert_eq!(union.len(), n.div_ceil(replicas) * replicas);
        }
    }
}

#[test]
fn set_epoch_reshuffles_and_the_loader_follows_the_sampler() {
    let data = dataset(20);
    let sampler = Arc::new(DistributedSampler::with_replicas(data.as_ref(), 2, 1).unwrap());
    let loader = DataLoader::new(data.clone())
        .sampler(sampler.clone())
        .batch_size(4);
    assert_eq!(loader.len(), 3); // 10 samples on this rank
    let epoch0: Vec<usize> = loader.batch_indices(0).unwrap().concat();
    assert_eq!(epoch0, sampler.indices(0).unwrap());
    // The loader's own epoch counter does not move the order (PyTorch's sampler keeps its
    // own epoch), set_epoch does.
    assert_eq!(loader.batch_indices(5).unwrap().concat(), epoch0);
    sampler.set_epoch(1);
    let epoch1: Vec<usize> = loader.batch_indices(0).unwrap().concat();
    assert_ne!(epoch0, epoch1);
    // The values the batches hold are the sampler's indices (x[i] = i).
    let mut seen = Vec::new();
    for batch in loader.iter().unwrap() {
        seen.extend(
            batch.unwrap()[0]
                .to_vec::<f32>()
                .unwrap()
                .into_iter()
                .map(|v| v as usize),
        );
    }
    assert_eq!(seen, epoch1);
}

#[test]
fn bad_rank_and_shuffle_with_sampler_are_errors() {
    let data = dataset(5);
    let e = DistributedSampler::with_replicas(data.as_ref(), 2, 2).unwrap_err();
    assert!(e.to_string().contains("invalid rank 2"), "{e}");
    assert!(e.to_string().contains("[0, 1]"), "{e}");
    assert!(DistributedSampler::with_replicas(data.as_ref(), 0, 0).is_err());

    let sampler = Arc::new(DistributedSampler::with_replicas(data.as_ref(), 1, 0).unwrap());
    let loader = DataLoader::new(data.clone()).sampler(sampler).shuffle(true);
    let Err(e) = loader.iter() else {
        panic!("shuffle with a sampler is refused")
    };
    assert!(
        e.to_string().contains("mutually exclusive with shuffle"),
        "{e}"
    );
}

/// A sampler yielding an index past the dataset is an error naming both.
#[derive(Debug)]
struct PastTheEnd;
impl Sampler for PastTheEnd {
    fn indices(&self, _: u64) -> ember_nn::Result<Vec<usize>> {
        Ok(vec![0, 7])
    }
    fn len(&self) -> usize {
        2
    }
}

#[test]
fn an_index_past_the_dataset_is_an_error() {
    let loader = DataLoader::new(dataset(5)).sampler(Arc::new(PastTheEnd));
    let Err(e) = loader.iter() else {
        panic!("index 7 of 5 samples is refused")
    };
    assert!(
        e.to_string().contains("index 7") && e.to_string().contains("5 samples"),
        "{e}"
    );
}
