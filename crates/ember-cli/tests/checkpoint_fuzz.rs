//! A checkpoint fuzz: a seeded loop of mutations (flipped bytes, truncations, splices,
//! changed header lengths and JSON values, data changes with the checksum made to match)
//! over a file written by `ember train --save`. Every mutated file either fails to load with
//! an error value, or loads a state that passes validation and whose checksum verifies
//! (Note [Train checkpoint]). Never a panic or an abort.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use ember::Device;
use ember::optim::Optimizer;
use ember_cli::train::read_checkpoint;

/// Mutations per device; a debug build does them in a few seconds.
const MUTATIONS: usize = 3000;

/// xorshift64*: a seeded, dependency-free generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A checkpoint of a one-epoch run, written once per test binary.
fn checkpoint(dir: &Path) -> Vec<u8> {
    let path = dir.join("seed.safetensors");
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args([
            "train", "--device", "cpu", "--epochs", "1", "--json", "--save",
        ])
        .arg(&path)
        .env_remove("EMBER_CUDA_EMULATOR")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&path).unwrap()
}

fn header_len(b: &[u8]) -> usize {
    u64::from_le_bytes(b[..8].try_into().unwrap()) as usize
}

/// Byte ranges of the decimal numbers in the header (lengths, offsets, epochs, seeds).
fn numbers(b: &[u8]) -> Vec<(usize, usize)> {
    let end = (8 + header_len(b)).min(b.len());
    let mut out = Vec::new();
    let mut i = 8;
    while i < end {
        if b[i].is_ascii_digit() {
            let s = i;
            while i < end && b[i].is_ascii_digit() {
                i += 1;
            }
            out.push((s, i));
        } else {
            i += 1;
        }
    }
    out
}

/// Where the checksum's 8 hex digits are in a file Ember wrote (right after
/// `{"__metadata__":{"ember.checksum":"`), if they are there.
fn checksum_at(b: &[u8]) -> Option<usize> {
    let head = format!(
        "{{\"__metadata__\":{{\"{}\":\"",
        ember::tensor::io::CHECKSUM_KEY
    );
    let at = 8 + head.len();
    (b.len() >= at + 8 && &b[8..at] == head.as_bytes()).then_some(at)
}

/// The CRC-32 of the whole file with the checksum's digits read as `00000000`.
fn file_crc(b: &[u8]) -> String {
    let mut z = b.to_vec();
    if let Some(at) = checksum_at(b) {
        z[at..at + 8].copy_from_slice(b"00000000");
    }
    format!("{:08x}", crc32fast::hash(&z))
}

/// Sets the recorded checksum to that of the (changed) file, so that what follows the
/// checksum (the optimizer's validation) is what the mutation reaches.
fn fix_checksum(b: &mut [u8]) {
    if let Some(at) = checksum_at(b) {
        let crc = file_crc(b);
        b[at..at + 8].copy_from_slice(crc.as_bytes());
    }
}

/// One mutation of `good`, and what it was (for the failure message).
fn mutate(good: &[u8], rng: &mut Rng) -> (Vec<u8>, String) {
    let mut b = good.to_vec();
    let n = b.len();
    let data = 8 + header_len(good);
    let what = match rng.below(9) {
        0 => {
            let (at, x) = (rng.below(n), 1 + rng.below(255) as u8);
            b[at] ^= x;
            format!("flip byte {at} by {x:#x}")
        }
        1 => {
            let at = rng.below(n);
            b.truncate(at);
            format!("truncate to {at}")
        }
        2 => {
            // Splice: a range copied over another place (or inserted).
            let (s, len) = (rng.below(n), 1 + rng.below(64));
            let chunk: Vec<u8> = b[s..(s + len).min(n)].to_vec();
            let to = rng.below(n);
            if rng.below(2) == 0 {
                let e = (to + chunk.len()).min(n);
                b[to..e].copy_from_slice(&chunk[..e - to]);
                format!("splice {s}+{len} over {to}")
            } else {
                b.splice(to..to, chunk);
                format!("splice {s}+{len} inserted at {to}")
            }
        }
        3 => {
            // The header length prefix: off by a little, or anything.
            let v = match rng.below(3) {
                0 => (header_len(good) as i64 + rng.below(17) as i64 - 8) as u64,
                1 => rng.next(),
                _ => rng.next() % (n as u64 * 2),
            };
            b[..8].copy_from_slice(&v.to_le_bytes());
            format!("header length {v}")
        }
        4 | 5 => {
            // A number in the header (a shape, an offset, the epoch, a seed, a checksum
            // digit) replaced, the length kept or not.
            let nums = numbers(&b);
            let (s, e) = nums[rng.below(nums.len())];
            let repl = match rng.below(4) {
                0 => "0".to_string(),
                1 => (rng.next() % 1000).to_string(),
                2 => rng.next().to_string(),
                _ => "9".repeat(e - s),
            };
            b.splice(s..e, repl.bytes());
            let fixed = if repl.len() != e - s && rng.below(2) == 0 {
                // Keep the length prefix consistent, so the JSON is what is tested.
                let h = header_len(good) as i64 + repl.len() as i64 - (e - s) as i64;
                b[..8].copy_from_slice(&(h as u64).to_le_bytes());
                " (length fixed)"
            } else {
                ""
            };
            format!("number at {s}..{e} -> {repl}{fixed}")
        }
        6 => {
            // A JSON value swapped for another of the same length.
            let swaps: [(&[u8], &[u8]); 6] = [
                (b"F32", b"I32"),
                (b"F64", b"I64"),
                (b"\"mlp\"", b"\"cnn\""),
                (b"F32", b"U8 "),
                (b"true", b"null"),
                (b"ember-train-checkpoint-v3", b"ember-train-checkpoint-v2"),
            ];
            let (from, to) = swaps[rng.below(swaps.len())];
            let hits: Vec<usize> = (8..data.saturating_sub(from.len()))
                .filter(|&i| &b[i..i + from.len()] == from)
                .collect();
            if hits.is_empty() {
                return (b, "no-op".into());
            }
            let at = hits[rng.below(hits.len())];
            b[at..at + to.len()].copy_from_slice(to);
            format!(
                "{} -> {} at {at}",
                String::from_utf8_lossy(from),
                String::from_utf8_lossy(to)
            )
        }
        _ => {
            // Data changed and the checksum made to match: the state's own checks decide.
            let at = data + rng.below(n - data);
            let x = 1 + rng.below(255) as u8;
            b[at] ^= x;
            // Sometimes a whole f32/f64 word set to a telling value (inf, NaN, -1).
            if rng.below(2) == 0 && at + 8 <= n {
                let v: [u8; 8] = match rng.below(4) {
                    0 => f64::INFINITY.to_le_bytes(),
                    1 => (-1.0f64).to_le_bytes(),
                    2 => [0, 0, 0x80, 0xbf, 0, 0, 0x80, 0x7f], // f32 -1, f32 inf
                    _ => [0, 0, 0xc0, 0x7f, 0, 0, 0xc0, 0x7f], // f32 NaN twice
                };
                let at = at & !3;
                b[at..at + 8].copy_from_slice(&v);
            }
            fix_checksum(&mut b);
            format!("data byte {at} ^ {x:#x}, checksum fixed")
        }
    };
    (b, what)
}

/// Loads `path` as a resume would; on success, checks what loaded.
fn check(path: &Path, bytes: &[u8], device: Device) -> Result<(), String> {
    let ck = read_checkpoint(path).map_err(|e| e.to_string())?;
    let (model, opt) = ck.restore(device).map_err(|e| e.to_string())?;
    // Loaded: the checksum is there and matches these bytes.
    assert_eq!(
        ck.checksum,
        file_crc(bytes),
        "a loaded checkpoint must carry its verified checksum"
    );
    // ... and the optimizer state is one its constructor would accept.
    for g in opt.param_groups() {
        assert!(g.lr.is_finite() && g.lr >= 0.0, "lr {}", g.lr);
    }
    let sd = opt.state_dict().unwrap();
    for (k, t) in &sd {
        if k.ends_with(".step") {
            let s = t.item::<f64>().unwrap();
            assert!(s.is_finite() && s >= 0.0 && s.fract() == 0.0, "{k} = {s}");
        }
    }
    use ember::nn::Module;
    assert!(model.num_parameters() > 0);
    Ok(())
}

fn fuzz(device: Device, seed: u64) {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("ember-ck-fuzz-{}-{}", std::process::id(), device));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let good = checkpoint(&dir);
    let path = dir.join("mutated.safetensors");
    std::fs::write(&path, &good).unwrap();
    check(&path, &good, device).expect("the unmutated checkpoint loads");
    let mut rng = Rng(seed);
    let (mut loaded, mut refused) = (0, 0);
    let started = std::time::Instant::now();
    for i in 0..MUTATIONS {
        let (bytes, what) = mutate(&good, &mut rng);
        std::fs::write(&path, &bytes).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&path, &bytes, device));
        match outcome {
            Ok(Ok(())) => loaded += 1,
            Ok(Err(msg)) => {
                assert!(!msg.is_empty(), "mutation {i} ({what}): an empty error");
                refused += 1;
            }
            Err(_) => panic!("mutation {i} ({what}) of seed {seed}: panicked"),
        }
    }
    eprintln!(
        "{MUTATIONS} mutations on {device}: {loaded} loaded and valid, {refused} refused, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(refused > MUTATIONS / 2, "most mutations must be caught");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn fuzz_on(device: &Device) {
    fuzz(*device, 0x5eed_c0ff_ee00_0026);
}

ember_testing::test_device!(mutated_checkpoints_load_valid_or_fail_cleanly, fuzz_on);
