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
//! - no absolute path of a developer's machine in the scripts and docs;
//! - `missing_docs` is on for every crate (clippy's `-D warnings` makes it an error).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Files longer than this are split by concern (STYLE: ~800 lines).
const MAX_LINES: usize = 800;

/// Files allowed over [`MAX_LINES`] for now, each with the reason.
// TEMPORARY: `layers.rs` is being split into `layers/` on the derive branch; remove this entry
// when that lands.
const OVER_BUDGET_ALLOWED: &[(&str, &str)] = &[(
    "crates/ember-nn/src/layers.rs",
    "being split into layers/ with #[derive(Module)] (issue 21)",
)];

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

/// This file: it spells out the patterns it looks for, so the scans skip it.
fn is_this_file(path: &Path) -> bool {
    rel(path) == "tests/tidy.rs"
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
            rest = rest[1..].split_once('"').map_or("", |(_, r)| r).trim_start();
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
        "impl", "unsafe impl", "trait", "pub trait", "unsafe trait", "mod", "pub mod", "fn",
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
    let mut allowed_but_short = Vec::new();
    for f in sources() {
        let n = read(&f).lines().count();
        let name = rel(&f);
        let allowed = OVER_BUDGET_ALLOWED.iter().any(|(p, _)| *p == name);
        if n > MAX_LINES && !allowed {
            long.push(format!("{name}: {n} lines"));
        } else if n <= MAX_LINES && allowed {
            allowed_but_short.push(name);
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines (split them by concern):\n{}",
        long.join("\n")
    );
    assert!(
        allowed_but_short.is_empty(),
        "in OVER_BUDGET_ALLOWED but within the budget now (remove the entry): {allowed_but_short:?}"
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

// ---- environment variables ------------------------------------------------------------------

const ENV_PREFIX: &str = concat!("EMB", "ER_");

/// The `EMBER_*` names that appear as whole string literals (`"EMBER_X"`) in `text`: what
/// Rust (`env::var`, `env!`, constants) and Python (`os.environ`) read.
fn quoted_env_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let pat = format!("\"{ENV_PREFIX}");
    let mut rest = text;
    while let Some(at) = rest.find(&pat) {
        let tail = &rest[at + 1..];
        let end = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if tail[end..].starts_with('"') {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// Every `EMBER_*` variable the code reads, with the files that read it.
fn env_vars_read() -> BTreeMap<String, BTreeSet<String>> {
    let root = workspace_root();
    let mut files = sources();
    files_under(&root.join("bench"), &["py"], &mut files);
    files.push(root.join(".ci").join("run"));
    let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        if is_this_file(&f) || !f.is_file() {
            continue;
        }
        let text = read(&f);
        let names = if f.extension().is_some_and(|x| x == "rs" || x == "py") {
            quoted_env_names(&text)
        } else {
            // A shell script: `$EMBER_X`, `${EMBER_X...}`, `EMBER_X=`.
            let mut n = BTreeSet::new();
            for (at, _) in text.match_indices(ENV_PREFIX) {
                let tail = &text[at..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(tail.len());
                n.insert(tail[..end].to_string());
            }
            n
        };
        for n in names {
            found.entry(n).or_default().insert(rel(&f));
        }
    }
    found
}

/// The variables of a page's table: rows that start with `` | `EMBER_``.
fn env_table_rows(text: &str) -> BTreeSet<String> {
    let row = format!("| `{ENV_PREFIX}");
    text.lines()
        .filter(|l| l.trim_start().starts_with(&row))
        .map(|l| {
            let name = &l.trim_start()[3..];
            let end = name
                .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(name.len());
            name[..end].to_string()
        })
        .collect()
}

fn markdown_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "crates", "kernels", "bench", "data", "xtask", "tests"] {
        files_under(&root.join(dir), &["md"], &mut files);
    }
    files
}

#[test]
fn every_env_var_is_documented_in_one_place() {
    let root = workspace_root();
    let read_by = env_vars_read();
    assert!(
        read_by.len() > 5,
        "found only {read_by:?}: is the scan broken?"
    );
    let page = root.join("docs").join("env-vars.md");
    let documented = env_table_rows(&read(&page));
    let undocumented: Vec<String> = read_by
        .iter()
        .filter(|(n, _)| !documented.contains(*n))
        .map(|(n, files)| format!("{n} (read in {})", files.iter().cloned().collect::<Vec<_>>().join(", ")))
        .collect();
    let gone: Vec<&String> = documented
        .iter()
        .filter(|n| !read_by.contains_key(*n))
        .collect();
    assert!(
        undocumented.is_empty(),
        "EMBER_* variables read by the code but missing from docs/env-vars.md's table:\n{}",
        undocumented.join("\n")
    );
    assert!(
        gone.is_empty(),
        "docs/env-vars.md lists variables no code reads any more: {gone:?}"
    );
    // One place: no other page keeps its own table of variables.
    let others: Vec<String> = markdown_files()
        .into_iter()
        .filter(|f| *f != page && !env_table_rows(&read(f)).is_empty())
        .map(|f| rel(&f))
        .collect();
    assert!(
        others.is_empty(),
        "tables of EMBER_* variables outside docs/env-vars.md (link to it instead): {others:?}"
    );
}

#[test]
fn the_env_scan_reads_literals_only() {
    let text = format!(
        "let a = std::env::var(\"{p}ONE\"); // {p}COMMENT\nconst B: &str = \"{p}TWO\"; \"{p}THREE=1\"",
        p = ENV_PREFIX
    );
    let names = quoted_env_names(&text);
    let expected: BTreeSet<String> = [format!("{ENV_PREFIX}ONE"), format!("{ENV_PREFIX}TWO")]
        .into_iter()
        .collect();
    assert_eq!(names, expected);
}

// ---- ARCHITECTURE.md's paths ----------------------------------------------------------------

/// The backticked words of `text` that look like paths in the repository: they contain a `/`
/// or end in a source extension, and have no spaces or code punctuation.
fn named_paths(text: &str) -> Vec<(usize, String)> {
    const EXTS: [&str; 10] = [
        ".rs", ".md", ".cu", ".cuh", ".h", ".cpp", ".py", ".toml", ".json", ".gz",
    ];
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for (k, word) in line.split('`').enumerate() {
            if k % 2 == 0 || word.is_empty() {
                continue;
            }
            let pathlike = word.contains('/') || EXTS.iter().any(|e| word.ends_with(e));
            let code = word.contains(|c: char| {
                c.is_whitespace() || "()[]{}<>:=,;|*?!@$&'\"\\+".contains(c)
            });
            let extension_only = word.starts_with('.') && !word.contains('/');
            if pathlike
                && !code
                && !extension_only
                && !word.starts_with("target/")
                && !word.starts_with("http")
            {
                out.push((n + 1, word.to_string()));
            }
        }
    }
    out
}

#[test]
fn every_path_in_the_architecture_page_exists() {
    let root = workspace_root();
    let text = read(&root.join("docs").join("ARCHITECTURE.md"));
    // Paths under a `### `crates/x`` heading may be relative to that crate (or its `src/`),
    // and within a bullet, relative to a folder the bullet named before (`driver/emulator/`
    // — `config.rs`, `memory.rs`).
    let mut section: Vec<PathBuf> = vec![root.clone(), root.join("docs")];
    let mut bullet: Vec<PathBuf> = Vec::new();
    let mut missing = Vec::new();
    let mut checked = 0;
    let mut in_code_block = false;
    for (n, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            in_code_block = !in_code_block;
            continue;
        }
        if in_code_block {
            continue;
        }
        if line.starts_with('#') {
            // The heading's folders first: `data/` under `crates/ember-nn` is its own.
            section.clear();
            for (k, word) in line.split('`').enumerate() {
                if k % 2 == 1 && word.contains('/') {
                    let dir = root.join(word.trim_end_matches('/'));
                    section.push(dir.join("src"));
                    section.push(dir);
                }
            }
            section.extend([root.clone(), root.join("docs")]);
            bullet.clear();
            continue;
        }
        if !line.starts_with(' ') {
            bullet.clear();
        }
        for (_, p) in named_paths(line) {
            checked += 1;
            let rel_path = p.trim_end_matches('/');
            let found = section
                .iter()
                .chain(bullet.iter().rev())
                .map(|b| b.join(rel_path))
                .find(|c| c.exists());
            match found {
                // A folder, or a file's folder (`emu/cuda_emu.h`, `cuda_emu.cpp`), is where
                // the bullet's next bare names live.
                Some(path) if p.ends_with('/') => bullet.push(path),
                Some(path) => bullet.extend(path.parent().map(Path::to_path_buf)),
                None => missing.push(format!("docs/ARCHITECTURE.md:{}: `{p}`", n + 1)),
            }
        }
    }
    assert!(checked > 50, "only {checked} paths found: is the scan broken?");
    assert!(
        missing.is_empty(),
        "paths named in docs/ARCHITECTURE.md that do not exist:\n{}",
        missing.join("\n")
    );
}

// ---- Notes ----------------------------------------------------------------------------------

/// The files that may cite or define a Note.
fn note_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = markdown_files();
    for dir in ["crates", "xtask", "tests", "kernels", "bench"] {
        files_under(
            &root.join(dir),
            &["rs", "cu", "cuh", "h", "cpp", "py"],
            &mut files,
        );
    }
    files.retain(|f| !is_this_file(f));
    files
}

/// `line` with rustdoc's escapes of brackets removed (`Note \[X\]` is `Note [X]`).
fn unescape(line: &str) -> String {
    line.replace("\\[", "[").replace("\\]", "]")
}

/// Every `Note [X]` of `line`: the names.
fn cited_notes(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("Note [") {
        let tail = &rest[at + "Note [".len()..];
        match tail.find(']') {
            Some(end) => {
                out.push(tail[..end].to_string());
                rest = &tail[end..];
            }
            None => break,
        }
    }
    out
}

/// The text of a comment line after its marker (`//!`, `///`, `//`, `#`, `*`), trimmed.
fn after_comment_marker(line: &str) -> &str {
    let t = line.trim_start();
    for m in ["//!", "///", "//", "/*", "*", "#"] {
        if let Some(r) = t.strip_prefix(m) {
            return r.trim_start();
        }
    }
    t
}

/// A Note defined on this line: `Note [X]:` right after the comment marker (or at the start
/// of a text line).
fn note_definition(line: &str) -> Option<String> {
    let body = after_comment_marker(line);
    let tail = body.strip_prefix("Note [")?;
    let (name, after) = tail.split_once(']')?;
    after.starts_with(':').then(|| name.to_string())
}

/// A line that looks like a Note's header in another format: `Note [X]` alone on its line, or
/// as a heading (`# Note [X]`, `## Note [X]`).
fn misformatted_header(line: &str) -> bool {
    let body = after_comment_marker(line).trim_start_matches('#').trim();
    let heading = line.trim_start().starts_with('#')
        || after_comment_marker(line).starts_with('#');
    let Some(tail) = body.strip_prefix("Note [") else {
        return false;
    };
    let Some((_, after)) = tail.split_once(']') else {
        return false;
    };
    (heading && !after.starts_with(':')) || after.trim().is_empty()
}

#[test]
fn every_cited_note_is_defined_exactly_once() {
    let mut defined: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut cited: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut misformatted = Vec::new();
    for f in note_files() {
        let text = read(&f);
        for (i, raw) in text.lines().enumerate() {
            let line = unescape(raw);
            let at = format!("{}:{}", rel(&f), i + 1);
            if let Some(name) = note_definition(&line) {
                defined.entry(name).or_default().push(at.clone());
            } else if misformatted_header(&line) {
                misformatted.push(format!("{at}: {}", line.trim()));
            }
            for name in cited_notes(&line) {
                cited.entry(name).or_default().push(at.clone());
            }
        }
    }
    assert!(
        misformatted.is_empty(),
        "Note headers in another format (write `Note [X]:` at the start of a comment line):\n{}",
        misformatted.join("\n")
    );
    let undefined: Vec<String> = cited
        .iter()
        .filter(|(n, _)| !defined.contains_key(*n))
        .map(|(n, at)| format!("Note [{n}], cited at {}", at.join(", ")))
        .collect();
    assert!(
        undefined.is_empty(),
        "Notes cited but never defined (`Note [X]:` at the start of a comment line):\n{}",
        undefined.join("\n")
    );
    let twice: Vec<String> = defined
        .iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(n, at)| format!("Note [{n}], defined at {}", at.join(", ")))
        .collect();
    assert!(
        twice.is_empty(),
        "Notes defined more than once:\n{}",
        twice.join("\n")
    );
}

#[test]
fn the_note_scan_tells_definitions_from_citations() {
    assert_eq!(
        note_definition("// Note [Dispatch]: an op is split in two"),
        Some("Dispatch".into())
    );
    assert_eq!(
        note_definition("//! Note [A team]:"),
        Some("A team".into())
    );
    assert_eq!(note_definition("// See Note [Dispatch]."), None);
    assert!(misformatted_header("//! # Note [Launch trace]"));
    assert!(misformatted_header("// Note [Dispatch]"));
    assert!(misformatted_header("## Note [f64 rounding]"));
    assert!(!misformatted_header("/// Note [Independent blocks]."));
    assert!(!misformatted_header("//! Note [Dispatch] (in `backend.rs`) exactly; it"));
    assert_eq!(
        cited_notes("see Note [A] and Note [B c]."),
        vec!["A".to_string(), "B c".to_string()]
    );
    assert_eq!(unescape("Note \\[Locking\\]"), "Note [Locking]");
}

// ---- portable scripts and docs --------------------------------------------------------------

/// The scripts and docs: Markdown, Python, the CI script, cargo's config, the xtask.
fn scripts_and_docs() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = markdown_files();
    files_under(&root.join("bench"), &["py", "sh", "json"], &mut files);
    files_under(&root.join("xtask"), &["rs", "toml"], &mut files);
    files.push(root.join(".ci").join("run"));
    files.push(root.join(".cargo").join("config.toml"));
    files.push(root.join(".gitignore"));
    files.retain(|f| f.is_file());
    files
}

/// Absolute paths of some machine's directories (`/work/...`, `/home/...`), where a path
/// relative to the workspace (or to a bundle) belongs.
fn machine_paths(line: &str) -> Vec<&'static str> {
    const DIRS: [&str; 4] = ["/work/", "/home/", "/root/", "/tmp/"];
    DIRS.into_iter()
        .filter(|d| {
            line.match_indices(d).any(|(at, _)| {
                at == 0
                    || !line[..at]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || "._-~$".contains(c))
            })
        })
        .collect()
}

#[test]
fn no_machine_paths_in_scripts_and_docs() {
    let mut found = Vec::new();
    for f in scripts_and_docs() {
        for (i, l) in read(&f).lines().enumerate() {
            let dirs = machine_paths(l);
            if !dirs.is_empty() {
                found.push(format!("{}:{}: {dirs:?}: {}", rel(&f), i + 1, l.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "absolute paths of a developer's machine (use paths relative to the workspace):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_path_scan_skips_relative_paths() {
    assert_eq!(machine_paths("ln -s /work/main x"), vec!["/work/"]);
    assert_eq!(machine_paths("cd /tmp/x"), vec!["/tmp/"]);
    assert!(machine_paths("target/tmp/x and data/work/y").is_empty());
}

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
    assert!(declares_unsafe_fn("unsafe extern \"C\" fn nothing(x: u8) {"));
    assert!(!declares_unsafe_fn("type F = unsafe extern \"C\" fn(c_int);"));
    assert!(!declares_unsafe_fn("    call: unsafe fn(*const (), usize),"));
    let documented = [
        "/// Does it.",
        "///",
        "/// # Safety",
        "/// `p` is valid.",
        "#[inline]",
        "unsafe fn f(p: *const u8) {}",
    ];
    assert!(has_safety_section(&documented, 5));
    assert!(!has_safety_section(&["/// Does it.", "unsafe fn f() {}"], 1));
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
