//! Skipped tests, said so: [`skip!`](crate::skip) and the lines it prints.
//!
//! Note [Skipped tests]: libtest knows a test that returns as "ok", so a test that stops
//! early because the machine lacks what it checks (a second GPU, the emulator's records, a
//! driver) would count as passed where it ran nothing. Every such early return goes through
//! [`skip!`](crate::skip), which prints one line, `ember-skip: <reason>`, on the test's
//! output and returns; a test that skips only a part of itself (the `cuda:1` half of a
//! two-device test on a one-GPU machine) prints `ember-skip-part: <reason>` through
//! [`skip_part`] and goes on. libtest captures both per test, so a runner that asks for
//! each test's output (`--format json --show-output`, or `--nocapture --test-threads=1`)
//! can tell the skipped tests from the passed ones, with their reasons:
//! `cargo xtask gpu-session` does (`xtask/src/suites.rs`), and counts a test with an
//! `ember-skip:` line as skipped, never as passed. `tests/tidy.rs` fails on an early
//! `return` in a test file that neither goes through `skip!` nor says, in a
//! `// not a skip: ...` comment, why it is ordinary control flow. The crates below this one
//! (`ember-device`, `ember-memory`), whose tests cannot depend on it, print the same line
//! themselves.

use std::fmt::Display;

/// The start of the line that records a test as skipped.
pub const SKIP_LINE: &str = "ember-skip: ";

/// The start of the line that records a skipped part of a test that otherwise ran.
pub const SKIP_PART_LINE: &str = "ember-skip-part: ";

/// What a skipped test body returns: `()`, or `Ok(())` for a body returning a `Result`.
pub trait Skip {
    /// The value of a test body that stopped without failing.
    fn skipped() -> Self;
}

impl Skip for () {
    fn skipped() -> Self {}
}

impl<E> Skip for Result<(), E> {
    fn skipped() -> Self {
        Ok(())
    }
}

/// `reason` on one line (a skip line must not be split).
fn one_line(reason: &dyn Display) -> String {
    reason
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The line that records a skipped test: `ember-skip: <reason>`.
pub fn skip_line(reason: impl Display) -> String {
    format!("{SKIP_LINE}{}", one_line(&reason))
}

/// Prints the line that records this test as skipped (Note [Skipped tests]). The test must
/// then return: [`skip!`](crate::skip) does both.
pub fn report_skip(reason: impl Display) {
    println!("{}", skip_line(reason));
}

/// Prints the line that records a skipped part of this test, which goes on with the rest
/// (Note [Skipped tests]).
pub fn skip_part(reason: impl Display) {
    println!("{SKIP_PART_LINE}{}", one_line(&reason));
}

/// Ends the test (or test body) here as skipped: prints `ember-skip: <reason>` (a `format!`
/// string and its arguments) and returns `()` or `Ok(())`. See Note [Skipped tests].
///
/// ```
/// use ember_testing::skip;
///
/// fn needs_two_gpus(count: usize) -> Result<(), String> {
///     if count < 2 {
///         skip!("needs 2 CUDA devices; this machine has {count}");
///     }
///     unreachable!("not reached with one device")
/// }
/// assert_eq!(needs_two_gpus(1), Ok(()));
/// ```
#[macro_export]
macro_rules! skip {
    ($($reason:tt)+) => {{
        $crate::report_skip(::std::format_args!($($reason)+));
        return <_ as $crate::Skip>::skipped();
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(skip_it: bool) -> u32 {
        let mut reached = 0;
        let mut body = || {
            if skip_it {
                crate::skip!("nothing {} here", "to see");
            }
            reached += 1;
        };
        body();
        reached
    }

    fn result(skip_it: bool) -> Result<u32, String> {
        let mut reached = 0;
        let mut body = || -> Result<(), String> {
            if skip_it {
                crate::skip!("skipped");
            }
            reached += 1;
            Ok(())
        };
        body()?;
        Ok(reached)
    }

    #[test]
    fn skip_returns_from_unit_and_result_bodies() {
        assert_eq!(unit(true), 0);
        assert_eq!(unit(false), 1);
        assert_eq!(result(true), Ok(0));
        assert_eq!(result(false), Ok(1));
    }

    #[test]
    fn reasons_stay_on_one_line() {
        assert_eq!(
            skip_line("needs\ncuda:1,  this machine has 1"),
            "ember-skip: needs cuda:1, this machine has 1"
        );
    }
}
