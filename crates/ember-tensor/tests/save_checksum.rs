#![allow(clippy::unwrap_used)]
//! `io::save` as a checkpoint writer: the file's checksum (header, metadata and data),
//! verified on load (Note [Checkpoint checksum]); saving through a symbolic link; stale temporary files of killed
//! saves removed (Note [Stale temporary files]); tensors of any device streamed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ember_tensor::{DType, Device, Tensor, TensorError, io};
use ember_testing::test_device;

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-ck-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Tensors of several dtypes on `device`, one of them non-contiguous.
fn tensors(device: &Device) -> Vec<(String, Tensor)> {
    let a = Tensor::arange(0, 12, DType::F32)
        .unwrap()
        .reshape([3, 4])
        .unwrap()
        .to_device(device)
        .unwrap();
    vec![
        ("a".into(), a.clone()),
        ("a_t".into(), a.t().unwrap()),
        (
            "i".into(),
            Tensor::from_vec(vec![-3i64, 9], [2], device).unwrap(),
        ),
        (
            "m".into(),
            Tensor::from_vec(vec![true, false, true], [3], device).unwrap(),
        ),
        (
            "e".into(),
            Tensor::zeros([0, 2], (device, DType::F16)).unwrap(),
        ),
    ]
}

fn save(ts: &[(String, Tensor)], path: &Path) {
    io::save(ts.iter().map(|(n, t)| (n.as_str(), t)), path).unwrap();
}

/// Where the data section of a safetensors file starts.
fn data_start(bytes: &[u8]) -> usize {
    8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

/// Where the checksum's 8 hex digits are: right after `"ember.checksum":"`, the header's
/// first metadata entry.
fn checksum_at(bytes: &[u8]) -> usize {
    let head = b"{\"__metadata__\":{\"ember.checksum\":\"";
    assert_eq!(&bytes[8..8 + head.len()], head);
    8 + head.len()
}

/// The CRC-32 of a whole file with its checksum digits read as `00000000`, computed here
/// independently of the library.
fn file_crc(bytes: &[u8]) -> String {
    let mut zeroed = bytes.to_vec();
    let at = checksum_at(bytes);
    zeroed[at..at + 8].copy_from_slice(b"00000000");
    format!("{:08x}", crc32fast::hash(&zeroed))
}

fn saved_and_loaded_with_a_verified_checksum(device: &Device) {
    let dir = tmp_dir(&format!("crc-{device}"));
    let path = dir.join("m.safetensors");
    let ts = tensors(device);
    save(&ts, &path);
    let bytes = std::fs::read(&path).unwrap();
    let (loaded, meta) = io::load_with_metadata(&path, device).unwrap();
    let want = file_crc(&bytes);
    assert_eq!(meta.get(io::CHECKSUM_KEY), Some(&want));
    let at = checksum_at(&bytes);
    assert_eq!(&bytes[at..at + 8], want.as_bytes());
    for (name, t) in &ts {
        let l = &loaded[name];
        assert_eq!(l.device(), *device);
        assert_eq!(
            l.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
            t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
            "{name}"
        );
    }
    // The in-memory writer gives the same bytes.
    let mem = io::save_to_bytes(ts.iter().map(|(n, t)| (n.as_str(), t)), &BTreeMap::new());
    assert_eq!(mem.unwrap(), bytes);
    // Every flipped data byte is caught, with the file and both checksums in the message.
    for at in data_start(&bytes)..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        std::fs::write(&path, &bad).unwrap();
        let e = io::load(&path, device).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("m.safetensors"), "{msg}");
        assert!(msg.contains("checksum mismatch"), "{msg}");
        assert!(msg.contains(&want), "{msg}");
        let found = file_crc(&bad);
        assert!(msg.contains(&found), "{msg}");
        assert!(matches!(e, TensorError::File { op: "load", .. }));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
test_device!(
    saved_and_loaded_with_a_verified_checksum,
    saved_and_loaded_with_a_verified_checksum
);

/// `{"a": f32 [2], "seed": ..}` as Ember writes it.
fn file_with_seed(seed: &str) -> Vec<u8> {
    let a = Tensor::from_vec(vec![1.5f32, -2.0], [2], Device::Cpu).unwrap();
    let meta = BTreeMap::from([("seed".to_string(), seed.to_string())]);
    io::save_to_bytes([("a", &a)], &meta).unwrap()
}

/// Replaces the one occurrence of `from` in `bytes` by `to` (of the same length: the
/// header's length and every offset stay valid, so only the checksum can tell).
fn edit(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let text = String::from_utf8_lossy(bytes).into_owned();
    assert_eq!(text.matches(from).count(), 1, "{from} in {text}");
    let at = text.find(from).unwrap();
    let mut out = bytes.to_vec();
    out[at..at + to.len()].copy_from_slice(to.as_bytes());
    out
}

#[test]
fn a_dtype_edited_in_the_header_is_refused() {
    let good = file_with_seed("7");
    assert!(io::load_from_bytes(&good, Device::Cpu).is_ok());
    // F32 -> I32: 4 bytes an element either way, so the file is well-formed and, without
    // the header in the checksum, loaded the float bits as integers.
    let bad = edit(&good, "\"dtype\":\"F32\"", "\"dtype\":\"I32\"");
    let e = io::load_from_bytes(&bad, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("checksum mismatch"), "{e}");
    assert!(e.contains("corrupted or was edited"), "{e}");
    assert!(
        e.contains(&file_crc(&good)) && e.contains(&file_crc(&bad)),
        "{e}"
    );
}

#[test]
fn a_metadata_value_edited_is_refused() {
    let good = file_with_seed("7");
    let (_, meta) = io::load_from_bytes(&good, Device::Cpu).unwrap();
    assert_eq!(meta["seed"], "7");
    let bad = edit(&good, "\"seed\":\"7\"", "\"seed\":\"8\"");
    let e = io::load_from_bytes(&bad, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("checksum mismatch"), "{e}");
    // The checksum's own digits edited: refused as well.
    let at = checksum_at(&good);
    let mut bad = good.clone();
    bad[at] = if bad[at] == b'0' { b'1' } else { b'0' };
    let e = io::load_from_bytes(&bad, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("checksum mismatch"), "{e}");
}

#[test]
fn a_header_rewritten_by_another_tool_is_refused() {
    // The same entries, the checksum no longer first (as a tool re-serialising the JSON
    // with its keys sorted leaves it, "arch" before "ember.checksum"): the checksum cannot
    // be checked, so the file is refused.
    let a = Tensor::from_vec(vec![1.5f32, -2.0], [2], Device::Cpu).unwrap();
    let meta = BTreeMap::from([("arch".to_string(), "mlp".to_string())]);
    let good = io::save_to_bytes([("a", &a)], &meta).unwrap();
    let (tensors, meta) = io::load_from_bytes(&good, Device::Cpu).unwrap();
    let data = tensors["a"].to_vec::<f32>().unwrap();
    let data: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    // Written by hand, not by `safetensors::serialize`, whose metadata map is a `HashMap`:
    // its order would put the checksum first in some runs.
    let mut header = format!(
        r#"{{"__metadata__":{{"arch":"mlp","ember.checksum":"{}"}},"a":{{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}}}"#,
        meta["ember.checksum"]
    );
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&data);
    let e = io::load_from_bytes(&bytes, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not the header's first entry"), "{e}");
}

#[test]
fn files_of_the_data_only_checksum_still_load_and_are_checked() {
    // Files of earlier Ember versions: `ember.crc32` over the data section alone.
    let data: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let file = |crc: u32| {
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data).unwrap();
        let meta = std::collections::HashMap::from([(
            io::DATA_CHECKSUM_KEY.to_string(),
            format!("{crc:08x}"),
        )]);
        safetensors::serialize([("w", view)], Some(meta)).unwrap()
    };
    let crc = crc32fast::hash(&data);
    let (t, _) = io::load_from_bytes(&file(crc), Device::Cpu).unwrap();
    assert_eq!(t["w"].to_vec::<f32>().unwrap(), vec![1.5, -2.0]);
    let e = io::load_from_bytes(&file(crc ^ 1), Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("checksum mismatch") && e.contains("of the data"),
        "{e}"
    );
}

#[test]
fn files_without_a_checksum_still_load_and_a_bad_one_is_an_error() {
    // As PyTorch's `safetensors.torch.save_file` writes: no checksum.
    let data: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data).unwrap();
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes = safetensors::serialize([("w", view)], Some(meta)).unwrap();
    let (t, m) = io::load_from_bytes(&bytes, Device::Cpu).unwrap();
    assert_eq!(t["w"].to_vec::<f32>().unwrap(), vec![1.5, -2.0]);
    assert!(!m.contains_key(io::CHECKSUM_KEY));

    // A checksum that is not 8 hex digits is refused.
    let w = Tensor::from_vec(vec![1f32], [1], Device::Cpu).unwrap();
    let good = io::save_to_bytes([("w", &w)], &BTreeMap::new()).unwrap();
    let at = checksum_at(&good);
    let mut bad = good.clone();
    bad[at..at + 2].copy_from_slice(b"zz");
    let e = io::load_from_bytes(&bad, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected 8 hex digits"), "{e}");
    // A caller's value for either key is replaced by the computed one.
    let meta = BTreeMap::from([
        (io::CHECKSUM_KEY.to_string(), "00000000".to_string()),
        (io::DATA_CHECKSUM_KEY.to_string(), "00000000".to_string()),
    ]);
    let again = io::save_to_bytes([("w", &w)], &meta).unwrap();
    assert_eq!(again, good);
}

#[cfg(unix)]
#[test]
fn saving_through_a_symbolic_link_writes_its_target() {
    let dir = tmp_dir("symlink");
    std::fs::create_dir_all(dir.join("real")).unwrap();
    let target = dir.join("real").join("ckpt.safetensors");
    let link = dir.join("latest.safetensors");
    // A relative link, to a file that does not exist yet.
    std::os::unix::fs::symlink("real/ckpt.safetensors", &link).unwrap();
    let w = Tensor::from_vec(vec![1f32, 2.0], [2], Device::Cpu).unwrap();
    io::save([("w", &w)], &link).unwrap();
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(std::fs::symlink_metadata(&target).unwrap().is_file());
    // Saved again through the link: the target changes, the link stays.
    let w2 = Tensor::from_vec(vec![5f32, 6.0, 7.0], [3], Device::Cpu).unwrap();
    io::save([("w", &w2)], &link).unwrap();
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        io::load(&target, Device::Cpu).unwrap()["w"]
            .to_vec::<f32>()
            .unwrap(),
        vec![5.0, 6.0, 7.0]
    );
    // No temporary file beside the link or the target.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    assert_eq!(std::fs::read_dir(dir.join("real")).unwrap().count(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(target_os = "linux")]
#[test]
fn stale_temporary_files_of_killed_saves_are_removed() {
    let dir = tmp_dir("stale");
    let path = dir.join("ckpt.safetensors");
    let me = std::process::id();
    // A process that is gone (above Linux's largest pid), one that runs (pid 1), this
    // process, another target's, and a look-alike that is not a temporary name.
    let names = [
        ".ckpt.safetensors.tmp-4194305-0".to_string(),
        ".ckpt.safetensors.tmp-4194305-17".to_string(),
        ".ckpt.safetensors.tmp-1-0".to_string(),
        format!(".ckpt.safetensors.tmp-{me}-999999"),
        ".other.safetensors.tmp-4194305-0".to_string(),
        ".ckpt.safetensors.tmp-4194305-x".to_string(),
    ];
    for n in &names {
        std::fs::write(dir.join(n), vec![0u8; 1024]).unwrap();
    }
    let w = Tensor::ones([4], ()).unwrap();
    io::save([("w", &w)], &path).unwrap();
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    let mut want = vec![
        "ckpt.safetensors".to_string(),
        names[2].clone(),
        names[3].clone(),
        names[4].clone(),
        names[5].clone(),
    ];
    want.sort();
    assert_eq!(left, want);
    std::fs::remove_dir_all(&dir).unwrap();
}
