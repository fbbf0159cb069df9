//! Tidy checks as tests (after rust-analyzer's `xtask/src/tidy.rs`): every `unsafe` block,
//! impl or fn carries a `// SAFETY:` comment (or a `# Safety` doc section for `unsafe fn`),
//! and source files stay within their length budget.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

/// Files longer than this are split by concern (STYLE.md: ~800 lines).
const MAX_LINES: usize = 1000;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() {
            if name != "target" && name != ".git" {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn sources() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = Vec::new();
    for dir in ["crates", "xtask", "tests", "kernels"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(
        !files.is_empty(),
        "no sources found under {}",
        root.display()
    );
    files
}

/// Whether line `i` of `lines` opens an `unsafe` block or impl (not a fn signature, not a
/// mention in a comment or string).
fn opens_unsafe(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    if code.contains('"') {
        return false;
    }
    code.contains("unsafe {") || code.contains("unsafe impl")
}

fn has_safety_comment(lines: &[&str], i: usize) -> bool {
    if lines[i].contains("SAFETY:") {
        return true;
    }
    // Look upward through comments, attributes and the statement's start.
    let mut j = i;
    let mut budget = 12;
    while j > 0 && budget > 0 {
        j -= 1;
        budget -= 1;
        let l = lines[j].trim();
        if l.contains("SAFETY:") {
            return true;
        }
        if l.is_empty() || l.ends_with(';') && !l.starts_with("//") || l.ends_with('}') {
            return false;
        }
    }
    false
}

#[test]
fn every_unsafe_block_has_a_safety_comment() {
    let mut missing = Vec::new();
    for f in sources() {
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if opens_unsafe(l) && !has_safety_comment(&lines, i) {
                missing.push(format!("{}:{}: {}", f.display(), i + 1, l.trim()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "unsafe without a `// SAFETY:` comment:\n{}",
        missing.join("\n")
    );
}

#[test]
fn source_files_stay_within_the_length_budget() {
    let mut long = Vec::new();
    for f in sources() {
        let n = std::fs::read_to_string(&f).unwrap().lines().count();
        if n > MAX_LINES {
            long.push(format!("{}: {n} lines", f.display()));
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_stubs_in_library_code() {
    let mut stubs = Vec::new();
    for f in sources() {
        let s = f.to_string_lossy();
        if s.contains("/tests/") || s.ends_with("tidy.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, l) in text.lines().enumerate() {
            if l.contains(concat!("todo", "!(")) || l.contains(concat!("unimplemented", "!(")) {
                stubs.push(format!("{}:{}", f.display(), i + 1));
            }
        }
    }
    assert!(
        stubs.is_empty(),
        "stubs in library code:\n{}",
        stubs.join("\n")
    );
}

#[test]
fn the_checker_sees_a_missing_comment() {
    let lines = ["fn f() {", "    let x = unsafe { g() };", "}"];
    assert!(opens_unsafe(lines[1]));
    assert!(!has_safety_comment(&lines, 1));
    let ok = [
        "    // SAFETY: g has no preconditions.",
        "    let x = unsafe { g() };",
    ];
    assert!(has_safety_comment(&ok, 1));
}
