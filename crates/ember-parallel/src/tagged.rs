//! Reading `mpirun --tag-output`: each rank's lines, whole.
//!
//! Note [Tagged output comes in chunks]: `mpirun` forwards a rank's output in the chunks its daemon happened to read from the
//! rank's pipe, and tags each chunk (`[JOB,RANK]<stdout>:`) and each line inside it. A chunk
//! that ends inside a line is continued by the next chunk *on the same output line*, after a
//! new tag — which may be another rank's, whose chunk came in between:
//!
//! ```text
//! [1,0]<stdout>:  "val_accuracy": 0.9[1,1]<stdout>:step 3[1,0]<stdout>:63,
//! ```
//!
//! So every tag but the last on a line starts a piece that the rank left unfinished, and
//! only the last piece ends a line of the rank's own. Reading every piece as a line of its
//! own split rank 0's pretty-printed JSON mid-number (a flake of the `launch_train` test).
//! [`TaggedLines`] keeps the unfinished piece of each (rank, stream) until its rest comes.

use std::collections::HashMap;

/// One line out of [`TaggedLines`]: a rank's (`Some(rank)`) or `mpirun`'s own (`None`).
pub(crate) type RankLine = (Option<usize>, String);

/// Reassembles ranks' lines from `--tag-output` lines. See Note [Tagged output comes in
/// chunks].
#[derive(Default)]
pub(crate) struct TaggedLines {
    /// The unfinished line of each (rank, stream).
    partial: HashMap<(usize, Stream), String>,
}

impl TaggedLines {
    /// One line of `mpirun`'s output (without its newline): the lines it finishes, in order.
    pub(crate) fn push(&mut self, line: &str) -> Vec<RankLine> {
        let pieces = tagged_pieces(line);
        let Some(&(first, ..)) = pieces.first() else {
            return vec![(None, line.to_string())];
        };
        let mut out = Vec::new();
        if first > 0 {
            out.push((None, line[..first].to_string()));
        }
        let last = pieces.len() - 1;
        for (k, &(_, rank, stream, text)) in pieces.iter().enumerate() {
            let buf = self.partial.entry((rank, stream)).or_default();
            buf.push_str(text);
            if k == last {
                out.push((Some(rank), std::mem::take(buf)));
            }
        }
        out
    }

    /// The lines the ranks left unfinished when the output ended, by rank.
    pub(crate) fn finish(&mut self) -> Vec<RankLine> {
        let mut rest: Vec<_> = self
            .partial
            .drain()
            .filter(|(_, s)| !s.is_empty())
            .collect();
        rest.sort_by_key(|(key, _)| *key);
        rest.into_iter().map(|((r, _), s)| (Some(r), s)).collect()
    }
}

/// All of `text`'s lines through [`TaggedLines`].
pub(crate) fn rank_lines(text: &str) -> Vec<RankLine> {
    let mut t = TaggedLines::default();
    let mut out: Vec<RankLine> = text.lines().flat_map(|l| t.push(l)).collect();
    out.extend(t.finish());
    out
}

/// The stream a tag names.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
    Stddiag,
}

/// The pieces of a line, each after a `[JOB,RANK]<stream>:` tag: (tag start, rank, stream,
/// text).
pub(crate) fn tagged_pieces(line: &str) -> Vec<(usize, usize, Stream, &str)> {
    let mut tags: Vec<(usize, usize, usize, Stream)> = Vec::new(); // (tag start, text start, rank, stream)
    let mut from = 0;
    while let Some(i) = line[from..].find('[') {
        let start = from + i;
        if let Some((rank, stream, len)) = parse_tag(&line[start..]) {
            tags.push((start, start + len, rank, stream));
            from = start + len;
        } else {
            from = start + 1;
        }
    }
    tags.iter()
        .enumerate()
        .map(|(k, &(start, text, rank, stream))| {
            let end = tags.get(k + 1).map_or(line.len(), |t| t.0);
            (start, rank, stream, &line[text..end])
        })
        .collect()
}

/// `[JOB,RANK]<stdout>:` (or `<stderr>:`, `<stddiag>:`) at the start of `s`: the rank, the
/// stream and the tag's length.
fn parse_tag(s: &str) -> Option<(usize, Stream, usize)> {
    let rest = s.strip_prefix('[')?;
    let close = rest.find(']')?;
    let (job, rank) = rest[..close].split_once(',')?;
    if job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let rank = rank.parse().ok()?;
    let after = &rest[close + 1..];
    let (tag, stream) = [
        ("<stdout>:", Stream::Stdout),
        ("<stderr>:", Stream::Stderr),
        ("<stddiag>:", Stream::Stddiag),
    ]
    .into_iter()
    .find(|(t, _)| after.starts_with(t))?;
    Some((rank, stream, 1 + close + 1 + tag.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<(Option<usize>, String)> {
        rank_lines(text)
    }

    fn want(expected: &[(Option<usize>, &str)]) -> Vec<(Option<usize>, String)> {
        expected.iter().map(|&(r, s)| (r, s.to_string())).collect()
    }

    #[test]
    fn whole_lines_keep_their_rank_and_untagged_lines_are_mpiruns() {
        assert_eq!(
            lines("[1,0]<stdout>:hello\nmpirun noise\n[1,12]<stderr>:x: y\n"),
            want(&[
                (Some(0), "hello"),
                (None, "mpirun noise"),
                (Some(12), "x: y")
            ])
        );
        assert_eq!(parse_tag("no tag"), None);
        assert_eq!(parse_tag("[a,1]<stdout>:"), None);
        assert_eq!(parse_tag("[1,1]<other>:"), None);
    }

    #[test]
    fn a_line_split_into_chunks_is_joined_again() {
        // Rank 0's number cut by the chunking, rank 1's line in between.
        let out = "[1,0]<stdout>:  \"acc\": 0.9[1,1]<stdout>:step 3\n[1,0]<stdout>:63,\n";
        assert_eq!(
            lines(out),
            want(&[(Some(1), "step 3"), (Some(0), "  \"acc\": 0.963,")])
        );
        // The same rank's two chunks on one line.
        assert_eq!(
            lines("[1,0]<stdout>:ab[1,0]<stdout>:cd\n"),
            want(&[(Some(0), "abcd")])
        );
        // stdout and stderr of one rank are kept apart.
        assert_eq!(
            lines("[1,0]<stdout>:a[1,0]<stderr>:e\n[1,0]<stdout>:b\n"),
            want(&[(Some(0), "e"), (Some(0), "ab")])
        );
    }

    #[test]
    fn an_unfinished_line_at_the_end_is_still_returned() {
        assert_eq!(
            lines("[1,1]<stdout>:test x ... [1,0]<stdout>:done\n"),
            want(&[(Some(0), "done"), (Some(1), "test x ... ")])
        );
        assert_eq!(
            lines("[1,0]<stdout>:no newline"),
            want(&[(Some(0), "no newline")])
        );
    }
}
