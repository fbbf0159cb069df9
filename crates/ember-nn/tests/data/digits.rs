//! The shipped digits dataset: contents, parse errors, the split, training through a loader.

use super::*;

/// The shipped file: under the workspace's `data/`, or under `EMBER_DATA_DIR` where the tests
/// run from a GPU bundle (`cargo xtask gpu-session` sets it), away from the checkout.
fn digits_file() -> std::path::PathBuf {
    std::env::var_os("EMBER_DATA_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../data").into())
        .join("digits")
        .join("digits.csv.gz")
}

/// The shipped file decompressed and split into rows of numbers by a reader independent of
/// the library's parser.
fn reference_rows() -> Vec<Vec<u32>> {
    let gz = std::fs::read(digits_file()).unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut text)
        .unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split(',').map(|v| v.trim().parse().unwrap()).collect())
        .collect()
}

#[test]
fn digits_match_the_file() {
    let d = digits::load().unwrap();
    assert_eq!(d.len(), 1797);
    assert_eq!(d.len(), digits::NUM_SAMPLES);
    assert_eq!(d.images.dims(), vec![1797, 64]);
    assert_eq!(d.images.dtype(), DType::F32);
    assert_eq!(d.labels.dims(), vec![1797]);
    assert_eq!(d.labels.dtype(), DType::I64);

    let rows = reference_rows();
    assert_eq!(rows.len(), 1797);
    let mut expected = [0usize; 10];
    for r in &rows {
        assert_eq!(r.len(), 65);
        expected[r[64] as usize] += 1;
    }
    let counts = d.class_counts().unwrap();
    assert_eq!(counts, expected);
    // The test set of UCI optdigits (its documented class distribution).
    assert_eq!(counts, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]);
    assert!(counts.iter().all(|&c| c > 0));

    // Every value agrees with the reference reader; the first line spelled out.
    let images = d.images.to_vec::<f32>().unwrap();
    let labels = d.labels.to_vec::<i64>().unwrap();
    let first = "0,0,5,13,9,1,0,0,0,0,13,15,10,15,5,0,0,3,15,2,0,11,8,0,0,4,12,0,0,8,8,0,0,5,8,0,0,9,8,0,0,4,11,0,1,12,7,0,0,2,14,5,10,12,0,0,0,0,6,13,10,0,0,0,0";
    let first: Vec<f32> = first.split(',').map(|v| v.parse().unwrap()).collect();
    assert_eq!(&images[..64], &first[..64]);
    assert_eq!(labels[0], 0);
    for (i, r) in rows.iter().enumerate() {
        let px: Vec<f32> = r[..64].iter().map(|&v| v as f32).collect();
        assert_eq!(&images[64 * i..64 * (i + 1)], &px[..], "row {i}");
        assert_eq!(labels[i], i64::from(r[64]), "row {i}");
    }
    assert!(images.iter().all(|&v| (0.0..=16.0).contains(&v)));
    assert_eq!(images.iter().cloned().fold(0.0f32, f32::max), 16.0);

    // The embedded copy is the file; load_from_path reads the same.
    assert_eq!(
        digits::embedded_bytes(),
        &std::fs::read(digits_file()).unwrap()[..]
    );
    let again = digits::load_from_path(digits_file()).unwrap();
    assert_eq!(again.labels.to_vec::<i64>().unwrap(), labels);
    let e = digits::load_from_path("/nonexistent/digits.csv.gz").unwrap_err();
    assert!(
        matches!(e.downcast_ref::<NnError>(), Some(NnError::Io { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("/nonexistent/digits.csv.gz"), "{e}");
}

fn gzip(text: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(text).unwrap();
    enc.finish().unwrap()
}

fn parse_err(text: &str) -> String {
    let e = digits::parse(&gzip(text.as_bytes())).unwrap_err();
    assert!(
        matches!(e.downcast_ref::<NnError>(), Some(NnError::Data(_))),
        "{e}"
    );
    e.to_string()
}

fn line(pixels: &str, label: &str) -> String {
    format!("{}{pixels},{label}\n", "1,".repeat(63))
}

#[test]
fn digits_parse_errors_name_the_line_and_the_problem() {
    let good = line("2", "3");
    // A small valid file, with CRLF, blank lines and spaces.
    let d = digits::parse(&gzip(
        format!("{good}\r\n{}\n \n", line(" 16 ", "9.0").trim_end()).as_bytes(),
    ))
    .unwrap();
    assert_eq!(d.len(), 2);
    assert_eq!(d.labels.to_vec::<i64>().unwrap(), vec![3, 9]);
    assert_eq!(d.images.to_vec::<f32>().unwrap()[64 + 63], 16.0);

    let msg = parse_err(&format!("{good}1,2,3\n"));
    assert!(msg.contains("line 2") && msg.contains("found 3"), "{msg}");
    let msg = parse_err(&format!("{good}{good}{}", line("x7", "1")));
    assert!(
        msg.contains("line 3") && msg.contains("not an integer") && msg.contains("x7"),
        "{msg}"
    );
    let msg = parse_err(&line("17", "1"));
    assert!(
        msg.contains("line 1") && msg.contains("pixel 63") && msg.contains("0..=16"),
        "{msg}"
    );
    let msg = parse_err(&line("-1", "1"));
    assert!(msg.contains("0..=16"), "{msg}");
    let msg = parse_err(&line("1", "10"));
    assert!(msg.contains("the label") && msg.contains("0..=9"), "{msg}");
    let msg = parse_err(&line("1.5", "1"));
    assert!(msg.contains("not an integer"), "{msg}");
    for bad in ["nan", "inf", "1e1", "", "+", "0x1"] {
        let msg = parse_err(&line(bad, "1"));
        assert!(msg.contains("not an integer"), "{bad}: {msg}");
    }
    let msg = parse_err("\n\n");
    assert!(msg.contains("no samples"), "{msg}");

    // Not gzip, truncated gzip, corrupt gzip.
    let real = digits::embedded_bytes();
    let msg = digits::parse(b"0,0,1").unwrap_err().to_string();
    assert!(msg.contains("not gzip"), "{msg}");
    assert!(
        digits::parse(&[])
            .unwrap_err()
            .to_string()
            .contains("not gzip")
    );
    let msg = digits::parse(&real[..real.len() / 2])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("corrupt or truncated"), "{msg}");
    let msg = digits::parse(&real[..real.len() - 4])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("corrupt or truncated"), "{msg}");
    let mut flipped = real.to_vec();
    flipped[1000] ^= 0x55;
    assert!(digits::parse(&flipped).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Mutated gzip bytes: never a panic; a file that parses has a sane shape.
    #[test]
    fn digits_parse_never_panics_on_mutated_gzip(
        edits in prop::collection::vec((0usize..57_523, any::<u8>()), 1..8),
        cut in prop::option::of(0usize..57_523),
    ) {
        let mut bytes = digits::embedded_bytes().to_vec();
        for (pos, v) in edits {
            let i = pos % bytes.len();
            bytes[i] = v;
        }
        if let Some(c) = cut {
            bytes.truncate(c);
        }
        if let Ok(d) = digits::parse(&bytes) {
            prop_assert_eq!(d.images.dims(), vec![d.len(), 64]);
        }
    }

    /// Mutated CSV text (re-compressed, so the gzip layer is valid): Ok or an error naming
    /// a line, never a panic.
    #[test]
    fn digits_parse_never_panics_on_mutated_csv(
        edits in prop::collection::vec(
            (0usize..10_000, prop::sample::select(b"0123456789,.-+ \n\rx\xff".to_vec())),
            1..6,
        ),
        cut in prop::option::of(0usize..10_000),
    ) {
        let mut gz = flate2::read::GzDecoder::new(digits::embedded_bytes());
        let mut text = Vec::new();
        gz.read_to_end(&mut text).unwrap();
        text.truncate(10_000);
        for (pos, v) in edits {
            let i = pos % text.len();
            text[i] = v;
        }
        if let Some(c) = cut {
            text.truncate(c);
        }
        match digits::parse(&gzip(&text)) {
            Ok(d) => {
                let imgs = d.images.to_vec::<f32>().unwrap();
                prop_assert!(imgs.iter().all(|v| (0.0..=16.0).contains(v)));
                let ls = d.labels.to_vec::<i64>().unwrap();
                prop_assert!(ls.iter().all(|v| (0..=9).contains(v)));
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains("line ") || msg.contains("no samples"), "{}", msg);
            }
        }
    }
}

#[test]
fn digits_split_is_deterministic_and_disjoint() {
    let d = digits::load().unwrap();
    let (train, val) = d.split(0.25, 11).unwrap();
    assert_eq!(val.len(), 449); // round(1797 * 0.25)
    assert_eq!(train.len() + val.len(), 1797);
    let (train2, val2) = d.split(0.25, 11).unwrap();
    assert_eq!(
        val.labels.to_vec::<i64>().unwrap(),
        val2.labels.to_vec::<i64>().unwrap()
    );
    assert_eq!(
        train.images.to_vec::<f32>().unwrap(),
        train2.images.to_vec::<f32>().unwrap()
    );
    let (_, val3) = d.split(0.25, 12).unwrap();
    assert_ne!(
        val.images.to_vec::<f32>().unwrap(),
        val3.images.to_vec::<f32>().unwrap()
    );
    // Together the parts hold every sample once: per-class counts add up.
    let (a, b) = (train.class_counts().unwrap(), val.class_counts().unwrap());
    let all = d.class_counts().unwrap();
    for k in 0..10 {
        assert_eq!(a[k] + b[k], all[k]);
    }
    // The parts' image rows are rows of the original, each used once.
    let rows = |x: &digits::Digits| -> Vec<Vec<u32>> {
        x.images
            .to_vec::<f32>()
            .unwrap()
            .chunks(64)
            .map(|r| r.iter().map(|&v| v as u32).collect())
            .collect()
    };
    let mut both = rows(&train);
    both.extend(rows(&val));
    both.sort();
    let mut orig = rows(&d);
    orig.sort();
    assert_eq!(both, orig);
    // Edges and errors.
    let (t, v) = d.split(0.0, 0).unwrap();
    assert_eq!((t.len(), v.len()), (1797, 0));
    let (t, v) = d.split(1.0, 0).unwrap();
    assert_eq!((t.len(), v.len()), (0, 1797));
    for bad in [-0.1, 1.5, f64::NAN] {
        assert!(d.split(bad, 0).is_err(), "{bad}");
    }
}

#[test]
fn digits_train_through_a_loader() {
    let d = digits::load().unwrap();
    let (train, _) = d.split(0.2, 0).unwrap();
    let l = DataLoader::new(Arc::new(train.dataset().unwrap()))
        .batch_size(64)
        .shuffle(true)
        .seed(0)
        .num_workers(2)
        .pin_memory(true);
    assert_eq!(l.len(), 1438usize.div_ceil(64));
    let mut n = 0;
    for b in l.iter().unwrap() {
        let b = b.unwrap();
        assert_eq!(b[0].dims()[1], 64);
        assert_eq!(b[0].dims()[0], b[1].dims()[0]);
        n += b[1].numel();
    }
    assert_eq!(n, 1438);
}
