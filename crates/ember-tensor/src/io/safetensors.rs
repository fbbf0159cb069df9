//! Named tensors in the safetensors format: [`save`](super::save) (atomic, streamed and
//! checksummed, See Note [Atomic save] and Note [Checkpoint checksum]) and [`load`], with
//! optional string metadata.
//!
//! ```
//! use ember_tensor::{io, Device, Tensor};
//!
//! let dir = std::env::temp_dir().join(format!("ember-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("model.safetensors");
//! let w = Tensor::from_vec(vec![1f32, 2., 3., 4.], [2, 2], &Device::Cpu)?;
//! let b = Tensor::new(&[7i64], &Device::Cpu)?;
//! io::save([("w", &w), ("b", &b)], &path)?;
//! let loaded = io::load(&path, &Device::Cpu)?;
//! assert_eq!(loaded["w"].to_vec2::<f32>()?, vec![vec![1., 2.], vec![3., 4.]]);
//! assert_eq!(loaded["b"].to_vec::<i64>()?, vec![7]);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), ember_tensor::Error>(())
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use ember_device::Device;
use half::{bf16, f16};
use safetensors::SafeTensors;

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::raw::RawTensor;
use crate::storage::{CpuStorage, Storage};
use crate::tensor::Tensor;

/// Largest header the loader accepts (the `safetensors` crate's limit), in bytes.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Bytes of the little-endian header-length prefix.
pub(super) const PREFIX: usize = 8;

/// The metadata key of the file's CRC-32 (Note [Checkpoint checksum]): of the whole file,
/// length prefix, header (metadata included) and data, with this key's 8 hex digits read
/// as `00000000`.
pub const CHECKSUM_KEY: &str = "ember.checksum";

/// The metadata key of the CRC-32 of the data section alone, which Ember wrote before the
/// header was covered too; still verified when a file has it, never written.
pub const DATA_CHECKSUM_KEY: &str = "ember.crc32";

/// How every header Ember writes begins: the checksum is the first metadata entry, so its
/// 8 hex digits sit at a known offset (Note [Checkpoint checksum]).
pub(super) const CHECKSUM_HEAD: &str = "{\"__metadata__\":{\"ember.checksum\":\"";

/// The safetensors name of a dtype (`F32`, `BF16`, `BOOL`, ...).
pub(super) fn st_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F64 => "F64",
        DType::F16 => "F16",
        DType::Bf16 => "BF16",
        DType::I64 => "I64",
        DType::I32 => "I32",
        DType::U8 => "U8",
        DType::Bool => "BOOL",
    }
}

fn ember_dtype(d: &str) -> Option<DType> {
    Some(match d {
        "F32" => DType::F32,
        "F64" => DType::F64,
        "F16" => DType::F16,
        "BF16" => DType::Bf16,
        "I64" => DType::I64,
        "I32" => DType::I32,
        "U8" => DType::U8,
        "BOOL" => DType::Bool,
        _ => return None,
    })
}

/// A CPU storage of `dtype` from little-endian bytes (`data.len()` already checked).
fn from_bytes(dtype: DType, data: &[u8], name: &str, err: &Ctx<'_>) -> Result<CpuStorage> {
    macro_rules! de {
        ($n:literal, $f:expr) => {{
            let (chunks, _) = data.as_chunks::<$n>();
            CpuStorage::from_chunks(chunks.len(), |r| chunks[r].iter().map(|c| $f(*c)))
        }};
    }
    match dtype {
        DType::F32 => de!(4, f32::from_le_bytes),
        DType::F64 => de!(8, f64::from_le_bytes),
        DType::F16 => de!(2, |c| f16::from_bits(u16::from_le_bytes(c))),
        DType::Bf16 => de!(2, |c| bf16::from_bits(u16::from_le_bytes(c))),
        DType::I64 => de!(8, i64::from_le_bytes),
        DType::I32 => de!(4, i32::from_le_bytes),
        DType::U8 => CpuStorage::from_slice(data),
        DType::Bool => {
            if let Some((i, b)) = data.iter().enumerate().find(|(_, b)| **b > 1) {
                return Err(err.bad(format!(
                    "tensor {name:?}: bool element {i} is byte {b}, expected 0 or 1"
                )));
            }
            CpuStorage::from_chunks(data.len(), |r| data[r].iter().map(|&b| b == 1))
        }
    }
}

/// The file (or `<bytes>`) and operation errors are about.
pub(super) struct Ctx<'a> {
    pub(super) op: &'static str,
    pub(super) path: &'a Path,
}

impl Ctx<'_> {
    pub(super) fn bad(&self, what: impl Into<String>) -> TensorError {
        TensorError::File {
            op: self.op,
            path: self.path.to_path_buf(),
            what: what.into(),
            io_kind: None,
        }
    }

    pub(super) fn io(&self, doing: &str, e: &std::io::Error) -> TensorError {
        TensorError::File {
            op: self.op,
            path: self.path.to_path_buf(),
            what: format!("{doing}: {e}"),
            io_kind: Some(e.kind()),
        }
    }
}

fn st_err(ctx: &Ctx<'_>, e: safetensors::SafeTensorError) -> TensorError {
    match e {
        safetensors::SafeTensorError::IoError(io) => ctx.io("write", &io),
        e => ctx.bad(format!("invalid safetensors data: {e}")),
    }
}

/// Tensors loaded from a file, by name, with the file's metadata.
pub type Loaded = (BTreeMap<String, Tensor>, BTreeMap<String, String>);

/// [`Loaded`] as parsed, before the tensors join the tape's type.
type RawLoaded = (BTreeMap<String, RawTensor>, BTreeMap<String, String>);

fn tracked((tensors, meta): RawLoaded) -> Loaded {
    let tensors = tensors
        .into_iter()
        .map(|(k, t)| (k, Tensor::wrap(t)))
        .collect();
    (tensors, meta)
}

/// Loads every tensor of a safetensors file onto `device`, by name. Malformed files
/// (truncated, corrupted or oversized headers, sizes beyond the file, unsupported dtypes,
/// duplicate names) are errors naming the file and the problem.
pub fn load(path: impl AsRef<Path>, device: impl Into<Device>) -> Result<BTreeMap<String, Tensor>> {
    Ok(load_with_metadata(path, device)?.0)
}

/// [`load`], also returning the file's string metadata (empty if none).
pub fn load_with_metadata(path: impl AsRef<Path>, device: impl Into<Device>) -> Result<Loaded> {
    let device = &device.into();
    let path = path.as_ref();
    let ctx = Ctx { op: "load", path };
    let bytes = fs::read(path).map_err(|e| ctx.io("read", &e))?;
    parse(&bytes, device, &ctx).map(tracked)
}

/// [`load_with_metadata`] from the bytes of a file.
pub fn load_from_bytes(bytes: &[u8], device: impl Into<Device>) -> Result<Loaded> {
    let device = &device.into();
    let ctx = Ctx {
        op: "load",
        path: Path::new("<bytes>"),
    };
    parse(bytes, device, &ctx).map(tracked)
}

/// One header entry as written in the file, before any checks.
#[derive(serde::Deserialize)]
struct RawInfo {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

fn parse(bytes: &[u8], device: &Device, ctx: &Ctx<'_>) -> Result<RawLoaded> {
    let Some(prefix) = bytes.first_chunk::<PREFIX>() else {
        return Err(ctx.bad(format!(
            "file is truncated: expected at least {PREFIX} bytes for the header length, but found {}",
            bytes.len()
        )));
    };
    let n = u64::from_le_bytes(*prefix);
    if n > MAX_HEADER_BYTES {
        return Err(ctx.bad(format!(
            "header length {n} is over the limit of {MAX_HEADER_BYTES} bytes (corrupted length prefix?)"
        )));
    }
    let avail = (bytes.len() - PREFIX) as u64;
    if n > avail {
        return Err(ctx.bad(format!(
            "header claims {n} bytes, but only {avail} follow the length prefix (truncated file?)"
        )));
    }
    let header = &bytes[PREFIX..PREFIX + n as usize];
    let data_len = avail - n;
    let entries = header_entries(header, ctx)?;
    for (name, info) in &entries {
        check_entry(name, info, data_len, ctx)?;
    }
    // The crate checks the rest (offsets contiguous, data covering the file exactly).
    let st = SafeTensors::deserialize(bytes).map_err(|e| st_err(ctx, e))?;
    let metadata: BTreeMap<String, String> = SafeTensors::read_metadata(bytes)
        .map(|(_, m)| m.metadata().clone().unwrap_or_default())
        .map_err(|e| st_err(ctx, e))?
        .into_iter()
        .collect();
    if let Some(expected) = metadata.get(CHECKSUM_KEY) {
        verify_file_checksum(expected, bytes, ctx)?;
    } else if let Some(expected) = metadata.get(DATA_CHECKSUM_KEY) {
        let found = crc32fast::hash(&bytes[PREFIX + n as usize..]);
        verify_checksum(DATA_CHECKSUM_KEY, expected, found, "data", avail - n, ctx)?;
    }
    let mut out = BTreeMap::new();
    for (name, info) in &entries {
        let view = st.tensor(name).map_err(|e| st_err(ctx, e))?;
        let dtype = ember_dtype(&info.dtype).ok_or_else(|| ctx.bad("internal: dtype"))?;
        let storage = from_bytes(dtype, view.data(), name, ctx)?;
        let t = RawTensor::from_storage(Storage::from(storage), view.shape().to_vec());
        out.insert(name.clone(), t.to_device(device)?);
    }
    Ok((out, metadata))
}

/// The CRC-32 of a whole file with the checksum's 8 digits, at `at`, read as `00000000`
/// (Note [Checkpoint checksum]).
pub(super) fn file_crc(bytes: &[u8], at: usize) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&bytes[..at]);
    h.update(b"00000000");
    h.update(&bytes[at + 8..]);
    h.finalize()
}

/// Checks the whole file against the CRC-32 its header records under [`CHECKSUM_KEY`]
/// (Note [Checkpoint checksum]): a changed byte anywhere, a tensor's dtype or shape or a
/// metadata value included, is refused.
fn verify_file_checksum(expected: &str, bytes: &[u8], ctx: &Ctx<'_>) -> Result<()> {
    let at = PREFIX + CHECKSUM_HEAD.len();
    let placed = bytes
        .get(PREFIX..at + 9)
        .is_some_and(|h| h.starts_with(CHECKSUM_HEAD.as_bytes()) && h[h.len() - 1] == b'"');
    if !placed {
        return Err(ctx.bad(format!(
            "metadata {CHECKSUM_KEY:?} is not the header's first entry, where Ember writes it: the header was rewritten (by another tool?) and the checksum cannot be checked"
        )));
    }
    let found = file_crc(bytes, at);
    verify_checksum(
        CHECKSUM_KEY,
        expected,
        found,
        "file",
        bytes.len() as u64,
        ctx,
    )
}

/// Compares the CRC-32 the header records under `key` with the one `found` over `what`.
fn verify_checksum(
    key: &str,
    expected: &str,
    found: u32,
    what: &str,
    len: u64,
    ctx: &Ctx<'_>,
) -> Result<()> {
    let parsed = (expected.len() == 8 && expected.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u32::from_str_radix(expected, 16).ok())
        .flatten();
    let Some(want) = parsed else {
        return Err(ctx.bad(format!(
            "metadata {key:?} is {expected:?}, expected 8 hex digits (corrupted header?)"
        )));
    };
    if found != want {
        return Err(ctx.bad(format!(
            "checksum mismatch: the header records CRC-32 {want:08x} of the {what}, but the {len} {what} bytes have {found:08x} (the file is corrupted or was edited)"
        )));
    }
    Ok(())
}

/// The header's tensor entries, refusing invalid UTF-8 or JSON and duplicate names.
fn header_entries(header: &[u8], ctx: &Ctx<'_>) -> Result<Vec<(String, RawInfo)>> {
    let text = std::str::from_utf8(header)
        .map_err(|e| ctx.bad(format!("header is not valid UTF-8: {e}")))?;
    let raw: Vec<(String, serde_json::Value)> = serde_json::from_str::<Entries>(text)
        .map_err(|e| ctx.bad(format!("header is not a valid JSON object: {e}")))?
        .0;
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        if !seen.insert(name.clone()) {
            return Err(ctx.bad(format!(
                "duplicate tensor name {name:?} in the header: expected unique names"
            )));
        }
        if name == "__metadata__" {
            continue;
        }
        let info: RawInfo = serde_json::from_value(value).map_err(|e| {
            ctx.bad(format!(
                "tensor {name:?}: expected {{dtype, shape, data_offsets}}, but {e}"
            ))
        })?;
        out.push((name, info));
    }
    Ok(out)
}

/// A JSON object's entries in file order, duplicates kept (serde_json's maps drop them).
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Entries, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = m.next_entry::<String, serde_json::Value>()? {
                    v.push(e);
                }
                Ok(Entries(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// One entry's dtype, byte count and offsets against the data section.
fn check_entry(name: &str, info: &RawInfo, data_len: u64, ctx: &Ctx<'_>) -> Result<()> {
    let Some(dtype) = ember_dtype(&info.dtype) else {
        return Err(ctx.bad(format!(
            "tensor {name:?}: unsupported dtype {:?}; expected one of F32, F64, F16, BF16, I64, I32, U8, BOOL",
            info.dtype
        )));
    };
    let shape = format!("{:?}", info.shape);
    let need = info
        .shape
        .iter()
        .try_fold(dtype.size_in_bytes() as u64, |a, &d| a.checked_mul(d))
        .filter(|&b| b <= isize::MAX as u64)
        .ok_or_else(|| {
            ctx.bad(format!(
                "tensor {name:?}: shape {shape} of {} is too large (byte count overflows)",
                info.dtype
            ))
        })?;
    let (s, e) = info.data_offsets;
    if e < s || e > data_len {
        return Err(ctx.bad(format!(
            "tensor {name:?}: data offsets [{s}, {e}] lie outside the {data_len} data bytes of the file (truncated file?)"
        )));
    }
    if e - s != need {
        return Err(ctx.bad(format!(
            "tensor {name:?}: shape {shape} of {} needs {need} bytes, but its data offsets [{s}, {e}] span {}",
            info.dtype,
            e - s
        )));
    }
    Ok(())
}
