//! Writing safetensors files: streamed, checksummed and atomic (Note [Atomic save],
//! Note [Checkpoint checksum]).

use std::collections::BTreeMap;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use half::{bf16, f16};

use super::safetensors::{CHECKSUM_HEAD, CHECKSUM_KEY, Ctx, DATA_CHECKSUM_KEY, PREFIX, st_name};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::raw::RawTensor;
use crate::tensor::Tensor;

// Note [Atomic save]:
// ~~~~~~~~~~~~~~~~~~~
// A crash (or an error) during `save` must never leave a half-written checkpoint at the
// target path. So `save`:
//   1. checks the names (no duplicates, no reserved `__metadata__`) and lays out the
//      header from the tensors' dtypes and shapes — all failures that need no file first;
//   2. resolves symbolic links: saving through a link writes the file it points to, and the
//      link stays (as `open(path, "w")` does); the temporary file goes beside the target;
//   3. removes stale temporary files that earlier saves of the same target left when they
//      were killed (See Note [Stale temporary files]);
//   4. streams the file to a temporary name in the target's directory (same filesystem, so
//      the rename below is atomic): the header, then each tensor's elements, copied to the
//      host and converted to little-endian bytes a few MiB at a time — so the peak extra
//      host memory is a few MiB (a non-contiguous tensor is first made contiguous on its
//      device), never a copy of the whole state; it then writes the checksum into the
//      header (Note [Checkpoint checksum]) and fsyncs it;
//   5. renames it over the target: readers see the old file or the new one, never a mix;
//   6. fsyncs the directory, so the rename itself survives a crash (Unix).
// On any failure after 1 the temporary file is removed and the target is untouched.

// Note [Stale temporary files]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A save killed between steps 4 and 5 of Note [Atomic save] (kill -9, power loss) leaves
// `.NAME.tmp-PID-N` beside the target, as large as the checkpoint. The next save of the
// same target removes every such file whose writer is gone: on Linux, when no process
// PID is running (`/proc/PID` is absent); elsewhere, when the file is over an hour old.
// Files of this process (another thread may be saving the same target) and of running
// processes are left alone, so two programs saving the same path never break each other's
// save. Other files are never touched: the name must match exactly.

// Note [Checkpoint checksum]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// safetensors has no checksum, so a flipped byte loads silently. Every file Ember writes
// records the CRC-32 (IEEE, the `crc32fast` crate) of the whole file — the length prefix,
// the header with every tensor's dtype, shape and offsets and all the metadata, and the
// data — in the header's metadata under `ember.checksum`, as 8 lowercase hex digits, which
// are read as `00000000` for the sum. The header always begins
// `{"__metadata__":{"ember.checksum":"`, so those digits sit at a known offset. The CRC is
// computed while the file is written: the header goes out with `00000000` there, and the
// placeholder is overwritten once the data is through (the header's length does not
// change). `load` recomputes the CRC when the key is present and refuses a mismatch,
// naming the file and both values: an F32 tensor's dtype edited to I32 (same size) or a
// metadata value changed (a run's seed) is refused, not resumed. A header rewritten by
// another tool (the key elsewhere) is refused too: its checksum cannot be checked. Files
// without the key (PyTorch's, other tools') load as before; files of earlier Ember
// versions carry `ember.crc32`, the CRC of the data section alone, still verified. A
// metadata value given for either key by the caller is dropped (the computed one wins).

/// Bytes of elements copied to the host and written at a time (a few MiB: few copies per
/// tensor, even from a GPU, and a small peak).
const CHUNK: usize = 4 << 20;

/// One tensor of a file being written: its name, dtype, shape and data offsets.
struct Entry<'t> {
    name: String,
    tensor: &'t RawTensor,
    offsets: (u64, u64),
}

/// Step 1 of Note [Atomic save]: checked names, the layout, and the header bytes (padded to
/// a multiple of 8) with the position of the checksum placeholder in them.
struct Layout<'t> {
    entries: Vec<Entry<'t>>,
    header: Vec<u8>,
    checksum_at: usize,
}

/// The tensors' data, by name, as the writer reads it.
fn untracked<'t, S: AsRef<str>>(
    tensors: impl IntoIterator<Item = (S, &'t Tensor)>,
) -> Vec<(S, RawTensor)> {
    tensors.into_iter().map(|(n, t)| (n, t.raw())).collect()
}

fn layout<'t, S: AsRef<str>>(
    tensors: impl IntoIterator<Item = (S, &'t RawTensor)>,
    metadata: &BTreeMap<String, String>,
    ctx: &Ctx<'_>,
) -> Result<Layout<'t>> {
    let mut entries: Vec<Entry<'t>> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (name, t) in tensors {
        let name = name.as_ref().to_string();
        if name == "__metadata__" {
            return Err(ctx.bad("the tensor name \"__metadata__\" is reserved for metadata"));
        }
        if !seen.insert(name.clone()) {
            return Err(ctx.bad(format!(
                "duplicate tensor name {name:?}: expected unique names"
            )));
        }
        entries.push(Entry {
            name,
            tensor: t,
            offsets: (0, 0),
        });
    }
    // Widest dtypes first, then by name (the `safetensors` crate's order): every tensor's
    // data starts aligned to its element size.
    entries.sort_by(|a, b| {
        (b.tensor.dtype().size_in_bytes(), &a.name)
            .cmp(&(a.tensor.dtype().size_in_bytes(), &b.name))
    });
    let mut next = 0u64;
    for e in &mut entries {
        let bytes = (e.tensor.numel() as u64)
            .checked_mul(e.tensor.dtype().size_in_bytes() as u64)
            .ok_or_else(|| ctx.bad(format!("tensor {:?} is too large", e.name)))?;
        e.offsets = (next, next + bytes);
        next += bytes;
    }

    let json = |s: &str| serde_json::to_string(s).map_err(|e| ctx.bad(format!("header: {e}")));
    let mut h = String::from(CHECKSUM_HEAD);
    let checksum_at = h.len();
    h.push_str("00000000\"");
    for (k, v) in metadata {
        if k == CHECKSUM_KEY || k == DATA_CHECKSUM_KEY {
            continue;
        }
        h.push(',');
        h.push_str(&json(k)?);
        h.push(':');
        h.push_str(&json(v)?);
    }
    h.push('}');
    for e in &entries {
        let dims: Vec<String> = e.tensor.dims().iter().map(usize::to_string).collect();
        h.push_str(&format!(
            ",{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            json(&e.name)?,
            st_name(e.tensor.dtype()),
            dims.join(","),
            e.offsets.0,
            e.offsets.1
        ));
    }
    h.push('}');
    while h.len() % PREFIX != 0 {
        h.push(' ');
    }
    Ok(Layout {
        entries,
        header: h.into_bytes(),
        checksum_at,
    })
}

/// Why writing a tensor failed: reading its elements, or the writer.
enum Failure {
    Tensor(TensorError),
    Io(std::io::Error),
}

impl From<TensorError> for Failure {
    fn from(e: TensorError) -> Failure {
        Failure::Tensor(e)
    }
}

/// Writes `t`'s elements as little-endian bytes, [`CHUNK`] bytes of elements at a time
/// (copied to the host one chunk at a time from a flat view), hashing them as they go.
fn write_tensor(
    t: &RawTensor,
    w: &mut impl Write,
    crc: &mut crc32fast::Hasher,
) -> std::result::Result<(), Failure> {
    let n = t.numel();
    if n == 0 {
        return Ok(());
    }
    // A view when contiguous (a device-side copy otherwise): no host copy of the whole.
    let flat = t.flatten_all()?;
    let per_chunk = (CHUNK / t.dtype().size_in_bytes()).max(1);
    let mut buf: Vec<u8> = Vec::with_capacity(CHUNK);
    let mut start = 0;
    while start < n {
        let len = per_chunk.min(n - start);
        let part = flat.narrow(0, start, len)?;
        buf.clear();
        macro_rules! le {
            ($t:ty, $f:expr) => {
                for x in part.to_vec::<$t>()? {
                    buf.extend_from_slice(&$f(x));
                }
            };
        }
        match t.dtype() {
            DType::F32 => le!(f32, f32::to_le_bytes),
            DType::F64 => le!(f64, f64::to_le_bytes),
            DType::F16 => le!(f16, |x: f16| x.to_bits().to_le_bytes()),
            DType::Bf16 => le!(bf16, |x: bf16| x.to_bits().to_le_bytes()),
            DType::I64 => le!(i64, i64::to_le_bytes),
            DType::I32 => le!(i32, i32::to_le_bytes),
            DType::U8 => buf.extend_from_slice(&part.to_vec::<u8>()?),
            DType::Bool => le!(bool, |b: bool| [u8::from(b)]),
        }
        crc.update(&buf);
        w.write_all(&buf).map_err(Failure::Io)?;
        start += len;
    }
    Ok(())
}

/// Streams the header and the data to `w`, returning the CRC-32 of all of it, the
/// checksum's placeholder `00000000` included (Note [Checkpoint checksum]).
fn write_all_data(lay: &Layout<'_>, w: &mut impl Write, ctx: &Ctx<'_>) -> Result<u32> {
    let io = |e: std::io::Error| ctx.io("write", &e);
    let prefix = (lay.header.len() as u64).to_le_bytes();
    w.write_all(&prefix).map_err(io)?;
    w.write_all(&lay.header).map_err(io)?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&prefix);
    crc.update(&lay.header);
    for e in &lay.entries {
        write_tensor(e.tensor, w, &mut crc).map_err(|f| match f {
            Failure::Tensor(t) => t,
            Failure::Io(e) => io(e),
        })?;
    }
    Ok(crc.finalize())
}

/// Overwrites the checksum placeholder of a file's bytes (Note [Checkpoint checksum]).
fn set_checksum(bytes: &mut [u8], at: usize, crc: u32, ctx: &Ctx<'_>) -> Result<()> {
    let slot = bytes
        .get_mut(at..at + 8)
        .ok_or_else(|| ctx.bad("internal: the checksum placeholder is outside the header"))?;
    slot.copy_from_slice(format!("{crc:08x}").as_bytes());
    Ok(())
}

/// Saves named tensors to `path` in the safetensors format, atomically (See Note [Atomic
/// save]): on error, a file already at `path` is left as it was. Non-contiguous tensors are
/// written contiguous; names must be unique. The file carries a CRC-32 of its data that
/// [`load`](super::load) verifies (Note [Checkpoint checksum]). Saving through a symbolic
/// link writes the link's target.
pub fn save<'t, S: AsRef<str>>(
    tensors: impl IntoIterator<Item = (S, &'t Tensor)>,
    path: impl AsRef<Path>,
) -> Result<()> {
    save_with_metadata(tensors, &BTreeMap::new(), path)
}

/// [`save`] with string metadata (the header's `__metadata__`, beside the checksum).
pub fn save_with_metadata<'t, S: AsRef<str>>(
    tensors: impl IntoIterator<Item = (S, &'t Tensor)>,
    metadata: &BTreeMap<String, String>,
    path: impl AsRef<Path>,
) -> Result<()> {
    let path = path.as_ref();
    let ctx = Ctx { op: "save", path };
    let raws = untracked(tensors);
    let lay = layout(raws.iter().map(|(n, t)| (n, t)), metadata, &ctx)?;
    let target = resolve_links(path, &ctx)?;
    let Some(file_name) = target.file_name() else {
        return Err(ctx.bad("expected a file path, but found no file name"));
    };
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    remove_stale_temps(&dir, file_name);
    let tmp = dir.join(temp_name(file_name));
    let written = write_synced(&lay, &tmp, &ctx)
        .and_then(|()| fs::rename(&tmp, &target).map_err(|e| ctx.io("rename into place", &e)));
    if let Err(e) = written {
        // Best effort: the temporary may not exist (the write failed before creating it).
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(&dir).map_err(|e| ctx.io("fsync the directory", &e))
}

/// Follows symbolic links from `path` to the file they name (which may not exist yet).
fn resolve_links(path: &Path, ctx: &Ctx<'_>) -> Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let link = fs::read_link(&p).map_err(|e| ctx.io("read the symbolic link", &e))?;
                p = match p.parent() {
                    Some(parent) if link.is_relative() => parent.join(link),
                    _ => link,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(ctx.bad("too many levels of symbolic links"))
}

/// `.NAME.tmp-`: the prefix of every temporary file of saves of `NAME`.
fn temp_prefix(file_name: &std::ffi::OsStr) -> String {
    format!(".{}.tmp-", file_name.to_string_lossy())
}

/// `.NAME.tmp-PID-N`: hidden, unique within the process.
fn temp_name(file_name: &std::ffi::OsStr) -> std::ffi::OsString {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut s = std::ffi::OsString::from(".");
    s.push(file_name);
    s.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    s
}

/// Step 3 of Note [Atomic save] (See Note [Stale temporary files]); best effort.
fn remove_stale_temps(dir: &Path, file_name: &std::ffi::OsStr) {
    let prefix = temp_prefix(file_name);
    let Ok(read) = fs::read_dir(dir) else {
        return;
    };
    for entry in read.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let Some((pid, n)) = rest.split_once('-') else {
            continue;
        };
        let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), n.parse::<u64>()) else {
            continue;
        };
        if pid == std::process::id() || !writer_gone(pid, &entry) {
            continue;
        }
        let _ = fs::remove_file(entry.path());
    }
}

#[cfg(target_os = "linux")]
fn writer_gone(pid: u32, _entry: &fs::DirEntry) -> bool {
    !Path::new("/proc").join(pid.to_string()).exists()
}

#[cfg(not(target_os = "linux"))]
fn writer_gone(_pid: u32, entry: &fs::DirEntry) -> bool {
    entry
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > std::time::Duration::from_secs(3600))
}

/// Step 4 of Note [Atomic save]: the file at `tmp`, its checksum set, its contents on disk.
fn write_synced(lay: &Layout<'_>, tmp: &Path, ctx: &Ctx<'_>) -> Result<()> {
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(|e| ctx.io("create the temporary file", &e))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 16, file);
    let crc = write_all_data(lay, &mut w, ctx)?;
    let mut file = w.into_inner().map_err(|e| ctx.io("write", e.error()))?;
    file.seek(SeekFrom::Start((PREFIX + lay.checksum_at) as u64))
        .and_then(|_| file.write_all(format!("{crc:08x}").as_bytes()))
        .map_err(|e| ctx.io("write the checksum", &e))?;
    file.sync_all()
        .map_err(|e| ctx.io("fsync the temporary file", &e))
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

/// The bytes of a safetensors file holding `tensors` (and `metadata`), as [`save`] writes.
pub fn save_to_bytes<'t, S: AsRef<str>>(
    tensors: impl IntoIterator<Item = (S, &'t Tensor)>,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let ctx = Ctx {
        op: "save",
        path: Path::new("<bytes>"),
    };
    let raws = untracked(tensors);
    let lay = layout(raws.iter().map(|(n, t)| (n, t)), metadata, &ctx)?;
    let mut out = Vec::new();
    let crc = write_all_data(&lay, &mut out, &ctx)?;
    set_checksum(&mut out, PREFIX + lay.checksum_at, crc, &ctx)?;
    Ok(out)
}
