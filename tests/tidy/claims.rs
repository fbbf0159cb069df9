//! The checks that keep the README's and the code map's claims true (see the crate's doc in
//! `tidy.rs`): figures come from saved measurements, status cells stay one short line, and
//! the code map stays a map.

use super::{files_under, read, rel, workspace_root};

/// The most lines `docs/ARCHITECTURE.md` may have: a codemap, not a history.
const MAX_ARCHITECTURE_LINES: usize = 350;

/// The most words a cell of the README's status table may have (figures and history go to
/// `docs/performance.md` and the commit log).
const MAX_STATUS_CELL_WORDS: usize = 40;

// ---- figures --------------------------------------------------------------------------------

/// The units a measured figure is written with, longest first so that `ms` is not read as
/// `m`; `x` and `×` are ratios.
const UNITS: [&str; 21] = [
    "samples/s",
    "steps/s",
    "GFLOP/s",
    "TFLOP/s",
    "GB/s",
    "TB/s",
    "MB/s",
    "KiB",
    "MiB",
    "GiB",
    "µs",
    "us",
    "ns",
    "ms",
    "MB",
    "GB",
    "KB",
    "s",
    "%",
    "×",
    "x",
];

/// A number written with a unit or as a ratio: `0.66x`, `1.7×`, `0.25 ms`, `+127%`.
#[derive(Debug, PartialEq)]
struct Figure {
    number: String,
    unit: &'static str,
}

impl std::fmt::Display for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.unit {
            "x" | "×" | "%" => write!(f, "{}{}", self.number, self.unit),
            unit => write!(f, "{} {unit}", self.number),
        }
    }
}

impl Figure {
    /// The unit as the saved records spell it (`µs` is `us`; every ratio is `×`).
    fn record_unit(&self) -> &'static str {
        match self.unit {
            "µs" => "us",
            "x" => "×",
            u => u,
        }
    }
}

/// The figures of `line`: a number that does not continue a word or a version (`H200`,
/// `sm_90`, `1.95.0`), followed by at most one space and a unit that ends there (`8x8` and
/// `2 steps` are not figures).
fn figures(line: &str) -> Vec<Figure> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = chars[i].is_ascii_digit()
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || "._-".contains(chars[i - 1])));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len()
            && (chars[j].is_ascii_digit()
                || chars[j] == '.' && chars.get(j + 1).is_some_and(char::is_ascii_digit))
        {
            j += 1;
        }
        let number: String = chars[i..j].iter().collect();
        let at = if chars.get(j) == Some(&' ') { j + 1 } else { j };
        let rest: String = chars[at.min(chars.len())..].iter().collect();
        let unit = UNITS.into_iter().find(|u| {
            rest.strip_prefix(u).is_some_and(|after| {
                !after
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        });
        if let Some(unit) = unit {
            out.push(Figure { number, unit });
        }
        i = j;
    }
    out
}

/// Whether `value` written with as many decimals as `number` has is `number`.
fn rounds_to(value: f64, number: &str) -> bool {
    let decimals = number.split_once('.').map_or(0, |(_, d)| d.len());
    format!("{value:.decimals$}") == number
}

/// Every measured value of the saved results, with its unit (`×` for ratios).
fn saved_values() -> Vec<(String, f64)> {
    let mut files = Vec::new();
    files_under(
        &workspace_root().join("bench").join("results"),
        &["json"],
        &mut files,
    );
    let mut out = Vec::new();
    for f in files {
        let json: serde_json::Value = serde_json::from_str(&read(&f))
            .unwrap_or_else(|e| panic!("{}: not JSON: {e}", rel(&f)));
        let records = json.get("records").and_then(|r| r.as_array());
        for r in records.into_iter().flatten() {
            let unit = r.get("unit").and_then(|u| u.as_str()).unwrap_or("");
            let Some(fields) = r.as_object() else {
                continue;
            };
            for (key, v) in fields {
                let Some(v) = v.as_f64() else {
                    continue;
                };
                if ["ember", "torch", "value"].contains(&key.as_str()) {
                    out.push((unit.to_string(), v));
                } else if ["ratio", "speedup", "fraction"]
                    .iter()
                    .any(|k| key.contains(k))
                {
                    out.push(("×".to_string(), v));
                }
            }
        }
    }
    out
}

/// Whether `figure` is a saved measurement: a record's value in its unit (or a ratio) that
/// rounds to it, or the same text in the generated `docs/performance.md`.
fn is_saved(figure: &Figure, values: &[(String, f64)], performance: &str) -> bool {
    values
        .iter()
        .any(|(u, v)| u == figure.record_unit() && rounds_to(*v, &figure.number))
        || performance.contains(&format!("{} {}", figure.number, figure.unit))
        || performance.contains(&format!("{}{}", figure.number, figure.unit))
}

#[test]
fn readme_figures_come_from_saved_results() {
    let root = workspace_root();
    let values = saved_values();
    assert!(
        values.len() > 100,
        "found only {} saved values under bench/results: is the scan broken?",
        values.len()
    );
    let performance = read(&root.join("docs").join("performance.md"));
    let mut unsaved = Vec::new();
    for (i, line) in read(&root.join("README.md")).lines().enumerate() {
        for f in figures(line) {
            if !is_saved(&f, &values, &performance) {
                unsaved.push(format!("README.md:{}: {f}", i + 1));
            }
        }
    }
    assert!(
        unsaved.is_empty(),
        "figures in README.md that no file of bench/results/ nor docs/performance.md holds \
         (link to docs/performance.md instead of copying or deriving figures):\n{}",
        unsaved.join("\n")
    );
}

#[test]
fn readme_status_cells_are_short() {
    let text = read(&workspace_root().join("README.md"));
    let table = text
        .split("## Status")
        .nth(1)
        .expect("README.md has a `## Status` section");
    let mut long = Vec::new();
    for row in table.lines().filter(|l| l.starts_with('|')) {
        for cell in row.split(" | ") {
            // A link's target is not words of the cell.
            let words = cell
                .split_whitespace()
                .filter(|w| !w.contains("]("))
                .count();
            if words > MAX_STATUS_CELL_WORDS {
                long.push(format!("{words} words: {}", cell.trim()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "README status cells over {MAX_STATUS_CELL_WORDS} words (one line each; figures go \
         to docs/performance.md):\n{}",
        long.join("\n")
    );
}

// ---- the code map ---------------------------------------------------------------------------

#[test]
fn the_code_map_is_short_and_has_no_figures() {
    let text = read(&workspace_root().join("docs").join("ARCHITECTURE.md"));
    let lines = text.lines().count();
    assert!(
        lines <= MAX_ARCHITECTURE_LINES,
        "docs/ARCHITECTURE.md has {lines} lines, over {MAX_ARCHITECTURE_LINES}: it maps the \
         code; history goes to the commit log, reasons to a Note in the code or a focused page"
    );
    let found: Vec<String> = text
        .lines()
        .enumerate()
        .flat_map(|(i, l)| {
            figures(l)
                .into_iter()
                .map(move |f| format!("docs/ARCHITECTURE.md:{}: {f}", i + 1))
        })
        .collect();
    assert!(
        found.is_empty(),
        "measurements in the code map (they belong in docs/performance.md):\n{}",
        found.join("\n")
    );
}

#[test]
fn every_crate_has_a_section_in_the_code_map() {
    let root = workspace_root();
    let text = read(&root.join("docs").join("ARCHITECTURE.md"));
    let headings: Vec<&str> = text.lines().filter(|l| l.starts_with("### ")).collect();
    let crates = std::fs::read_dir(root.join("crates")).unwrap();
    let mut missing: Vec<String> = crates
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .map(|p| rel(&p))
        .filter(|c| {
            !headings
                .iter()
                .any(|h| h.contains(&format!("`{c}`")) || h.contains(&format!("`{c}/`")))
        })
        .collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "crates without a `### `crates/x`` section in docs/ARCHITECTURE.md: {missing:?}"
    );
}

#[test]
fn the_figure_scan_finds_units_and_ratios() {
    let f = |n: &str, unit: &'static str| Figure {
        number: n.to_string(),
        unit,
    };
    assert_eq!(
        figures("steps run 5x and 1.7× PyTorch's; 0.66x behind"),
        vec![f("5", "x"), f("1.7", "×"), f("0.66", "x")]
    );
    assert_eq!(
        figures("took 0.25 ms to 0.57ms (+127%), 8 µs per launch, 10.24 MB"),
        vec![
            f("0.25", "ms"),
            f("0.57", "ms"),
            f("127", "%"),
            f("8", "µs"),
            f("10.24", "MB")
        ]
    );
    // Not figures: dimensions, names, versions, counts of things.
    assert!(
        figures("the 8x8 digits on an H200 at sm_90, Rust 1.95.0, 2 steps, 3 ranks, a6fbd13")
            .is_empty()
    );
    assert!(rounds_to(1.681, "1.7") && rounds_to(5.007, "5") && !rounds_to(0.6624, "0.67"));
    let values = [("×".to_string(), 0.6624), ("ms".to_string(), 0.05555)];
    assert!(is_saved(&f("0.66", "x"), &values, ""));
    assert!(is_saved(&f("0.056", "ms"), &values, ""));
    assert!(!is_saved(&f("0.66", "ms"), &values, ""));
    assert!(!is_saved(&f("127", "%"), &values, ""));
    assert!(is_saved(
        &f("2.851", "ms"),
        &[],
        "| convolutions | 91.0 | 2.851 ms |"
    ));
}
