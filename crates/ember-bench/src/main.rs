//! Ember's benchmark program. Run it through `cargo xtask bench [--json] [--quick] [--filter S]
//! [--exact] [--device cpu|cuda|all]`.
//!
//! Every case produces a [`Record`]: `name`, `device`, `threads`, `value`, `unit`, plus
//! optional extras. Speed targets are ratios checked here and in the side-by-side script,
//! never timed assertions in tests.

mod alloc;
mod attention;
mod autograd;
mod conv;
mod dist;
mod dist_nodes;
mod harness;
mod matmul;
mod nn;
mod resnet;
mod tensor_ops;

use std::process::ExitCode;

use harness::{Options, Record};

/// One group of cases: appends its records, or says why it could not.
type Suite = fn(&Options, &mut Vec<Record>) -> Result<(), String>;

fn main() -> ExitCode {
    let opts = match Options::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ember-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    // A launcher of the 2-node case (Note [Benchmark nodes] in dist_nodes.rs).
    if let Some((node, port)) = dist_nodes::launcher_node() {
        return dist_nodes::launcher_main(node, port);
    }
    // A rank started by this program's multi-rank cases runs only those (Note [Benchmark
    // ranks] in dist.rs).
    if let Some(out) = dist::rank_output() {
        return match dist::rank_main(&opts, &out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ember-bench (rank): {e}");
                ExitCode::FAILURE
            }
        };
    }
    if opts.cuda()
        && let Err(e) = harness::choose_cuda_driver()
    {
        eprintln!("ember-bench: {e}");
        return ExitCode::FAILURE;
    }
    let mut records: Vec<Record> = Vec::new();
    let suites: [Suite; 9] = [
        alloc::run,
        matmul::run,
        autograd::run,
        tensor_ops::run,
        nn::run,
        conv::run,
        resnet::run,
        attention::run,
        dist::run,
    ];
    for run in suites {
        if let Err(e) = run(&opts, &mut records) {
            eprintln!("ember-bench: {e}");
            return ExitCode::FAILURE;
        }
    }
    harness::report(&opts, &records);
    ExitCode::SUCCESS
}
