//! Which plans of cuDNN's graph API are made for a problem (Note [cuDNN's graph API] in
//! `cudnn_graph.rs`): rules on plain values, tested alone.

use super::MAX_PLANS;

/// Whether to finalize a plan of an engine that is `deterministic` or not, after `made`
/// plans of which `made_deterministic` says whether one is: up to [`MAX_PLANS`], and past
/// them only the first deterministic one (see Note [cuDNN's graph API]).
pub fn wants_plan(made: usize, made_deterministic: bool, deterministic: bool) -> bool {
    made < MAX_PLANS || (deterministic && !made_deterministic)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engines `build_plans` finalizes from a heuristics list of engines that are
    /// deterministic or not (every one planned successfully), by index.
    fn planned(engines: &[bool]) -> Vec<usize> {
        let mut made: Vec<bool> = Vec::new();
        let mut chosen = Vec::new();
        for (i, &det) in engines.iter().enumerate() {
            if !wants_plan(made.len(), made.contains(&true), true) {
                break;
            }
            if wants_plan(made.len(), made.contains(&true), det) {
                made.push(det);
                chosen.push(i);
            }
        }
        chosen
    }

    #[test]
    fn a_deterministic_plan_is_made_past_the_cap_when_none_is_among_the_first() {
        assert_eq!(planned(&[true; 6]), [0, 1, 2, 3]);
        assert_eq!(
            planned(&[false, true, false, false, true, true]),
            [0, 1, 2, 3]
        );
        // Four nondeterministic engines first: the fifth plan is the first deterministic.
        let (n, d) = (false, true);
        assert_eq!(planned(&[n, n, n, n, n, d, n, d]), [0, 1, 2, 3, 5]);
        // None deterministic: MAX_PLANS plans, the rest looked at and left.
        assert_eq!(planned(&[n; 7]), [0, 1, 2, 3]);
        assert_eq!(planned(&[n, d]), [0, 1]);
    }
}
