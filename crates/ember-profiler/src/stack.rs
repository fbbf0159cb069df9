//! `with_stack`: the user's call sites of each op, from the return addresses the trace hooks
//! capture (Note [Call sites] in `ember-device`'s trace module).
//!
//! Each distinct address is resolved once per trace. A frame is Ember's own when its
//! function lives in one of Ember's library crates (or is the standard library's or the
//! unwinder's glue around them); the call site is the first frame that is not, and the stack
//! kept for an event runs from there outwards, at most [`MAX_USER_FRAMES`] frames, each
//! written `file:line: function` (`function` alone where the build has no line tables).

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};

/// Frames kept per event, from the call site outwards.
pub const MAX_USER_FRAMES: usize = 8;

/// Crates whose frames are Ember's own (the facade crate `ember` is not among them: its
/// command-line programs are users of the library).
const LIBRARY_CRATES: &[&str] = &[
    "ember_device",
    "ember_memory",
    "ember_kernels",
    "ember_gemm",
    "ember_tensor",
    "ember_autograd",
    "ember_nn",
    "ember_amp",
    "ember_profiler",
    "ember_derive",
];

/// Glue that sits between frames and is never a call site: the standard library, the
/// unwinder, and rayon's scheduling (and any frame with a file under `/rustc/`).
const GLUE_CRATES: &[&str] = &["std", "core", "alloc", "backtrace", "rayon", "rayon_core"];

/// Whether this binary can resolve call sites at all: a stripped binary has no symbols, and
/// `with_stack` then records empty stacks (say so, rather than guess).
pub fn call_sites_resolvable() -> bool {
    static RESOLVABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *RESOLVABLE.get_or_init(|| {
        let mut named = false;
        let here = call_sites_resolvable as fn() -> bool;
        backtrace::resolve(here as *mut c_void, |sym| named |= sym.name().is_some());
        named
    })
}

/// One resolved frame (an inlined call is a frame of its own).
#[derive(Clone, Debug)]
struct Frame {
    text: String,
    library: bool,
    glue: bool,
    /// std's marker of where a thread's (or `main`'s) own code begins; the frames beyond it
    /// are the runtime's and the C library's, as std's own backtraces trim them.
    outermost: bool,
}

/// Resolves return addresses to frames, caching each address.
#[derive(Debug, Default)]
pub(crate) struct Symbolizer {
    cache: HashMap<usize, Vec<Frame>>,
    cwd: Option<PathBuf>,
}

/// The crate a demangled function name belongs to: `ember_nn` for
/// `<ember_nn::layers::Linear as ember_nn::Module>::forward`.
fn crate_of(function: &str) -> &str {
    let f = function.trim_start_matches('<').trim_start_matches('&');
    f.split("::").next().unwrap_or(f)
}

impl Symbolizer {
    pub(crate) fn new() -> Symbolizer {
        Symbolizer {
            cache: HashMap::new(),
            cwd: std::env::current_dir().ok(),
        }
    }

    fn frames(&mut self, ip: usize) -> &[Frame] {
        let cwd = self.cwd.clone();
        self.cache.entry(ip).or_insert_with(|| {
            let mut out = Vec::new();
            // `resolve` looks the (return) address up, one callback per inlined frame,
            // innermost first; it reads the binary's debug information and never writes
            // through the address.
            backtrace::resolve(ip as *mut c_void, |sym| {
                let function = sym
                    .name()
                    .map(|n| format!("{n:#}"))
                    .unwrap_or_else(|| format!("{ip:#x}"));
                let krate = crate_of(&function);
                let outermost = function.contains("__rust_begin_short_backtrace");
                let file = sym.filename();
                let library = LIBRARY_CRATES.contains(&krate)
                    || file.is_some_and(|f| in_sources_of(f, LIBRARY_CRATES));
                let glue = GLUE_CRATES.contains(&krate)
                    || sym.name().is_none()
                    || file
                        .is_some_and(|f| f.starts_with("/rustc/") || in_sources_of(f, GLUE_CRATES));
                let text = match (file, sym.lineno()) {
                    (Some(file), Some(line)) => {
                        format!("{}:{line}: {function}", shown(file, cwd.as_deref()))
                    }
                    _ => function,
                };
                out.push(Frame {
                    text,
                    library,
                    glue,
                    outermost,
                });
            });
            out
        })
    }

    /// The user's frames of a captured stack (innermost first): from the first frame that
    /// is neither Ember's nor glue, outwards, skipping glue, at most [`MAX_USER_FRAMES`].
    /// Empty when no such frame was captured.
    pub(crate) fn user_frames(&mut self, ips: &[usize]) -> Vec<String> {
        let mut out = Vec::new();
        let mut inside = false;
        for &ip in ips {
            for f in self.frames(ip) {
                if f.outermost {
                    return out;
                }
                if f.glue {
                    continue;
                }
                if f.library {
                    // Ember frames above the call site (a closure the user passed in, say)
                    // belong to the stack once the call site was found.
                    if inside {
                        out.push(f.text.clone());
                    }
                } else {
                    inside = true;
                    out.push(f.text.clone());
                }
                if out.len() == MAX_USER_FRAMES {
                    return out;
                }
            }
        }
        out
    }
}

/// Whether `file` is a source of one of `crates`: `.../ember-tensor/src/...` in a checkout,
/// `.../ember-tensor-0.1.0/src/...` from a registry. Inlined frames of a build with line
/// tables only carry short function names (`matmul`), so their file tells.
fn in_sources_of(file: &Path, crates: &[&str]) -> bool {
    let parts: Vec<&str> = file
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .collect();
    parts.windows(2).any(|w| {
        w[1] == "src"
            && crates.iter().any(|c| {
                let dir = c.replace('_', "-");
                w[0] == dir
                    || w[0]
                        .strip_prefix(&dir)
                        .and_then(|v| v.strip_prefix('-'))
                        .is_some_and(|v| v.starts_with(|ch: char| ch.is_ascii_digit()))
            })
    })
}

/// A path relative to the working directory when it is inside it, as written otherwise.
fn shown(file: &Path, cwd: Option<&Path>) -> String {
    cwd.and_then(|c| file.strip_prefix(c).ok())
        .unwrap_or(file)
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crates_of_demangled_names() {
        assert_eq!(crate_of("ember_tensor::ops::add"), "ember_tensor");
        assert_eq!(
            crate_of("<ember_nn::layers::Linear as ember_nn::Module>::forward"),
            "ember_nn"
        );
        assert_eq!(crate_of("my_app::train::{{closure}}"), "my_app");
        assert_eq!(crate_of("main"), "main");
    }

    #[test]
    fn library_sources_by_path() {
        for (path, yes) in [
            ("/work/main/crates/ember-tensor/src/ops/mod.rs", true),
            (
                "/home/u/.cargo/registry/src/x/ember-nn-0.1.0/src/lib.rs",
                true,
            ),
            ("/work/main/crates/ember-profiler/tests/profile.rs", false),
            ("/work/app/src/main.rs", false),
            ("/work/ember-tensorflow/src/lib.rs", false),
            ("/work/main/crates/ember-cli/src/train.rs", false),
        ] {
            assert_eq!(
                in_sources_of(Path::new(path), LIBRARY_CRATES),
                yes,
                "{path}"
            );
        }
    }

    #[test]
    fn glue_sources_by_path() {
        let f = "/root/.cargo/registry/src/index/backtrace-0.3.77/src/backtrace/mod.rs";
        assert!(in_sources_of(Path::new(f), GLUE_CRATES));
        assert!(!in_sources_of(
            Path::new("/work/app/src/main.rs"),
            GLUE_CRATES
        ));
    }

    #[test]
    fn relative_paths_inside_the_working_directory() {
        let cwd = Path::new("/work/app");
        assert_eq!(
            shown(Path::new("/work/app/src/main.rs"), Some(cwd)),
            "src/main.rs"
        );
        assert_eq!(
            shown(Path::new("/elsewhere/x.rs"), Some(cwd)),
            "/elsewhere/x.rs"
        );
        assert_eq!(shown(Path::new("src/lib.rs"), None), "src/lib.rs");
    }

    #[inline(never)]
    fn here() -> Vec<usize> {
        let mut ips = Vec::new();
        backtrace::trace(|f| {
            ips.push(f.ip() as usize);
            ips.len() < 32
        });
        ips
    }

    /// A stack captured in this crate's own test resolves, and (being `ember_profiler`'s)
    /// its frames are the library's: the user's frames start outside, at the test runner's
    /// or std's frames, which are glue, so nothing of Ember is reported as a call site.
    #[test]
    fn frames_inside_ember_are_not_call_sites() {
        let ips = here();
        assert!(!ips.is_empty());
        let mut s = Symbolizer::new();
        for f in s.user_frames(&ips) {
            assert!(!f.contains("ember_profiler::stack"), "{f}");
        }
        // Every address resolves to at least one frame or to nothing, never panics, and is
        // cached.
        let before = s.cache.len();
        let _ = s.user_frames(&ips);
        assert_eq!(s.cache.len(), before);
    }
}
