//! Every test's outcome, recorded: what `gpu-session`'s `tests` step writes and what
//! `bench-report` renders (Note [Suite results are generated]).
//!
//! Note [Suite results are generated]: a suite's exit status says only that no test failed;
//! a test that returned early because the machine lacked what it checks counts there as
//! passed (this is how the H200 run of 2026-11-28 came to claim `cudnn` and `nccl_group`
//! "all passed" where they had returned early). So each suite binary runs with libtest's
//! JSON output and every test's captured output (`--format json -Z unstable-options
//! --show-output`, accepted by a stable test binary when `RUSTC_BOOTSTRAP=1` is set where it
//! runs: libtest reads that variable at run time, checked on rustc 1.95; without it the
//! binary refuses `-Z`). One event per test gives its outcome and its output, in which a
//! skipped test has printed `ember-skip: <reason>` (Note [Skipped tests] in
//! `ember-testing`): a test is `failed` when libtest says so (or when the process died
//! before the test ended), `skipped` when it printed a skip line or was `#[ignore]`d,
//! `passed` otherwise; `ember-skip-part:` lines are kept beside a passed test as the parts
//! it skipped. The counts are computed from the tests, never written. A `kind: "suites"`
//! results file holds these records with `generator` naming this program, and
//! `bench-report` checks both before rendering them; a table of suite results written by
//! hand in a file's `tables` is refused unless it says it is `unverified` (and it is then
//! rendered as such).

use serde_json::{Value, json};

/// The `generator` field of a suites file: the program that wrote it.
pub const GENERATOR: &str = "xtask gpu-session (libtest JSON and ember-skip lines)";

/// The arguments that make a test binary report each test as JSON with its output.
pub const JSON_ARGS: [&str; 5] = [
    "-Z",
    "unstable-options",
    "--format",
    "json",
    "--show-output",
];

/// The start of a skip line and of a skipped part's (`ember_testing::SKIP_LINE`, ...).
const SKIP_LINE: &str = "ember-skip: ";
const SKIP_PART_LINE: &str = "ember-skip-part: ";

/// One test's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct TestOutcome {
    pub name: String,
    /// `"passed"`, `"failed"` or `"skipped"`.
    pub outcome: &'static str,
    /// Why it was skipped, or the end of its failure's output.
    pub reason: Option<String>,
    /// The parts a passed test skipped, with why.
    pub skipped_parts: Vec<String>,
    pub seconds: Option<f64>,
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The outcomes in a test binary's JSON stream (other lines ignored). Tests that started
/// but never ended (the process died) are failed, naming `exit`.
pub fn parse_libtest_json(stream: &str, exit: &str) -> Vec<TestOutcome> {
    let mut started: Vec<String> = Vec::new();
    let mut out: Vec<TestOutcome> = Vec::new();
    for line in stream.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line.trim()) else {
            continue;
        };
        if v["type"] != "test" {
            continue;
        }
        let Some(name) = v["name"].as_str() else {
            continue;
        };
        let stdout = v["stdout"].as_str().unwrap_or("");
        let skips: Vec<String> = stdout
            .lines()
            .filter_map(|l| l.trim().strip_prefix(SKIP_LINE.trim_end()))
            .map(|r| r.trim().to_string())
            .collect();
        let parts: Vec<String> = stdout
            .lines()
            .filter_map(|l| l.trim().strip_prefix(SKIP_PART_LINE.trim_end()))
            .map(|r| r.trim().to_string())
            .collect();
        let (outcome, reason) = match v["event"].as_str() {
            Some("started") => {
                started.push(name.to_string());
                continue;
            }
            Some("ok") if skips.is_empty() => ("passed", None),
            Some("ok") => ("skipped", Some(skips.join("; "))),
            Some("ignored") => (
                "skipped",
                Some(match v["message"].as_str() {
                    Some(m) if !m.is_empty() => format!("#[ignore]: {m}"),
                    _ => "#[ignore] (no reason given)".to_string(),
                }),
            ),
            Some(other) => ("failed", Some(format!("{other}: {}", tail(stdout, 12)))),
            None => continue,
        };
        started.retain(|s| s != name);
        out.push(TestOutcome {
            name: name.to_string(),
            outcome,
            reason,
            skipped_parts: parts,
            seconds: v["exec_time"].as_f64(),
        });
    }
    for name in started {
        out.push(TestOutcome {
            name,
            outcome: "failed",
            reason: Some(format!(
                "the test process ended before this test did ({exit})"
            )),
            skipped_parts: Vec::new(),
            seconds: None,
        });
    }
    out
}

/// One run of one suite: its record in a suites file.
pub fn suite_record(
    suite: &str,
    variant: Option<&str>,
    command: &str,
    exit_code: Option<i32>,
    seconds: f64,
    tests: &[TestOutcome],
) -> Value {
    let count = |o: &str| tests.iter().filter(|t| t.outcome == o).count();
    json!({
        "suite": suite,
        "variant": variant,
        "command": command,
        "exit_code": exit_code,
        "seconds": seconds,
        "passed": count("passed"),
        "failed": count("failed"),
        "skipped": count("skipped"),
        "tests": tests.iter().map(|t| json!({
            "name": t.name,
            "outcome": t.outcome,
            "reason": t.reason,
            "skipped_parts": t.skipped_parts,
            "seconds": t.seconds,
        })).collect::<Vec<_>>(),
    })
}

/// A suite run's name as the summary and the page print it: `cudnn [EMBER_CUDNN_API=graph]`.
pub fn run_name(r: &Value) -> String {
    match r["variant"].as_str() {
        Some(v) => format!("{} [{v}]", r["suite"].as_str().unwrap_or("?")),
        None => r["suite"].as_str().unwrap_or("?").to_string(),
    }
}

/// Checks a `kind: "suites"` file: written by [`GENERATOR`], every record's counts those of
/// its tests, every skipped test with its reason, a suite that ran no test marked failed.
pub fn validate(doc: &Value) -> Result<(), String> {
    if doc["generator"] != GENERATOR {
        return Err(format!(
            "a suites file must be written by `gpu-session` (\"generator\": {GENERATOR:?}), \
             found {}",
            doc["generator"]
        ));
    }
    let records = doc["records"].as_array().ok_or("no records")?;
    for r in records {
        let name = run_name(r);
        let tests = r["tests"]
            .as_array()
            .ok_or_else(|| format!("{name}: no per-test outcomes"))?;
        for key in ["passed", "failed", "skipped"] {
            let want = tests.iter().filter(|t| t["outcome"] == key).count();
            if r[key].as_u64() != Some(want as u64) {
                return Err(format!(
                    "{name}: \"{key}\" is {}, but its tests say {want}",
                    r[key]
                ));
            }
        }
        for t in tests {
            let outcome = t["outcome"].as_str().unwrap_or("");
            if !["passed", "failed", "skipped"].contains(&outcome) {
                return Err(format!(
                    "{name}: test {} has outcome {outcome:?}",
                    t["name"]
                ));
            }
            if outcome == "skipped" && t["reason"].as_str().is_none_or(str::is_empty) {
                return Err(format!(
                    "{name}: skipped test {} gives no reason",
                    t["name"]
                ));
            }
        }
    }
    Ok(())
}

/// The summary lines of a suite run: its counts, then each skipped and failed test.
pub fn summary_lines(r: &Value) -> Vec<String> {
    let mut lines = vec![format!(
        "{}: {} passed, {} failed, {} skipped",
        run_name(r),
        r["passed"],
        r["failed"],
        r["skipped"]
    )];
    for t in r["tests"].as_array().into_iter().flatten() {
        let name = t["name"].as_str().unwrap_or("?");
        match t["outcome"].as_str() {
            Some("skipped") => lines.push(format!(
                "    skipped {name}: {}",
                t["reason"].as_str().unwrap_or("")
            )),
            Some("failed") => lines.push(format!(
                "    FAILED {name}: {}",
                t["reason"]
                    .as_str()
                    .unwrap_or("")
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
            )),
            _ => {}
        }
        for p in t["skipped_parts"].as_array().into_iter().flatten() {
            lines.push(format!(
                "    part skipped in {name}: {}",
                p.as_str().unwrap_or("")
            ));
        }
    }
    lines
}

/// Whether a hand-written table of a results file reports test-suite outcomes: it speaks of
/// tests or suites that passed or failed (Note [Suite results are generated]).
pub fn is_suite_table(t: &Value) -> bool {
    let text = t.to_string().to_lowercase();
    let word = |w: &str| {
        text.match_indices(w).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + w.len()..].chars().next();
            before.is_none_or(|c| !c.is_alphanumeric())
                && after.is_none_or(|c| !c.is_alphanumeric())
        })
    };
    (word("passed") || word("failed")) && (text.contains("test") || text.contains("suite"))
}

/// The rendered record of a `kind: "suites"` file: one row per suite run, then the skipped
/// tests with their reasons, the skipped parts and the failed tests.
pub fn render(out: &mut String, records: &[Value]) {
    use std::fmt::Write as _;
    out.push_str("| suite | passed | failed | skipped | exit | time |\n");
    out.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for r in records {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {:.0} s |",
            run_name(r),
            r["passed"],
            r["failed"],
            r["skipped"],
            r["exit_code"],
            r["seconds"].as_f64().unwrap_or(0.0)
        );
    }
    let mut lists: [(&str, Vec<String>); 3] = [
        (
            "Skipped (they ran nothing on the GPU; none counts as passed)",
            Vec::new(),
        ),
        ("Parts skipped in tests that passed", Vec::new()),
        ("Failed", Vec::new()),
    ];
    for r in records {
        let suite = run_name(r);
        for t in r["tests"].as_array().into_iter().flatten() {
            let name = t["name"].as_str().unwrap_or("?");
            let reason = t["reason"].as_str().unwrap_or("");
            let first = reason.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            match t["outcome"].as_str() {
                Some("skipped") => lists[0].1.push(format!("- `{suite}` `{name}`: {reason}")),
                Some("failed") => lists[2].1.push(format!("- `{suite}` `{name}`: {first}")),
                _ => {}
            }
            for p in t["skipped_parts"].as_array().into_iter().flatten() {
                lists[1].1.push(format!(
                    "- `{suite}` `{name}`: {}",
                    p.as_str().unwrap_or("")
                ));
            }
        }
    }
    for (title, items) in lists {
        if !items.is_empty() {
            let _ = writeln!(out, "\n{title} ({}):\n", items.len());
            for i in items {
                let _ = writeln!(out, "{i}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a stable test binary printed under `RUSTC_BOOTSTRAP=1` with [`JSON_ARGS`]
    /// (rustc 1.95), for a test that skipped, one that passed with output, one that failed,
    /// an ignored one, and one still running when the process died.
    const STREAM: &str = r#"{ "type": "suite", "event": "started", "test_count": 5 }
{ "type": "test", "event": "started", "name": "a" }
{ "type": "test", "event": "started", "name": "b" }
{ "type": "test", "name": "a", "event": "ok", "exec_time": 0.000001542, "stdout": "ember-skip: no second GPU\n" }
{ "type": "test", "event": "started", "name": "c" }
{ "type": "test", "name": "b", "event": "ok", "exec_time": 0.0007, "stdout": "err line\nember-skip-part: b's cuda:1 part: absent\n" }
{ "type": "test", "event": "started", "name": "d" }
{ "type": "test", "name": "d", "event": "ignored", "message": "slow" }
{ "type": "test", "name": "c", "event": "failed", "exec_time": 0.2, "stdout": "\nthread 'c' panicked at src/lib.rs:3:18:\nboom\n" }
garbage from a kernel's printf
{ "type": "test", "event": "started", "name": "e" }
"#;

    #[test]
    fn outcomes_from_libtest_json() {
        let got = parse_libtest_json(STREAM, "killed by signal 6");
        let by = |n: &str| got.iter().find(|t| t.name == n).unwrap();
        assert_eq!(got.len(), 5);
        assert_eq!(
            (by("a").outcome, by("a").reason.as_deref()),
            ("skipped", Some("no second GPU"))
        );
        assert_eq!(by("b").outcome, "passed");
        assert_eq!(by("b").skipped_parts, vec!["b's cuda:1 part: absent"]);
        assert_eq!(by("c").outcome, "failed");
        assert!(by("c").reason.as_deref().unwrap().contains("boom"));
        assert_eq!(
            (by("d").outcome, by("d").reason.as_deref()),
            ("skipped", Some("#[ignore]: slow"))
        );
        assert_eq!(by("e").outcome, "failed");
        assert!(by("e").reason.as_deref().unwrap().contains("signal 6"));
    }

    #[test]
    fn records_count_their_tests_and_are_checked() {
        let tests = parse_libtest_json(STREAM, "exit 101");
        let r = suite_record(
            "t",
            Some("EMBER_CUDNN_API=graph"),
            "tests/t",
            Some(101),
            1.5,
            &tests,
        );
        assert_eq!(
            (
                r["passed"].as_u64(),
                r["failed"].as_u64(),
                r["skipped"].as_u64()
            ),
            (Some(1), Some(2), Some(2))
        );
        assert_eq!(run_name(&r), "t [EMBER_CUDNN_API=graph]");
        let doc = json!({"generator": GENERATOR, "records": [r.clone()]});
        validate(&doc).unwrap();
        let lines = summary_lines(&r).join("\n");
        assert!(lines.contains("skipped a: no second GPU"), "{lines}");
        assert!(lines.contains("FAILED c"), "{lines}");
        assert!(lines.contains("part skipped in b"), "{lines}");

        // Counts written by hand, a skip without a reason, another generator: refused.
        let mut inflated = r.clone();
        inflated["passed"] = json!(3);
        let e = validate(&json!({"generator": GENERATOR, "records": [inflated]})).unwrap_err();
        assert!(e.contains("\"passed\" is 3, but its tests say 1"), "{e}");
        let mut silent = r.clone();
        silent["tests"][0]["reason"] = Value::Null;
        assert!(validate(&json!({"generator": GENERATOR, "records": [silent]})).is_err());
        let e = validate(&json!({"generator": "by hand", "records": [r]})).unwrap_err();
        assert!(e.contains("written by `gpu-session`"), "{e}");
    }

    #[test]
    fn hand_written_suite_tables_are_recognised() {
        let suites = json!({"title": "The GPU suites", "columns": ["step", "result"],
                            "rows": [["tests: cudnn, nn", "all passed (9, 16 tests)"]]});
        assert!(is_suite_table(&suites));
        let ncu = json!({"title": "ncu over a training step", "columns": ["kernel", "time"],
                         "rows": [["badd_f32", "0.1 ms"]]});
        assert!(!is_suite_table(&ncu));
        // "passed" needs to be a word: "bypassed" is not a test outcome.
        let other = json!({"title": "copies", "rows": [["bypassed the test cache"]]});
        assert!(!is_suite_table(&other));
    }

    #[test]
    fn the_page_lists_skipped_tests_with_their_reasons() {
        let tests = parse_libtest_json(STREAM, "exit 101");
        let r = suite_record("cudnn", None, "tests/cudnn", Some(101), 2.0, &tests);
        let mut page = String::new();
        render(&mut page, &[r]);
        assert!(
            page.contains("| `cudnn` | 1 | 2 | 2 | 101 | 2 s |"),
            "{page}"
        );
        assert!(page.contains("- `cudnn` `a`: no second GPU"), "{page}");
        assert!(page.contains("- `cudnn` `d`: #[ignore]: slow"), "{page}");
        assert!(page.contains("Failed (2)"), "{page}");
    }
}
