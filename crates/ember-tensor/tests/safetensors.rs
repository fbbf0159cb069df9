#![allow(clippy::unwrap_used)]
//! safetensors save/load: bit-exact round trips over every dtype, atomic writes, malformed
//! files as errors, and a loader fuzz (proptest over mutated and arbitrary bytes).

use std::collections::BTreeMap;
use std::path::PathBuf;

use ember_tensor::{DType, Device, Tensor, TensorError, io};
use half::{bf16, f16};
use proptest::prelude::*;

const CPU: Device = Device::Cpu;

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-st-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn all_dtypes() -> Vec<(String, Tensor)> {
    let v = |x: Vec<f32>| x;
    vec![
        (
            "f32".into(),
            Tensor::from_vec(
                v(vec![1.5, -0.0, f32::INFINITY, f32::NAN, 1e-40, 3.0]),
                [2, 3],
                CPU,
            )
            .unwrap(),
        ),
        (
            "f64".into(),
            Tensor::from_vec(
                vec![std::f64::consts::PI, -1e300, f64::MIN_POSITIVE],
                [3],
                CPU,
            )
            .unwrap(),
        ),
        (
            "f16".into(),
            Tensor::from_vec(
                vec![f16::from_f32(0.1), f16::MAX, f16::from_bits(0x7e01)],
                [3, 1],
                CPU,
            )
            .unwrap(),
        ),
        (
            "bf16".into(),
            Tensor::from_vec(vec![bf16::from_f32(-2.5), bf16::MIN_POSITIVE], [2], CPU).unwrap(),
        ),
        (
            "i64".into(),
            Tensor::from_vec(vec![i64::MIN, 0, i64::MAX], [3], CPU).unwrap(),
        ),
        (
            "i32".into(),
            Tensor::from_vec(vec![i32::MIN, -1, 7, i32::MAX], [2, 2], CPU).unwrap(),
        ),
        (
            "u8".into(),
            Tensor::from_vec(vec![0u8, 255, 17], [3], CPU).unwrap(),
        ),
        (
            "bool".into(),
            Tensor::from_vec(vec![true, false, true], [3], CPU).unwrap(),
        ),
        ("scalar".into(), Tensor::scalar(42i32, CPU).unwrap()),
        ("empty".into(), Tensor::zeros([0, 4], ()).unwrap()),
    ]
}

/// Bit patterns of any tensor, for exact comparison (NaN payloads included).
fn bits(t: &Tensor) -> Vec<u64> {
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        DType::F64 => t
            .to_vec::<f64>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect(),
        DType::F16 => t
            .to_vec::<f16>()
            .unwrap()
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        DType::Bf16 => t
            .to_vec::<bf16>()
            .unwrap()
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        _ => t
            .to_dtype(DType::I64)
            .unwrap()
            .to_vec::<i64>()
            .unwrap()
            .iter()
            .map(|&x| x as u64)
            .collect(),
    }
}

fn valid_bytes() -> Vec<u8> {
    let ts = all_dtypes();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    io::save_to_bytes(ts.iter().map(|(n, t)| (n.as_str(), t)), &meta).unwrap()
}

#[test]
fn round_trip_is_bit_exact_for_every_dtype_with_metadata() {
    let dir = tmp_dir("roundtrip");
    let path = dir.join("all.safetensors");
    let ts = all_dtypes();
    let meta = BTreeMap::from([("epoch".to_string(), "3".to_string())]);
    io::save_with_metadata(ts.iter().map(|(n, t)| (n.as_str(), t)), &meta, &path).unwrap();
    let (loaded, mut m) = io::load_with_metadata(&path, CPU).unwrap();
    // Beside the caller's metadata, the data's checksum (Note [Checkpoint checksum]).
    assert_eq!(m.remove(io::CHECKSUM_KEY).map(|c| c.len()), Some(8));
    assert_eq!(m, meta);
    assert_eq!(loaded.len(), ts.len());
    for (name, t) in &ts {
        let l = &loaded[name];
        assert_eq!((l.dims(), l.dtype()), (t.dims(), t.dtype()), "{name}");
        assert_eq!(bits(l), bits(t), "{name}");
    }
    let (from_bytes, _) = io::load_from_bytes(&std::fs::read(&path).unwrap(), CPU).unwrap();
    assert_eq!(
        from_bytes.keys().collect::<Vec<_>>(),
        loaded.keys().collect::<Vec<_>>()
    );
    // No temporary file is left beside the result.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn non_contiguous_tensors_are_saved_contiguous() {
    let dir = tmp_dir("strided");
    let path = dir.join("t.safetensors");
    let a = Tensor::arange(0, 12, DType::I32)
        .unwrap()
        .reshape([3, 4])
        .unwrap();
    let t = a.t().unwrap();
    let s = a.narrow(1, 1, 2).unwrap();
    io::save([("t", &t), ("s", &s)], &path).unwrap();
    let l = io::load(&path, CPU).unwrap();
    assert!(l["t"].is_contiguous());
    assert_eq!(
        l["t"].to_vec2::<i32>().unwrap(),
        t.to_vec2::<i32>().unwrap()
    );
    assert_eq!(
        l["s"].to_vec2::<i32>().unwrap(),
        s.to_vec2::<i32>().unwrap()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn failed_saves_leave_the_existing_file_and_no_temporary() {
    let dir = tmp_dir("atomic");
    let path = dir.join("ckpt.safetensors");
    let a = Tensor::ones([4], ()).unwrap();
    io::save([("a", &a)], &path).unwrap();
    let before = std::fs::read(&path).unwrap();
    let b = Tensor::zeros([8], ()).unwrap();
    // A duplicate name: refused before anything is written.
    let e = io::save([("a", &b), ("a", &b)], &path).unwrap_err();
    assert!(e.to_string().contains("duplicate tensor name \"a\""), "{e}");
    assert!(io::save([("__metadata__", &b)], &path).is_err());
    // A directory that does not exist.
    let e = io::save([("a", &b)], dir.join("missing").join("x.safetensors")).unwrap_err();
    assert!(
        matches!(
            e,
            TensorError::File {
                op: "save",
                io_kind: Some(_),
                ..
            }
        ),
        "{e}"
    );
    // A target that cannot be replaced (a non-empty directory): the write happens, the
    // rename fails, the temporary is removed.
    let blocker = dir.join("blocker");
    std::fs::create_dir_all(blocker.join("inside")).unwrap();
    assert!(io::save([("a", &b)], &blocker).is_err());
    assert!(blocker.join("inside").is_dir());
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["blocker", "ckpt.safetensors"]);
    // Overwriting works and replaces the contents.
    io::save([("b", &b)], &path).unwrap();
    assert_eq!(io::load(&path, CPU).unwrap()["b"].dims(), &[8]);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn load_err(bytes: &[u8]) -> String {
    io::load_from_bytes(bytes, CPU).unwrap_err().to_string()
}

fn with_header(header: &str, data: &[u8]) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    b
}

#[test]
fn malformed_files_are_errors_naming_the_problem() {
    let good = valid_bytes();
    assert!(load_err(&good[..5]).contains("truncated: expected at least 8 bytes"));
    assert!(load_err(&good[..good.len() - 1]).starts_with("load <bytes>: "));
    assert!(load_err(&good[..40]).contains("header claims"));
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(load_err(&huge).contains("over the limit"));
    assert!(load_err(&with_header("{\"a\": 1", &[])).contains("not a valid JSON object"));
    assert!(load_err(&with_header("[1, 2]", &[])).contains("not a valid JSON object"));
    let mut bad_utf8 = with_header("{}", &[]);
    bad_utf8[8] = 0xff;
    assert!(load_err(&bad_utf8).contains("UTF-8"));
    let e = load_err(&with_header(
        r#"{"x":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}}"#,
        &[0; 8],
    ));
    assert!(e.contains("tensor \"x\": unsupported dtype \"C64\""), "{e}");
    let e = load_err(&with_header(
        r#"{"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
        &[0; 8],
    ));
    assert!(
        e.contains("needs 12 bytes, but its data offsets [0, 8] span 8"),
        "{e}"
    );
    let e = load_err(&with_header(
        r#"{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
        &[0; 8],
    ));
    assert!(e.contains("outside the 8 data bytes"), "{e}");
    let e = load_err(&with_header(
        r#"{"x":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}}"#,
        &[0; 8],
    ));
    assert!(e.contains("too large"), "{e}");
    let dup = r#"{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
    assert!(load_err(&with_header(dup, &[1, 2])).contains("duplicate tensor name \"x\""));
    let e = load_err(&with_header(
        r#"{"x":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}"#,
        &[1, 7],
    ));
    assert!(e.contains("bool element 1 is byte 7"), "{e}");
    let e = load_err(&with_header(r#"{"x":{"dtype":"U8","shape":[2]}}"#, &[1, 7]));
    assert!(e.contains("tensor \"x\": expected"), "{e}");
    // Offsets that leave a gap or extra bytes are caught by the safetensors crate.
    let e = load_err(&with_header(
        r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
        &[1, 7],
    ));
    assert!(e.contains("invalid safetensors data"), "{e}");
    let e = io::load("/nonexistent/dir/model.safetensors", CPU).unwrap_err();
    assert!(matches!(
        &e,
        TensorError::File {
            io_kind: Some(std::io::ErrorKind::NotFound),
            ..
        }
    ));
    assert!(
        e.to_string()
            .starts_with("load /nonexistent/dir/model.safetensors: read: "),
        "{e}"
    );
    // Loading onto a CUDA device works where CUDA (or the emulator) is available.
    let on_cuda = io::load_from_bytes(&good, Device::Cuda(0));
    assert_eq!(on_cuda.is_ok(), ember_device::cuda::is_available());
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Prefix(u64),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        prop_oneof![any::<u64>(), 0u64..2000].prop_map(Mutation::Prefix),
    ]
}

fn apply(mut b: Vec<u8>, m: &[Mutation]) -> Vec<u8> {
    for m in m {
        match m {
            Mutation::Flip(i, bit) if !b.is_empty() => {
                let i = i % b.len();
                b[i] ^= 1 << bit;
            }
            Mutation::Truncate(n) => b.truncate(n % (b.len() + 1)),
            Mutation::Insert(i, v) => {
                let i = i % (b.len() + 1);
                b.splice(i..i, v.iter().copied());
            }
            Mutation::Prefix(n) if b.len() >= 8 => b[..8].copy_from_slice(&n.to_le_bytes()),
            _ => {}
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn mutated_files_never_panic(ms in proptest::collection::vec(mutation(), 1..4)) {
        let b = apply(valid_bytes(), &ms);
        match io::load_from_bytes(&b, CPU) {
            Ok((ts, _)) => for t in ts.values() { prop_assert!(t.numel() <= b.len()); },
            Err(e) => prop_assert!(e.to_string().starts_with("load <bytes>: "), "{}", e),
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = io::load_from_bytes(&b, CPU);
        let mut framed = ((b.len() as u64).saturating_sub(4)).to_le_bytes().to_vec();
        framed.extend_from_slice(&b);
        let _ = io::load_from_bytes(&framed, CPU);
    }
}
