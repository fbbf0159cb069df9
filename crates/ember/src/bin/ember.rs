//! The `ember` program. `ember info` prints the setup checks the walk-throughs print.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Ember: a deep-learning framework with PyTorch's GPU workflow.
#[derive(Debug, Parser)]
#[command(name = "ember", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show CUDA availability, devices and their properties, the CPU, and memory statistics.
    Info {
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Info { json } => {
            let info = ember::info::collect();
            if json {
                match serde_json::to_string_pretty(&info) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("ember info: cannot serialise: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                print!("{}", info.to_text());
            }
        }
    }
    ExitCode::SUCCESS
}
