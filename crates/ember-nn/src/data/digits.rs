//! The 8x8 handwritten digits that scikit-learn distributes (`sklearn.datasets.load_digits`):
//! 1797 images of 64 pixels in `0..=16`, labels `0..=9`. The test set of the UCI "Optical
//! Recognition of Handwritten Digits" dataset by E. Alpaydin and C. Kaynak (CC BY 4.0), as
//! packaged by scikit-learn 1.9.1 (BSD-3-Clause); see `data/digits/README.md` in the
//! repository for its source and checksum.
//!
//! The gzipped CSV is embedded in the crate: [`load`] needs no file. [`parse`] and
//! [`load_from_path`] read other copies of the same format: gzip, one sample per line, 65
//! comma-separated integers (64 pixels in row-major order, then the label). Every malformed
//! input is an [`NnError::Data`] naming the line and what is wrong; no input panics.
//!
//! ```
//! use ember_nn::data::digits;
//! let d = digits::load()?;
//! assert_eq!(d.images.dims(), vec![1797, 64]);
//! assert_eq!(d.labels.dims(), vec![1797]);
//! let (train, val) = d.split(0.2, 0)?;
//! assert_eq!((train.len(), val.len()), (1438, 359));
//! # Ok::<(), ember_nn::Error>(())
//! ```

use std::io::Read;
use std::path::Path;

use ember_tensor::Device;

use super::dataset::TensorDataset;
use super::loader::shuffled_indices;
use crate::Tensor;
use crate::error::{NnError, Result};

/// Samples in the shipped file.
pub const NUM_SAMPLES: usize = 1797;
/// Pixels per image (8x8).
pub const NUM_PIXELS: usize = 64;
/// Classes (the digits 0 to 9).
pub const NUM_CLASSES: usize = 10;
/// The largest pixel value (a count of "on" pixels in a 4x4 block).
pub const MAX_PIXEL: u8 = 16;
/// sha256 of the shipped `digits.csv.gz`.
pub const SHA256: &str = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22";

/// The largest decompressed size accepted (the real file is about 300 KiB), so that a
/// corrupt or hostile file cannot exhaust memory.
const MAX_DECOMPRESSED: u64 = 64 << 20;

static DIGITS_GZ: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../data/digits/digits.csv.gz"
));

/// The embedded `digits.csv.gz`, byte for byte as scikit-learn ships it.
pub fn embedded_bytes() -> &'static [u8] {
    DIGITS_GZ
}

/// The digits: `images` `[n, 64]` `f32` with values `0..=16`, `labels` `[n]` `i64` with
/// values `0..=9`, on the CPU.
#[derive(Clone, Debug)]
pub struct Digits {
    /// `[n, 64]` `f32`: row `i` is image `i`, its 8x8 pixels in row-major order.
    pub images: Tensor,
    /// `[n]` `i64`: the digit each image shows.
    pub labels: Tensor,
}

/// The embedded digits (1797 samples).
pub fn load() -> Result<Digits> {
    parse(DIGITS_GZ)
}

/// Digits from a gzipped CSV file in the shipped format.
pub fn load_from_path(path: impl AsRef<Path>) -> Result<Digits> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| NnError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse(&bytes)
}

/// Digits from the bytes of a gzipped CSV in the shipped format (see [`parse_csv`]).
pub fn parse(gz_bytes: &[u8]) -> Result<Digits> {
    if gz_bytes.get(..2) != Some(&[0x1f, 0x8b][..]) {
        return Err(NnError::Data(format!(
            "digits: not gzip data (expected the magic bytes 1f 8b, found {})",
            gz_bytes
                .iter()
                .take(2)
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        ))
        .into());
    }
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(gz_bytes)
        .take(MAX_DECOMPRESSED + 1)
        .read_to_end(&mut text)
        .map_err(|e| {
            NnError::Data(format!(
                "digits: the gzip stream is corrupt or truncated ({e}) after {} decompressed bytes",
                text.len()
            ))
        })?;
    if text.len() as u64 > MAX_DECOMPRESSED {
        return Err(NnError::Data(format!(
            "digits: the decompressed data is larger than {MAX_DECOMPRESSED} bytes; not a digits file"
        )).into());
    }
    parse_csv(&text)
}

/// Digits from uncompressed CSV text: one sample per line (`\n` or `\r\n`), 65
/// comma-separated integers, the 64 pixels (`0..=16`) then the label (`0..=9`). Blank lines
/// are skipped; spaces around a number are allowed, as is a decimal point with a zero
/// fraction (`3.0`). Anything else is an error naming the (1-based) line and the field.
pub fn parse_csv(text: &[u8]) -> Result<Digits> {
    let mut pixels: Vec<f32> = Vec::new();
    let mut labels: Vec<i64> = Vec::new();
    for (n, line) in text.split(|&b| b == b'\n').enumerate() {
        let line_no = n + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let fields = line.split(|&b| b == b',').count();
        if fields != NUM_PIXELS + 1 {
            return Err(NnError::Data(format!(
                "digits: line {line_no}: expected {} comma-separated numbers (64 pixels and the label), found {fields}",
                NUM_PIXELS + 1
            )).into());
        }
        for (k, field) in line.split(|&b| b == b',').enumerate() {
            let is_label = k == NUM_PIXELS;
            let what = if is_label {
                "the label".to_string()
            } else {
                format!("pixel {k}")
            };
            let v = number(field).ok_or_else(|| {
                NnError::Data(format!(
                    "digits: line {line_no}: field {} ({what}) is not an integer: {}",
                    k + 1,
                    shown(field)
                ))
            })?;
            let max = if is_label {
                (NUM_CLASSES - 1) as u8
            } else {
                MAX_PIXEL
            };
            if !(0.0..=f64::from(max)).contains(&v) {
                return Err(NnError::Data(format!(
                    "digits: line {line_no}: field {} ({what}) is {v}, outside 0..={max}",
                    k + 1
                ))
                .into());
            }
            if is_label {
                labels.push(v as i64);
            } else {
                pixels.push(v as f32);
            }
        }
    }
    if labels.is_empty() {
        return Err(NnError::Data("digits: no samples in the file".into()).into());
    }
    let n = labels.len();
    Ok(Digits {
        images: Tensor::from_vec(pixels, [n, NUM_PIXELS], Device::Cpu)?,
        labels: Tensor::from_vec(labels, [n], Device::Cpu)?,
    })
}

/// The integer value of a field (surrounding ASCII whitespace allowed), if it is one.
fn number(field: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(field).ok()?.trim();
    // Only digits, one optional point and a leading sign: no "inf", "nan" or exponents.
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    let v: f64 = s.parse().ok()?;
    (v.is_finite() && v.fract() == 0.0).then_some(v)
}

/// A field for an error message: quoted, at most 24 characters.
fn shown(field: &[u8]) -> String {
    let s = String::from_utf8_lossy(field);
    let short: String = s.chars().take(24).collect();
    if short.len() < s.len() {
        format!("{short:?}...")
    } else {
        format!("{short:?}")
    }
}

impl Digits {
    /// The number of samples.
    pub fn len(&self) -> usize {
        self.labels.numel()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `TensorDataset([images, labels])`, for a [`DataLoader`](super::DataLoader).
    pub fn dataset(&self) -> Result<TensorDataset> {
        TensorDataset::new(vec![self.images.clone(), self.labels.clone()])
    }

    /// The number of samples of each class.
    pub fn class_counts(&self) -> Result<[usize; NUM_CLASSES]> {
        let mut counts = [0usize; NUM_CLASSES];
        for l in self.labels.to_vec::<i64>()? {
            let slot = usize::try_from(l)
                .ok()
                .and_then(|i| counts.get_mut(i))
                .ok_or_else(|| NnError::Data(format!("digits: label {l} outside 0..=9")))?;
            *slot += 1;
        }
        Ok(counts)
    }

    /// The samples at `indices` (in that order).
    pub fn subset(&self, indices: &[usize]) -> Result<Digits> {
        let n = self.len();
        let idx = indices
            .iter()
            .map(|&i| {
                if i < n {
                    i64::try_from(i)
                        .map_err(|_| NnError::invalid("Digits::subset", "index too large").into())
                } else {
                    Err(NnError::invalid(
                        "Digits::subset",
                        format!("index {i} is out of range for {n} samples"),
                    )
                    .into())
                }
            })
            .collect::<Result<Vec<i64>>>()?;
        let idx = Tensor::from_vec(idx, [indices.len()], self.labels.device())?;
        Ok(Digits {
            images: self.images.index_select(0, &idx)?,
            labels: self.labels.index_select(0, &idx)?,
        })
    }

    /// A deterministic train/validation split: `round(len * val_fraction)` samples go to
    /// validation, the rest to training, chosen by the permutation
    /// [`shuffled_indices`]`(len, seed, 0)` (validation takes its first part). Each part
    /// keeps the file's order. `val_fraction` must be in `[0, 1]`. Returns `(train, val)`.
    pub fn split(&self, val_fraction: f64, seed: u64) -> Result<(Digits, Digits)> {
        if !(0.0..=1.0).contains(&val_fraction) {
            return Err(NnError::invalid(
                "Digits::split",
                format!("val_fraction must be in [0, 1], got {val_fraction}"),
            )
            .into());
        }
        let n = self.len();
        let n_val = ((n as f64) * val_fraction).round() as usize;
        let perm = shuffled_indices(n, seed, 0);
        let (val, train) = perm.split_at(n_val.min(n));
        let (mut val, mut train) = (val.to_vec(), train.to_vec());
        val.sort_unstable();
        train.sort_unstable();
        Ok((self.subset(&train)?, self.subset(&val)?))
    }
}
