//! The launcher's output: each rank's lines forwarded whole, prefixed with `[rankR]:`.

use std::io::{BufRead, BufReader, Write};
use std::sync::mpsc;

/// One line of a rank's output, for the printer.
pub(super) enum Line {
    Out(String),
    Err(String),
}

/// Forwards `r`'s lines to `tx`, each through `map`, which gives the lines to print for it
/// (`None`: the output ended).
pub(super) fn pump<R: std::io::Read + Send + 'static>(
    r: R,
    tx: mpsc::Sender<Line>,
    is_err: bool,
    mut map: impl FnMut(Option<&str>) -> Vec<String> + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(r);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let (lines, ended) = match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => (map(None), true),
                Ok(_) => {
                    let s = String::from_utf8_lossy(&buf);
                    (map(Some(s.trim_end_matches(['\n', '\r']))), false)
                }
            };
            for line in lines {
                let l = if is_err {
                    Line::Err(line)
                } else {
                    Line::Out(line)
                };
                if tx.send(l).is_err() {
                    return;
                }
            }
            if ended {
                return;
            }
        }
    })
}

/// A `pump` map that prefixes every line with `prefix`.
pub(super) fn prefixer(prefix: String) -> impl FnMut(Option<&str>) -> Vec<String> {
    move |l| l.map(|l| format!("{prefix}{l}")).into_iter().collect()
}

/// Prints lines as they come, until every sender is gone.
pub(super) fn printer(rx: mpsc::Receiver<Line>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for l in rx {
            match l {
                Line::Out(s) => {
                    let mut o = std::io::stdout().lock();
                    let _ = writeln!(o, "{s}");
                    let _ = o.flush();
                }
                Line::Err(s) => {
                    let _ = writeln!(std::io::stderr().lock(), "{s}");
                }
            }
        }
    })
}

/// A `pump` map that prints `[1,R]<stdout>:text` as `[rankR]:text`, each rank's lines whole
/// (see Note [Tagged output comes in chunks]); other lines (mpirun's own) unchanged.
pub(super) fn retagger() -> impl FnMut(Option<&str>) -> Vec<String> {
    let mut lines = crate::tagged::TaggedLines::default();
    move |line| {
        let out = match line {
            Some(l) => lines.push(l),
            None => lines.finish(),
        };
        out.into_iter()
            .map(|(rank, text)| match rank {
                Some(r) => format!("[rank{r}]:{text}"),
                None => text,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mpirun_tags_become_rank_prefixes() {
        let mut retag = retagger();
        assert_eq!(retag(Some("[1,0]<stdout>:hello")), ["[rank0]:hello"]);
        assert_eq!(retag(Some("[1,12]<stderr>:x: y")), ["[rank12]:x: y"]);
        assert_eq!(retag(Some("plain")), ["plain"]);
        // A chunk left unfinished waits for its rest (Note [Tagged output comes in chunks]).
        assert!(
            retag(Some("[1,0]<stdout>:{\"a\": 0.9[1,1]<stdout>:x"))
                .contains(&"[rank1]:x".to_string())
        );
        assert_eq!(retag(Some("[1,0]<stdout>:5}")), ["[rank0]:{\"a\": 0.95}"]);
        assert_eq!(retag(Some("[1,1]<stdout>:tail")), ["[rank1]:tail"]);
        assert_eq!(retag(None), Vec::<String>::new());
    }
}
