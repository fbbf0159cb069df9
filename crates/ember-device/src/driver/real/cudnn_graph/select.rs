//! Which plans of cuDNN's graph API are made for a problem, and which one a run takes
//! (Note [cuDNN's graph API] in `cudnn_graph.rs`): rules on plain values, tested alone.

use super::MAX_PLANS;

/// Whether to finalize a plan of an engine that is `deterministic` or not, after `made`
/// plans of which `made_deterministic` says whether one is: up to [`MAX_PLANS`], and past
/// them only the first deterministic one (see Note [cuDNN's graph API]).
pub fn wants_plan(made: usize, made_deterministic: bool, deterministic: bool) -> bool {
    made < MAX_PLANS || (deterministic && !made_deterministic)
}

/// Which of a graph's plans, given as `(workspace bytes, deterministic)` best first, runs
/// algorithm number `index` (counted from `GRAPH_ALGO_BASE`) with `workspace` bytes: plan
/// `index` if it fits, else the first that fits; when `deterministic`, only deterministic
/// plans are taken. `None`: no plan qualifies.
pub fn pick_plan(
    plans: &[(usize, bool)],
    index: usize,
    workspace: usize,
    deterministic: bool,
) -> Option<usize> {
    let ok = |&(need, det): &(usize, bool)| need <= workspace && (det || !deterministic);
    plans
        .get(index)
        .filter(|p| ok(p))
        .map(|_| index)
        .or_else(|| plans.iter().position(ok))
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

    #[test]
    fn a_plan_is_picked_by_number_workspace_and_determinism() {
        // (workspace, deterministic), best first.
        let plans = [(1 << 20, false), (0, true), (4096, true), (0, false)];
        // The numbered plan when it fits.
        assert_eq!(pick_plan(&plans, 0, 1 << 20, false), Some(0));
        assert_eq!(pick_plan(&plans, 2, 4096, true), Some(2));
        // Else the first that fits.
        assert_eq!(pick_plan(&plans, 0, 4096, false), Some(1));
        assert_eq!(pick_plan(&plans, 9, 0, false), Some(1));
        // Deterministic: a nondeterministic plan is never taken, even the numbered one.
        assert_eq!(pick_plan(&plans, 0, 1 << 20, true), Some(1));
        assert_eq!(pick_plan(&plans, 3, 0, true), Some(1));
        assert_eq!(pick_plan(&[(0, false), (64, true)], 0, 0, true), None);
        assert_eq!(pick_plan(&plans[..1], 0, 0, false), None);
    }
}
