#![allow(clippy::unwrap_used)]
//! `DataLoader` workers and random numbers: each worker's own seeded generator, batches
//! handed out round robin, `get_worker_info` and `worker_init_fn` (PyTorch's scheme).

use std::sync::Arc;
use std::time::Duration;

use ember_nn::data::{
    DataLoader, Dataset, WorkerInfo, check_index, get_worker_info, worker_base_seed,
};
use ember_nn::{NnError, Tensor};
use ember_tensor::random::{self, Generator};
use ember_tensor::{DType, Device};

const CPU: Device = Device::Cpu;

/// Random augmentation: sample `i` is `[i + u, worker id or -1]` with `u` drawn from the
/// default CPU generator, after a sleep that varies from sample to sample and run to run
/// (so workers finish in scrambled orders).
struct Noisy {
    n: usize,
    jitter: u64,
}

impl Dataset for Noisy {
    fn len(&self) -> usize {
        self.n
    }
    fn get(&self, index: usize) -> ember_nn::Result<Vec<Tensor>> {
        check_index(index, self.n)?;
        let us = (index as u64 * 7919 + self.jitter * 104_729) % 1500;
        std::thread::sleep(Duration::from_micros(us));
        let u = Tensor::rand([1], DType::F64)?.to_vec::<f64>()?[0];
        let id = get_worker_info().map_or(-1, |w| w.id as i64);
        Ok(vec![
            Tensor::scalar(index as f64 + u, CPU)?,
            Tensor::scalar(id, CPU)?,
        ])
    }
}

/// Each batch as (sample indices, augmented values, worker ids).
type Seen = Vec<(Vec<usize>, Vec<f64>, Vec<i64>)>;

fn noisy_epoch(l: &DataLoader, epoch: u64) -> Seen {
    let it = l.epoch(epoch).unwrap();
    let indices = it.batch_indices().to_vec();
    it.zip(indices)
        .map(|(b, idx)| {
            let b = b.unwrap();
            (
                idx,
                b[0].to_vec::<f64>().unwrap(),
                b[1].to_vec::<i64>().unwrap(),
            )
        })
        .collect()
}

/// What PyTorch's scheme gives: batch `b` made by worker `b % n`, whose generator is
/// seeded `seed_of(w)` and draws its batches' samples in order.
fn expected(seen: &Seen, n: usize, seed_of: impl Fn(usize) -> u64) -> Seen {
    let gens: Vec<Generator> = (0..n)
        .map(|w| Generator::with_seed(seed_of(w), CPU))
        .collect();
    seen.iter()
        .enumerate()
        .map(|(b, (idx, _, _))| {
            let g = &gens[b % n];
            let vals = idx
                .iter()
                .map(|&i| {
                    let u = ember_tensor::Tensor::rand_with([1], DType::F64, g).unwrap();
                    i as f64 + u.to_vec::<f64>().unwrap()[0]
                })
                .collect();
            (idx.clone(), vals, vec![(b % n) as i64; idx.len()])
        })
        .collect()
}

#[test]
fn each_worker_has_its_own_seeded_generator() {
    let main_before = random::get_rng_state();
    let make = |jitter: u64| {
        DataLoader::new(Arc::new(Noisy { n: 23, jitter }))
            .batch_size(2)
            .shuffle(true)
            .seed(5)
            .num_workers(3)
    };
    let seen = noisy_epoch(&make(0), 1);
    assert_eq!(seen.len(), 12);
    assert_eq!(
        seen,
        expected(&seen, 3, |w| worker_base_seed(5, 1) + w as u64)
    );
    // Whatever order the threads finish in.
    for jitter in 1..4 {
        assert_eq!(noisy_epoch(&make(jitter), 1), seen, "jitter {jitter}");
    }
    // Another epoch: another order and other draws; another worker count: other draws.
    let next = noisy_epoch(&make(0), 2);
    assert_eq!(
        next,
        expected(&next, 3, |w| worker_base_seed(5, 2) + w as u64)
    );
    assert_ne!(worker_base_seed(5, 1), worker_base_seed(5, 2));
    let two = noisy_epoch(&make(0).num_workers(2), 1);
    assert_eq!(
        two,
        expected(&two, 2, |w| worker_base_seed(5, 1) + w as u64)
    );
    assert_ne!(two, seen);
    // More workers than batches: batch b is still worker b's.
    let few = DataLoader::new(Arc::new(Noisy { n: 3, jitter: 0 })).num_workers(8);
    let few_seen = noisy_epoch(&few, 0);
    let base = worker_base_seed(random::initial_seed(), 0);
    assert_eq!(few_seen, expected(&few_seen, 3, |w| base + w as u64));
    // The workers drew nothing from this thread's generator.
    assert_eq!(random::get_rng_state(), main_before);
}

#[test]
fn worker_info_and_worker_init_fn() {
    assert_eq!(get_worker_info(), None);
    // Without workers there is no worker info (the samples' ids are -1). The samples draw
    // from the calling thread's generator: here a thread-local one, so as not to move the
    // process-wide one that `each_worker_has_its_own_seeded_generator` checks.
    let own = random::ThreadGenerator::with_seed(0);
    let inline = DataLoader::new(Arc::new(Noisy { n: 3, jitter: 0 })).batch_size(2);
    let ids: Vec<i64> = inline
        .iter()
        .unwrap()
        .flat_map(|b| b.unwrap()[1].to_vec::<i64>().unwrap())
        .collect();
    assert_eq!(ids, vec![-1, -1, -1]);
    assert_eq!(own.generator().get_state().offset, 3);
    drop(own);

    // worker_init_fn runs on each worker with its info set and may reseed its generator.
    let infos = Arc::new(std::sync::Mutex::new(Vec::<WorkerInfo>::new()));
    let seen_infos = Arc::clone(&infos);
    let l = DataLoader::new(Arc::new(Noisy { n: 10, jitter: 0 }))
        .batch_size(3)
        .seed(9)
        .num_workers(2)
        .worker_init_fn(move |id| {
            let info = get_worker_info().unwrap();
            assert_eq!(info.id, id);
            assert_eq!(random::initial_seed(), info.seed);
            seen_infos.lock().unwrap().push(info);
            random::manual_seed(100 + id as u64);
            Ok(())
        });
    let seen = noisy_epoch(&l, 4);
    assert_eq!(seen, expected(&seen, 2, |w| 100 + w as u64));
    let mut infos = infos.lock().unwrap().clone();
    infos.sort_by_key(|i| i.id);
    let base = worker_base_seed(9, 4);
    assert_eq!(
        infos,
        (0..2)
            .map(|id| WorkerInfo {
                id,
                num_workers: 2,
                seed: base + id as u64,
            })
            .collect::<Vec<_>>()
    );

    // A failing worker_init_fn fails that worker's batches, and only those.
    for failure in ["error", "panic"] {
        let l = DataLoader::new(Arc::new(Noisy { n: 8, jitter: 0 }))
            .batch_size(2)
            .num_workers(2)
            .worker_init_fn(move |id| {
                if id == 1 {
                    if failure == "panic" {
                        panic!("no setup for {id}");
                    }
                    return Err(NnError::Data(format!("no setup for {id}")).into());
                }
                Ok(())
            });
        let items: Vec<_> = l.iter().unwrap().collect();
        assert_eq!(items.len(), 4);
        for (b, item) in items.iter().enumerate() {
            match item {
                Ok(_) => assert_eq!(b % 2, 0, "{failure}: batch {b}"),
                Err(e) => {
                    assert_eq!(b % 2, 1, "{failure}: batch {b}");
                    let msg = e.to_string();
                    assert!(
                        msg.contains("worker 1 could not start") && msg.contains("no setup for 1"),
                        "{failure}: {msg}"
                    );
                }
            }
        }
    }
}
