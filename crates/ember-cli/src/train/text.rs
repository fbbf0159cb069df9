//! The text of `ember train --model gpt`: Ember's own documentation (`data/text`, embedded),
//! its character vocabulary, the seeded train/validation split, and the random windows a
//! step trains on (Note [Text data]).
//!
//! Note [Text data]: the text is cut into pieces of [`PIECE`] characters; a seeded shuffle
//! of the pieces holds out `round(pieces · val_fraction)` of them for validation (so the
//! split is a function of `(seed, val_fraction)`, as the digits' is). A training batch is
//! `batch` windows of `block + 1` characters, each inside one training piece (a window never
//! joins two pieces that were not next to each other), drawn uniformly from a generator
//! seeded by `(seed, epoch, rank)`: the data of an epoch depends on nothing else, so a
//! resumed run draws what an unstopped one would. Validation reads fixed windows: the
//! non-overlapping windows of the held-out pieces, at most [`MAX_VAL_WINDOWS`] of them
//! evenly spread, and reports the mean cross-entropy of every position's next character.

use std::io::Read;

use ember_nn::{Error, NnError};

static TEXT_GZ: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../data/text/ember-docs.txt.gz"
));

/// The largest decompressed size accepted.
const MAX_DECOMPRESSED: u64 = 16 << 20;

/// Characters per piece of the split.
pub const PIECE: usize = 1024;

/// The most validation windows a validation reads.
pub const MAX_VAL_WINDOWS: usize = 256;

fn data_err(msg: String) -> Error {
    NnError::Data(format!("text: {msg}")).into()
}

/// The embedded text, decompressed.
pub fn load_text() -> Result<String, Error> {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(TEXT_GZ)
        .take(MAX_DECOMPRESSED + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| data_err(format!("the embedded gzip stream is corrupt ({e})")))?;
    if bytes.len() as u64 > MAX_DECOMPRESSED {
        return Err(data_err(format!(
            "the embedded text is larger than {MAX_DECOMPRESSED} bytes"
        )));
    }
    String::from_utf8(bytes).map_err(|e| data_err(format!("the embedded text is not UTF-8 ({e})")))
}

/// A character-level vocabulary: token `i` is the `i`-th character of the sorted set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vocab {
    chars: Vec<char>,
}

impl Vocab {
    /// The sorted set of the characters of `text`.
    pub fn from_text(text: &str) -> Vocab {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        Vocab { chars }
    }

    /// Tokens in the vocabulary.
    pub fn len(&self) -> usize {
        self.chars.len()
    }

    /// Whether it has no tokens.
    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }

    /// The tokens of `s`; an error listing the characters the vocabulary lacks.
    pub fn encode(&self, s: &str) -> Result<Vec<i64>, String> {
        let mut missing: Vec<char> = Vec::new();
        let ids: Vec<i64> = s
            .chars()
            .map(|c| match self.chars.binary_search(&c) {
                Ok(i) => i as i64,
                Err(_) => {
                    if !missing.contains(&c) {
                        missing.push(c);
                    }
                    -1
                }
            })
            .collect();
        if missing.is_empty() {
            Ok(ids)
        } else {
            let shown: Vec<String> = missing.iter().map(|c| format!("{c:?}")).collect();
            Err(format!(
                "the characters {} are not in the model's vocabulary of {} characters",
                shown.join(", "),
                self.len()
            ))
        }
    }

    /// The text of `ids` (an id outside the vocabulary becomes U+FFFD).
    pub fn decode(&self, ids: &[i64]) -> String {
        ids.iter()
            .map(|&i| {
                usize::try_from(i)
                    .ok()
                    .and_then(|i| self.chars.get(i).copied())
                    .unwrap_or('\u{fffd}')
            })
            .collect()
    }

    /// The checkpoint's form: the code points in decimal, separated by spaces.
    pub fn to_metadata(&self) -> String {
        let v: Vec<String> = self.chars.iter().map(|&c| (c as u32).to_string()).collect();
        v.join(" ")
    }

    /// Reads [`to_metadata`](Vocab::to_metadata)'s form: `None` unless it is a sorted set
    /// of valid code points.
    pub fn from_metadata(s: &str) -> Option<Vocab> {
        let chars = s
            .split(' ')
            .map(|t| t.parse::<u32>().ok().and_then(char::from_u32))
            .collect::<Option<Vec<char>>>()?;
        let sorted = chars.windows(2).all(|w| w[0] < w[1]);
        (sorted && !chars.is_empty()).then_some(Vocab { chars })
    }
}

/// SplitMix64: the small seeded generator of the split and of the windows.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` and a stream number (epoch, rank), mixed.
    pub fn new(seed: u64, stream: &[u64]) -> Rng {
        let mut r = Rng(seed);
        for &s in stream {
            let x = r.next_u64();
            r = Rng(x ^ s.wrapping_mul(0xD1B5_4A32_D192_ED03));
        }
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; 0 for `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The text as tokens, split into training and validation pieces.
#[derive(Clone, Debug)]
pub struct TextSplit {
    /// The training pieces, in text order.
    pub train: Vec<Vec<i64>>,
    /// The held-out pieces, in text order.
    pub val: Vec<Vec<i64>>,
}

impl TextSplit {
    /// `tokens` cut into [`PIECE`]s, `round(pieces · val_fraction)` held out by a seeded
    /// shuffle (Note [Text data]).
    pub fn new(tokens: &[i64], val_fraction: f64, seed: u64) -> TextSplit {
        let pieces: Vec<Vec<i64>> = tokens.chunks(PIECE).map(<[i64]>::to_vec).collect();
        let n_val = ((pieces.len() as f64 * val_fraction).round() as usize).min(pieces.len());
        let mut order: Vec<usize> = (0..pieces.len()).collect();
        let mut rng = Rng::new(seed, &[0x5EED]);
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let mut held = vec![false; pieces.len()];
        order[..n_val].iter().for_each(|&i| held[i] = true);
        let (mut train, mut val) = (Vec::new(), Vec::new());
        for (p, h) in pieces.into_iter().zip(held) {
            if h { val.push(p) } else { train.push(p) }
        }
        TextSplit { train, val }
    }

    /// Characters in the training pieces.
    pub fn train_len(&self) -> usize {
        self.train.iter().map(Vec::len).sum()
    }

    /// Characters in the held-out pieces.
    pub fn val_len(&self) -> usize {
        self.val.iter().map(Vec::len).sum()
    }

    /// The validation windows `(inputs, targets)` of `block` characters: the
    /// non-overlapping windows of the held-out pieces, at most [`MAX_VAL_WINDOWS`], evenly
    /// spread.
    pub fn val_windows(&self, block: usize) -> Vec<(Vec<i64>, Vec<i64>)> {
        let mut all = Vec::new();
        for p in &self.val {
            let mut s = 0;
            while s + block < p.len() {
                all.push((p[s..s + block].to_vec(), p[s + 1..s + block + 1].to_vec()));
                s += block;
            }
        }
        if all.len() <= MAX_VAL_WINDOWS {
            return all;
        }
        let n = all.len();
        (0..MAX_VAL_WINDOWS)
            .map(|i| all[i * n / MAX_VAL_WINDOWS].clone())
            .collect()
    }
}

/// Random training windows of `block + 1` characters inside the training pieces.
#[derive(Clone, Debug)]
pub struct Windows {
    pieces: Vec<Vec<i64>>,
    /// Cumulative count of window starts up to and including each piece.
    cumulative: Vec<usize>,
    block: usize,
}

impl Windows {
    /// The windows of `block` inputs over `pieces`; an error naming `--block-size` when no
    /// piece holds one.
    pub fn new(pieces: &[Vec<i64>], block: usize) -> Result<Windows, Error> {
        let mut cumulative = Vec::with_capacity(pieces.len());
        let mut total = 0;
        for p in pieces {
            total += p.len().saturating_sub(block);
            cumulative.push(total);
        }
        if total == 0 {
            return Err(NnError::invalid(
                "ember train",
                format!(
                    "--block-size {block}: no training window fits (the text is cut into pieces of {PIECE} characters; give at most {})",
                    PIECE - 1
                ),
            )
            .into());
        }
        Ok(Windows {
            pieces: pieces.to_vec(),
            cumulative,
            block,
        })
    }

    /// Characters of input per window.
    pub fn block(&self) -> usize {
        self.block
    }

    /// `n` windows drawn from `rng`: the inputs and the targets (shifted by one), each
    /// `n · block` tokens, row-major.
    pub fn draw(&self, rng: &mut Rng, n: usize) -> (Vec<i64>, Vec<i64>) {
        let total = self.cumulative.last().copied().unwrap_or(0);
        let (mut x, mut y) = (
            Vec::with_capacity(n * self.block),
            Vec::with_capacity(n * self.block),
        );
        for _ in 0..n {
            let u = rng.below(total);
            let p = self.cumulative.partition_point(|&c| c <= u);
            let before = if p == 0 { 0 } else { self.cumulative[p - 1] };
            let s = u - before;
            let piece = &self.pieces[p];
            x.extend_from_slice(&piece[s..s + self.block]);
            y.extend_from_slice(&piece[s + 1..s + self.block + 1]);
        }
        (x, y)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn vocab_round_trips_and_names_unknown_characters() {
        let v = Vocab::from_text("hello world");
        assert_eq!(v.len(), 8);
        let ids = v.encode("hold").unwrap();
        assert_eq!(v.decode(&ids), "hold");
        let err = v.encode("hex!").unwrap_err();
        assert!(err.contains("'x'") && err.contains("'!'"), "{err}");
        assert_eq!(Vocab::from_metadata(&v.to_metadata()), Some(v));
        assert_eq!(Vocab::from_metadata("98 97"), None);
    }

    #[test]
    fn split_is_seeded_and_windows_stay_inside_pieces() {
        let tokens: Vec<i64> = (0..10 * PIECE as i64).collect();
        let a = TextSplit::new(&tokens, 0.2, 3);
        assert_eq!((a.train.len(), a.val.len()), (8, 2));
        assert_eq!(a.val, TextSplit::new(&tokens, 0.2, 3).val);
        assert_ne!(a.val, TextSplit::new(&tokens, 0.2, 4).val);
        let w = Windows::new(&a.train, 16).unwrap();
        let (x, y) = w.draw(&mut Rng::new(0, &[1]), 50);
        for (xr, yr) in x.chunks(16).zip(y.chunks(16)) {
            // Consecutive tokens of one piece: each target is its input plus one.
            assert!(xr.windows(2).all(|p| p[1] == p[0] + 1));
            assert!(xr.iter().zip(yr).all(|(a, b)| *b == a + 1));
            assert_eq!(xr[0] as usize / PIECE, yr[15] as usize / PIECE);
        }
        assert!(Windows::new(&a.train, PIECE).is_err());
    }

    #[test]
    fn the_embedded_text_loads() {
        let t = load_text().unwrap();
        assert!(t.len() > 100_000);
        assert!(Vocab::from_text(&t).len() > 50);
    }
}
