//! Early returns in tests say why (Note [Skipped tests] in `crates/ember-testing/src/skip.rs`):
//! a test that stops early because the machine lacks what it checks goes through
//! `ember_testing::skip!` (whose `ember-skip:` line makes a runner count it as skipped), and
//! any other bare `return` in a test file (`return;`, `return Ok(())`, `else { return }`)
//! carries a `// not a skip: <why>` comment on its line or just above it.

use std::path::{Path, PathBuf};

use super::{files_under, is_this_file, read, rel, workspace_root};

/// What a comment says to mark an early return as ordinary control flow.
const NOT_A_SKIP: &str = concat!("// not a ", "skip:");

/// The test files: `crates/*/tests/**` and the workspace's `tests/**`.
fn test_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = Vec::new();
    for krate in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        files_under(&krate.path().join("tests"), &["rs"], &mut files);
    }
    files_under(&root.join("tests"), &["rs"], &mut files);
    files.sort();
    files
}

/// `line` without its string and character literals' contents and without its `//` comment.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_str = false;
                    out.push('"');
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                out.push('"');
            }
            // A character literal (`'"'`, `'\''`); a lifetime's `'` stays.
            '\'' => {
                let ahead: Vec<char> = chars.clone().take(3).collect();
                match ahead.as_slice() {
                    ['\\', _, '\''] => {
                        let _ = chars.nth(2);
                    }
                    [_, '\'', ..] => {
                        let _ = chars.nth(1);
                    }
                    _ => {}
                }
                out.push('\'');
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

/// Whether the code of `line` returns nothing early: `return;`, `return }`, a `return` that
/// ends the line, or `return Ok(())` (with `;`, `}` or the line's end after it).
fn bare_return(line: &str) -> bool {
    let code = code_of(line);
    let mut rest = code.as_str();
    while let Some(at) = rest.find("return") {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + "return".len()..];
        rest = after;
        let word = before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
            && after
                .chars()
                .next()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        if !word {
            continue;
        }
        let value = after.trim_start();
        let value = value.strip_prefix("Ok(())").unwrap_or(value).trim_start();
        if value.is_empty() || value.starts_with(';') || value.starts_with('}') {
            return true;
        }
    }
    false
}

/// Whether the return on line `i` says it is not a skip (on its line or the two above).
fn says_why(lines: &[&str], i: usize) -> bool {
    (i.saturating_sub(2)..=i).any(|j| {
        lines[j]
            .split_once(NOT_A_SKIP)
            .is_some_and(|(_, why)| !why.trim().is_empty())
    })
}

/// The unexplained early returns of one file, as `path:line: text`.
fn unexplained_returns(path: &Path, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    (0..lines.len())
        .filter(|&i| bare_return(lines[i]) && !says_why(&lines, i))
        .map(|i| format!("{}:{}: {}", rel(path), i + 1, lines[i].trim()))
        .collect()
}

#[test]
fn every_early_return_in_a_test_says_why() {
    let mut bad = Vec::new();
    for f in test_files() {
        if is_this_file(&f) {
            continue;
        }
        bad.extend(unexplained_returns(&f, &read(&f)));
    }
    assert!(
        bad.is_empty(),
        "early returns in tests that neither skip through `ember_testing::skip!(\"why\")` \
         (Note [Skipped tests]) nor say `{NOT_A_SKIP} <why>`:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_return_check_sees_bare_returns_only() {
    for bare in [
        "        return;",
        "    let Some(x) = f() else { return };",
        "        return Ok(());",
        "    if skip { return Ok(()) }",
        "        return",
    ] {
        assert!(bare_return(bare), "{bare}");
    }
    for not in [
        "        return Err(e);",
        "        return x;",
        "        return false;",
        "    let returned = 1;",
        "    assert!(s.contains(\"return;\"));",
        "    let q = '\"'; let s = \"return;\";",
        "    // return;",
        "        ember_testing::skip!(\"no second GPU\");",
    ] {
        assert!(!bare_return(not), "{not}");
    }
    let path = Path::new("crates/x/tests/t.rs");
    let text = "fn t() {\n    if a {\n        return;\n    }\n}\n";
    assert_eq!(unexplained_returns(path, text).len(), 1);
    let why =
        format!("fn t() {{\n    if a {{\n        {NOT_A_SKIP} done\n        return;\n    }}\n}}\n");
    assert!(unexplained_returns(path, &why).is_empty());
    let empty = format!("fn t() {{\n        return; {NOT_A_SKIP}\n}}\n");
    assert_eq!(unexplained_returns(path, &empty).len(), 1);
}
