//! The checks that keep the docs and scripts true (see the crate's doc in `tidy.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{files_under, is_this_file, read, rel, sources, workspace_root};

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

/// The variables of a page's table: rows that start with `` | `EMBER_``, every
/// `` `EMBER_…` `` named in the row's first cell (related variables share a row).
fn env_table_rows(text: &str) -> BTreeSet<String> {
    let row = format!("| `{ENV_PREFIX}");
    let mut names = BTreeSet::new();
    for l in text.lines().filter(|l| l.trim_start().starts_with(&row)) {
        let cell = l.trim_start()[1..].split('|').next().unwrap_or("");
        for quoted in cell.split('`').skip(1).step_by(2) {
            if quoted.starts_with(ENV_PREFIX)
                && quoted
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            {
                names.insert(quoted.to_string());
            }
        }
    }
    names
}

fn markdown_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = vec![root.join("README.md")];
    for dir in [
        "docs", "crates", "kernels", "bench", "data", "xtask", "tests",
    ] {
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
        .map(|(n, files)| {
            format!(
                "{n} (read in {})",
                files.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
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
            let code = word
                .contains(|c: char| c.is_whitespace() || "()[]{}<>:=,;|*?!@$&'\"\\+".contains(c));
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
    assert!(
        checked > 50,
        "only {checked} paths found: is the scan broken?"
    );
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

/// `line` without its inline code spans (`` `Note [X]:` `` shows the format, it cites nothing).
fn outside_code_spans(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join(" ")
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
    let heading = line.trim_start().starts_with('#') || after_comment_marker(line).starts_with('#');
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
            for name in cited_notes(&outside_code_spans(&line)) {
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
    assert_eq!(note_definition("//! Note [A team]:"), Some("A team".into()));
    assert_eq!(note_definition("// See Note [Dispatch]."), None);
    assert!(misformatted_header("//! # Note [Launch trace]"));
    assert!(misformatted_header("// Note [Dispatch]"));
    assert!(misformatted_header("## Note [f64 rounding]"));
    assert!(!misformatted_header("/// Note [Independent blocks]."));
    assert!(!misformatted_header(
        "//! Note [Dispatch] (in `backend.rs`) exactly; it"
    ));
    assert_eq!(
        cited_notes("see Note [A] and Note [B c]."),
        vec!["A".to_string(), "B c".to_string()]
    );
    assert_eq!(unescape("Note \\[Locking\\]"), "Note [Locking]");
    assert!(cited_notes(&outside_code_spans("as `Note [X]:` at the start")).is_empty());
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

/// Documents that live outside the repository, which the code and docs once cited.
const OUTSIDE_DOCS: [&str; 4] = [
    concat!("shared", "/"),
    concat!("CUDA", "-NOTES"),
    concat!("CPU", "-NOTES"),
    concat!("DESIGN", ".md"),
];

#[test]
fn no_citations_of_documents_outside_the_repository() {
    let mut files = note_files();
    files.extend(scripts_and_docs());
    files.sort();
    files.dedup();
    let mut found = Vec::new();
    for f in files {
        for (i, l) in read(&f).lines().enumerate() {
            // `docs/design.md` is ours; only the old upper-case name is outside.
            if OUTSIDE_DOCS.iter().any(|d| l.contains(d)) {
                found.push(format!("{}:{}: {}", rel(&f), i + 1, l.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "citations of documents outside the repository (cite the page of docs/ that replaced them):\n{}",
        found.join("\n")
    );
}
