//! Tidy checks as tests (after rust-analyzer's `xtask/src/tidy.rs`), run by `cargo xtask
//! test` like every other test:
//!
//! - every `unsafe` block or impl carries a `// SAFETY:` comment, and every `unsafe fn` a
//!   `# Safety` doc section (methods of a trait impl inherit the trait's);
//! - source files stay within the length budget ([`MAX_LINES`]);
//! - no `todo!`/`unimplemented!` in library code;
//! - every `EMBER_*` variable the code reads is in `docs/env-vars.md`, and every variable
//!   listed there is still read; no other page keeps a table of them;
//! - every path `docs/ARCHITECTURE.md` names exists;
//! - every `Note [X]` cited is defined exactly once, as a comment or text line starting
//!   `Note [X]:`;
//! - no absolute path of a developer's machine in the scripts and docs, and no citation of
//!   a document outside the repository;
//! - every figure in README.md (a number with a unit, or a ratio) is a saved measurement of
//!   `bench/results/` or `docs/performance.md`, and its status cells stay short;
//! - `docs/ARCHITECTURE.md` stays a short map with no measurements, and has a section for
//!   every crate;
//! - `missing_docs` is on for every crate (clippy's `-D warnings` makes it an error);
//! - every early return in a test file skips through `ember_testing::skip!` or says, in a
//!   `// not a skip:` comment, why it is not a skip (Note [Skipped tests]).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

/// Files longer than this are split by concern (STYLE: ~800 lines).
const MAX_LINES: usize = 800;

/// Files allowed over [`MAX_LINES`] for now, each with the reason (none today).
const OVER_BUDGET_ALLOWED: &[(&str, &str)] = &[];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Files under `dir` whose names end with one of `exts`, skipping build outputs.
fn files_under(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() {
            if name != "target" && name != ".git" && name != "__pycache__" {
                files_under(&p, exts, out);
            }
        } else if exts
            .iter()
            .any(|x| name.to_string_lossy().ends_with(&format!(".{x}")))
        {
            out.push(p);
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    files_under(dir, &["rs"], out);
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

/// `path` relative to the workspace root, with `/` separators.
fn rel(path: &Path) -> String {
    path.strip_prefix(workspace_root())
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// This file and its module: they spell out the patterns they look for, so the scans skip
/// them.
fn is_this_file(path: &Path) -> bool {
    let r = rel(path);
    r == "tests/tidy.rs" || r.starts_with("tests/tidy/")
}

// ---- unsafe ---------------------------------------------------------------------------------

/// Whether `line` opens an `unsafe` block or impl (not a fn signature, not a mention in a
/// comment or string).
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
        let text = read(&f);
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if opens_unsafe(l) && !has_safety_comment(&lines, i) {
                missing.push(format!("{}:{}: {}", rel(&f), i + 1, l.trim()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "unsafe without a `// SAFETY:` comment:\n{}",
        missing.join("\n")
    );
}

/// Whether `line` declares or defines a named `unsafe fn` (`unsafe fn f`, `unsafe extern "C"
/// fn f`, with any visibility), as opposed to a function-pointer type (`unsafe fn(`).
fn declares_unsafe_fn(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    let Some(at) = code.find("unsafe ") else {
        return false;
    };
    let before = &code[..at];
    if before.contains('"') || before.contains('=') || before.contains(':') {
        return false; // a type alias, a field's type, a string
    }
    let mut rest = code[at + "unsafe ".len()..].trim_start();
    if let Some(r) = rest.strip_prefix("extern ") {
        rest = r.trim_start();
        if rest.starts_with('"') {
            rest = rest[1..]
                .split_once('"')
                .map_or("", |(_, r)| r)
                .trim_start();
        }
    }
    let Some(r) = rest.strip_prefix("fn ") else {
        return false;
    };
    r.trim_start()
        .starts_with(|c: char| c.is_alphabetic() || c == '_')
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Whether line `i` sits directly in an `impl Trait for Type` block, whose trait documents
/// the method's safety contract.
fn in_trait_impl(lines: &[&str], i: usize) -> bool {
    let own = indent(lines[i]);
    if own == 0 {
        return false;
    }
    const ITEMS: [&str; 9] = [
        "impl",
        "unsafe impl",
        "trait",
        "pub trait",
        "unsafe trait",
        "mod",
        "pub mod",
        "fn",
        "pub fn",
    ];
    for j in (0..i).rev() {
        let l = lines[j];
        if l.trim().is_empty() || indent(l) >= own {
            continue;
        }
        let t = l.trim_start();
        if ITEMS.iter().any(|k| t.starts_with(&format!("{k} "))) {
            if !(t.starts_with("impl") || t.starts_with("unsafe impl")) {
                return false;
            }
            // The header, possibly over several lines, up to its `{`.
            let header: String = lines[j..i].join(" ");
            let header = header.split('{').next().unwrap_or("");
            return header.contains(" for ");
        }
    }
    false
}

/// Whether the doc comment above line `i` (through attributes and other comments) has a
/// `# Safety` section.
fn has_safety_section(lines: &[&str], i: usize) -> bool {
    let mut j = i;
    while j > 0 {
        j -= 1;
        let l = lines[j].trim();
        if l.starts_with("///") && l.contains("# Safety") {
            return true;
        }
        if !(l.starts_with("//") || l.starts_with("#[")) {
            return false;
        }
    }
    false
}

#[test]
fn every_unsafe_fn_has_a_safety_section() {
    let mut missing = Vec::new();
    for f in sources() {
        if is_this_file(&f) {
            continue;
        }
        let text = read(&f);
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if declares_unsafe_fn(l) && !in_trait_impl(&lines, i) && !has_safety_section(&lines, i)
            {
                missing.push(format!("{}:{}: {}", rel(&f), i + 1, l.trim()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "unsafe fn without a `# Safety` section in its doc comment:\n{}",
        missing.join("\n")
    );
}

// ---- size and stubs -------------------------------------------------------------------------

#[test]
fn source_files_stay_within_the_length_budget() {
    let mut long = Vec::new();
    for f in sources() {
        let n = read(&f).lines().count();
        let name = rel(&f);
        if n > MAX_LINES && !OVER_BUDGET_ALLOWED.iter().any(|(p, _)| *p == name) {
            long.push(format!("{name}: {n} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines (split them by concern):\n{}",
        long.join("\n")
    );
    // An allowance ends when its file is split (gone, or within the budget).
    let stale: Vec<&str> = OVER_BUDGET_ALLOWED
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| {
            std::fs::read_to_string(workspace_root().join(p))
                .ok()
                .is_none_or(|t| t.lines().count() <= MAX_LINES)
        })
        .collect();
    assert!(
        stale.is_empty(),
        "in OVER_BUDGET_ALLOWED but gone or within the budget now (remove the entry): {stale:?}"
    );
}

#[test]
fn no_stubs_in_library_code() {
    let mut stubs = Vec::new();
    for f in sources() {
        let s = rel(&f);
        if s.contains("/tests/") || s.starts_with("tests/") {
            continue;
        }
        for (i, l) in read(&f).lines().enumerate() {
            if l.contains(concat!("todo", "!(")) || l.contains(concat!("unimplemented", "!(")) {
                stubs.push(format!("{s}:{}", i + 1));
            }
        }
    }
    assert!(
        stubs.is_empty(),
        "stubs in library code:\n{}",
        stubs.join("\n")
    );
}

// The checks on the docs and scripts: environment variables, ARCHITECTURE.md's paths, Notes,
// machine paths, documents outside the repository.
#[path = "tidy/docs.rs"]
mod docs;

// Early returns in test files go through `ember_testing::skip!` or say why they are not skips.
#[path = "tidy/skips.rs"]
mod skips;

// The checks on claims: the README's figures and status cells, the code map's length,
// figures and sections.
#[path = "tidy/claims.rs"]
mod claims;

// ---- docs on public items -------------------------------------------------------------------

#[test]
fn missing_docs_is_on_for_every_crate() {
    let root = workspace_root();
    let manifest = read(&root.join("Cargo.toml"));
    let lints = manifest
        .split("[workspace.lints.rust]")
        .nth(1)
        .and_then(|s| s.split("\n[").next())
        .unwrap_or("");
    assert!(
        lints.contains("missing_docs = \"warn\""),
        "[workspace.lints.rust] must keep missing_docs = \"warn\""
    );
    let mut manifests = Vec::new();
    files_under(&root.join("crates"), &["toml"], &mut manifests);
    manifests.push(root.join("xtask").join("Cargo.toml"));
    manifests.push(root.join("tests").join("Cargo.toml"));
    let without: Vec<String> = manifests
        .iter()
        .filter(|m| m.ends_with("Cargo.toml"))
        .filter(|m| {
            let t = read(m);
            !t.split("[lints]")
                .nth(1)
                .is_some_and(|s| s.trim_start().starts_with("workspace = true"))
        })
        .map(|m| rel(m))
        .collect();
    assert!(
        without.is_empty(),
        "crates without `[lints] workspace = true` (so without missing_docs): {without:?}"
    );
}

#[test]
fn the_checkers_see_what_is_missing() {
    let lines = ["fn f() {", "    let x = unsafe { g() };", "}"];
    assert!(opens_unsafe(lines[1]));
    assert!(!has_safety_comment(&lines, 1));
    let ok = [
        "    // SAFETY: g has no preconditions.",
        "    let x = unsafe { g() };",
    ];
    assert!(has_safety_comment(&ok, 1));

    assert!(declares_unsafe_fn("pub(crate) unsafe fn run<T>("));
    assert!(declares_unsafe_fn(
        "unsafe extern \"C\" fn nothing(x: u8) {"
    ));
    assert!(!declares_unsafe_fn(
        "type F = unsafe extern \"C\" fn(c_int);"
    ));
    assert!(!declares_unsafe_fn(
        "    call: unsafe fn(*const (), usize),"
    ));
    let documented = [
        "/// Does it.",
        "///",
        "/// # Safety",
        "/// `p` is valid.",
        "#[inline]",
        "unsafe fn f(p: *const u8) {}",
    ];
    assert!(has_safety_section(&documented, 5));
    assert!(!has_safety_section(
        &["/// Does it.", "unsafe fn f() {}"],
        1
    ));
    let imp = [
        "unsafe impl RawAllocator for Host {",
        "    fn a(&self) {}",
        "    unsafe fn deallocate(&self) {}",
        "}",
    ];
    assert!(in_trait_impl(&imp, 2));
    let inherent = ["impl Host {", "    unsafe fn deallocate(&self) {}", "}"];
    assert!(!in_trait_impl(&inherent, 1));
}
