//! The `ember` program. `ember train` trains a model on the shipped digits or, with `--model
//! gpt`, on the shipped text (Ember's main job); `ember generate` samples text from a gpt
//! checkpoint; `ember info` prints the setup checks the walk-throughs print; `ember launch` starts
//! the ranks of a distributed program, as torchrun.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ember_cli::train::{
    AmpDtype, DeviceChoice, EpochStats, GptOptions, ModelKind, Progress, TrainConfig,
};
use indicatif::{ProgressBar, ProgressStyle};

/// Ember: a deep-learning framework with PyTorch's GPU workflow.
#[derive(Debug, Parser)]
#[command(name = "ember", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start the ranks of PROGRAM on this node, as torchrun: each gets RANK (node_rank ·
    /// nproc_per_node + LOCAL_RANK), WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
    /// MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RESTART_COUNT; output lines are prefixed
    /// with `[rankR]:`; when a rank fails the others (on every node) are ended and launch
    /// exits with its code, or starts them all again (--max-restarts). On one node the
    /// ranks run under mpirun when it is installed (the mpi backend needs it).
    Launch {
        /// Ranks on this node.
        #[arg(long)]
        nproc_per_node: usize,
        /// Nodes in the job: run `ember launch` on each, with its --node-rank.
        #[arg(long, default_value_t = 1)]
        nnodes: usize,
        /// This node's rank (0..nnodes); node 0 serves the rendezvous store.
        #[arg(long, default_value_t = 0)]
        node_rank: usize,
        /// Node 0's address (MASTER_ADDR).
        #[arg(long, default_value = "127.0.0.1")]
        master_addr: String,
        /// The rendezvous store's port on node 0 (MASTER_PORT).
        #[arg(long, default_value_t = 29500)]
        master_port: u16,
        /// HOST:PORT of node 0: another spelling of --master-addr and --master-port.
        #[arg(long)]
        rdzv_endpoint: Option<String>,
        /// The job's id, the same on every node (TORCHELASTIC_RUN_ID).
        #[arg(long, default_value = "none")]
        rdzv_id: String,
        /// torchrun's rendezvous backend: `c10d` and `static` both mean node 0's store.
        #[arg(long, default_value = "static", value_parser = ["static", "c10d"])]
        rdzv_backend: String,
        /// `join_timeout=SECONDS`: how long the nodes wait for each other (default 600).
        #[arg(long)]
        rdzv_conf: Option<String>,
        /// Start every rank again this many times after a failure.
        #[arg(long, default_value_t = 0)]
        max_restarts: u32,
        /// The program and its arguments (after `--`).
        #[arg(last = true, required = true)]
        program: Vec<std::ffi::OsString>,
    },
    /// Show CUDA availability, devices and their properties, the CPU, and memory statistics.
    Info {
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Train a model on the 8x8 handwritten digits that ship with Ember (or, with --model
    /// gpt, a character-level transformer on Ember's own documentation, data/text), with a
    /// progress bar, validation accuracy (gpt: loss and perplexity) per epoch, peak memory,
    /// and resumable checkpoints.
    Train(Box<TrainArgs>),
    /// Print text sampled from a checkpoint of `ember train --model gpt --save`: the prompt
    /// and --max-new-tokens characters after it.
    Generate {
        /// A checkpoint written by `ember train --model gpt --save`.
        #[arg(long)]
        checkpoint: PathBuf,
        /// The text to continue (every character must be in the checkpoint's vocabulary).
        #[arg(long)]
        prompt: String,
        /// Characters to add.
        #[arg(long, default_value_t = 200)]
        max_new_tokens: usize,
        /// Divides the logits before the softmax; 0 takes the most likely character
        /// (greedy).
        #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
        temperature: f64,
        /// Sample among the K most likely characters only (1: greedy) [default: all].
        #[arg(long)]
        top_k: Option<usize>,
        /// Seed of the draws.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// auto (CUDA if available, else the CPU), cpu, cuda, or cuda:N.
        #[arg(long, default_value = "auto")]
        device: DeviceChoice,
    },
}

/// The options of `ember train`.
#[derive(Debug, clap::Args)]
struct TrainArgs {
    /// auto (CUDA if available, else the CPU), cpu, cuda, or cuda:N.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Passes over the training set (gpt: of --steps-per-epoch steps), in all when
    /// resuming [default: 30; gpt: 10].
    #[arg(long, allow_negative_numbers = true)]
    epochs: Option<usize>,
    /// Samples per step (gpt: windows of --block-size characters) [default: 64; gpt:
    /// 32].
    #[arg(long, allow_negative_numbers = true)]
    batch_size: Option<usize>,
    /// Adam's learning rate [default: 0.002]. With --resume: overrides the
    /// checkpoint's (a note on stderr says so).
    #[arg(long, allow_negative_numbers = true)]
    lr: Option<f64>,
    /// The model.
    #[arg(long, value_enum, default_value_t = ModelKind::Mlp)]
    model: ModelKind,
    /// The cnn's width: channels of its first convolution, twice as many in the second
    /// [default: 16]. With --resume: the checkpoint's.
    #[arg(long)]
    width: Option<usize>,
    /// Seed for initialisation, the split and the data order [default: 0]. With
    /// --resume: the checkpoint's; another seed is an error.
    #[arg(long, allow_negative_numbers = true)]
    seed: Option<u64>,
    /// Worker threads preparing batches ahead.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    num_workers: usize,
    /// Write a checkpoint (model, optimizer, epoch, RNG state) here after every epoch.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Continue from a checkpoint written by --save.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Mixed precision: forward and loss under autocast in bf16 (no loss scaling) or
    /// f16 (with a GradScaler), f32 master weights [default: f32 throughout].
    #[arg(long, value_enum)]
    amp: Option<AmpDtype>,
    /// Profile a few steps after a warm-up: trace files (Chrome/TensorBoard), a memory
    /// timeline and the top-10 table go here.
    #[arg(long, value_name = "DIR")]
    profile: Option<PathBuf>,
    /// Print one JSON summary on stdout (no progress bar).
    #[arg(long)]
    json: bool,
    /// The gpt's transformer blocks [default: 2]. With --resume: the checkpoint's.
    #[arg(long)]
    n_layer: Option<usize>,
    /// The gpt's attention heads per block [default: 4]. With --resume: the checkpoint's.
    #[arg(long)]
    n_head: Option<usize>,
    /// The gpt's width (d_model) [default: 64]. With --resume: the checkpoint's.
    #[arg(long)]
    d_model: Option<usize>,
    /// The gpt's context in characters [default: 64]. With --resume: the checkpoint's.
    #[arg(long)]
    block_size: Option<usize>,
    /// The gpt's optimizer steps per epoch, each on --batch-size random windows
    /// [default: 50].
    #[arg(long)]
    steps_per_epoch: Option<usize>,
}

/// The progress bar: one bar per epoch with the running loss and throughput, and a line
/// per finished epoch.
struct Bar {
    bar: Option<ProgressBar>,
    quiet: bool,
}

impl Progress for Bar {
    fn epoch_start(&mut self, epoch: usize, epochs: usize, batches: usize) {
        if self.quiet {
            return;
        }
        let bar = ProgressBar::new(batches as u64);
        let style = ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} batches {msg} ({elapsed})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(format!("epoch {epoch}/{epochs}"));
        self.bar = Some(bar);
    }
    fn batch(&mut self, loss: f64, samples_per_sec: f64) {
        if let Some(b) = &self.bar {
            b.set_message(format!("loss {loss:.4}, {samples_per_sec:.0} samples/s"));
            b.inc(1);
        }
    }
    fn note(&mut self, message: &str) {
        // On stderr even with --json: an override is never silent.
        match &self.bar {
            Some(b) => b.suspend(|| eprintln!("note: {message}")),
            None => eprintln!("note: {message}"),
        }
    }

    fn epoch_end(&mut self, s: &EpochStats) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        if self.quiet {
            return;
        }
        match s.val_perplexity {
            Some(ppl) => eprintln!(
                "epoch {:>3}: train loss {:.4}, val loss {:.4}, val perplexity {:.2}, next-char accuracy {:.2}%",
                s.epoch,
                s.train_loss,
                s.val_loss,
                ppl,
                100.0 * s.val_accuracy
            ),
            None => eprintln!(
                "epoch {:>3}: train loss {:.4}, val accuracy {:.2}%",
                s.epoch,
                s.train_loss,
                100.0 * s.val_accuracy
            ),
        }
    }
}

/// Prints `value` as one pretty JSON object on stdout.
fn print_json(command: &str, value: &impl serde::Serialize) -> ExitCode {
    match serde_json::to_string_pretty(value) {
        Ok(s) => {
            println!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{command}: cannot serialise: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Whether this process is rank 0 of a distributed run (or runs alone): the others train
/// silently (Note [Distributed training]).
fn is_rank_zero() -> bool {
    ["RANK", "OMPI_COMM_WORLD_RANK"]
        .iter()
        .find_map(|k| std::env::var(k).ok())
        .is_none_or(|r| r.trim() == "0")
}

fn train(cfg: TrainConfig, json: bool) -> ExitCode {
    let rank_zero = is_rank_zero();
    let mut bar = Bar {
        bar: None,
        quiet: json || !rank_zero,
    };
    // Options and files first: a bad --lr or an unreadable --resume fails before anything
    // is printed, naming its option.
    if let Err(e) = ember_cli::train::preflight(&cfg) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let (device, why) = match ember_cli::train::resolve_device(cfg.device) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !json && rank_zero {
        let precision = cfg
            .amp
            .map_or(String::new(), |a| format!(", autocast {}", a.as_str()));
        eprintln!(
            "training {} on {device}{precision} ({why})",
            cfg.model.as_str()
        );
    }
    let summary = match ember_cli::train::train(&cfg, &mut bar) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !rank_zero {
        return ExitCode::SUCCESS;
    }
    if json {
        return print_json("ember train", &summary);
    } else {
        let validation = match summary.val_perplexity {
            Some(ppl) => format!(
                "validation loss {:.4}, perplexity {ppl:.2} ({} characters held out)",
                summary.val_loss, summary.val_samples
            ),
            None => format!(
                "validation accuracy {:.2}% ({} samples)",
                100.0 * summary.val_accuracy,
                summary.val_samples
            ),
        };
        println!(
            "done: {} epoch(s) on {} in {}, {:.0} samples/s; final loss {:.4}, {validation}; peak memory {}",
            summary.epochs_run,
            summary.device,
            ember_cli::train::format_duration(summary.seconds),
            summary.samples_per_sec,
            summary.final_loss,
            ember_memory::format_size(summary.peak_memory_bytes)
        );
        if let Some(p) = &summary.checkpoint {
            println!("checkpoint: {p}");
        }
        if let Some(p) = &summary.profile {
            println!(
                "profile of steps {:?} (sorted by {}):\n{}traces: {}\nmemory timeline: {}",
                p.steps,
                p.sort_by,
                p.table,
                p.traces.join(", "),
                p.memory_timeline.as_deref().unwrap_or("(nothing recorded)")
            );
        }
    }
    ExitCode::SUCCESS
}

/// `ember train`: the options as a [`TrainConfig`] (the epochs' and the batch's defaults
/// are the model's), then [`train`].
fn train_command(a: TrainArgs) -> ExitCode {
    let cfg = TrainConfig {
        device: a.device,
        epochs: a.epochs.unwrap_or(a.model.default_epochs()),
        batch_size: a.batch_size.unwrap_or(a.model.default_batch_size()),
        lr: a.lr,
        model: a.model,
        width: a.width,
        seed: a.seed,
        num_workers: a.num_workers,
        save: a.save,
        resume: a.resume,
        amp: a.amp,
        profile: a.profile,
        steps_per_epoch: a.steps_per_epoch,
        gpt: GptOptions {
            n_layer: a.n_layer,
            n_head: a.n_head,
            d_model: a.d_model,
            block_size: a.block_size,
        },
        ..TrainConfig::default()
    };
    train(cfg, a.json)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Launch {
            nproc_per_node,
            nnodes,
            node_rank,
            master_addr,
            master_port,
            rdzv_endpoint,
            rdzv_id,
            rdzv_backend: _,
            rdzv_conf,
            max_restarts,
            program,
        } => {
            let mut opts = ember_parallel::launch::LaunchOptions::new(nproc_per_node, program);
            opts.nnodes = nnodes;
            opts.node_rank = node_rank;
            opts.master_addr = master_addr;
            opts.master_port = master_port;
            opts.run_id = rdzv_id;
            opts.max_restarts = max_restarts;
            let set = rdzv_endpoint
                .map_or(Ok(()), |e| opts.set_rdzv_endpoint(&e))
                .and_then(|()| rdzv_conf.map_or(Ok(()), |c| opts.set_rdzv_conf(&c)));
            if let Err(e) = set {
                eprintln!("ember launch: {e}");
                return ExitCode::FAILURE;
            }
            return match ember_parallel::launch::launch(&opts) {
                Ok(out) => ExitCode::from(u8::try_from(out.code).unwrap_or(1)),
                Err(e) => {
                    eprintln!("ember launch: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Info { json } => {
            let info = ember_cli::info::collect();
            if json {
                return print_json("ember info", &info);
            } else {
                print!("{}", info.to_text());
            }
        }
        Command::Train(args) => return train_command(*args),
        Command::Generate {
            checkpoint,
            prompt,
            max_new_tokens,
            temperature,
            top_k,
            seed,
            device,
        } => {
            let device = match ember_cli::train::resolve_device(device) {
                Ok((d, _)) => d,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let cfg = ember_cli::generate::GenerateConfig {
                checkpoint,
                prompt,
                max_new_tokens,
                temperature,
                top_k,
                seed,
                device,
            };
            match ember_cli::generate::generate(&cfg) {
                Ok(text) => println!("{text}"),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    ExitCode::SUCCESS
}
