//! `edgellm-allreduce-fuse IN.onnx -o OUT.onnx`: see the crate docs and docs/FUSION.md,
//! "Using the fused op with Edge-LLM models".

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use edgellm_allreduce_fuse::error::{Error, Result};
use edgellm_allreduce_fuse::rewrite::Fields;
use edgellm_allreduce_fuse::{check_structure, fuse, model_file, Options};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Strategy {
    Nccl,
    Oneshot,
    Twoshot,
    Auto,
}

/// Fuses every AllReducePlugin -> [bias Add] -> residual Add -> RMSNorm chain of an ONNX model
/// (as Edge-LLM exports it) into one AllReducePlugin node with fusion_op = 1, and prints one
/// line per AllReducePlugin node: what was fused, what was left and why.
#[derive(Parser, Debug)]
#[command(name = "edgellm-allreduce-fuse", version)]
struct Cli {
    /// The ONNX model to read (external data files stay where they are).
    input: PathBuf,
    /// Where to write the rewritten model: with external data, in the input's folder. Written
    /// byte for byte as read when nothing is fused.
    #[arg(short, long, required_unless_present = "dry_run")]
    output: Option<PathBuf>,
    /// Report what would be fused; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Fuse only candidate N (numbered as in the report, from 1); may be repeated.
    #[arg(long, value_name = "N")]
    only: Vec<usize>,
    /// The fused nodes' `strategy` field (absent: the plugin's AUTO).
    #[arg(long)]
    strategy: Option<Strategy>,
    /// The fused nodes' `config` field (bits USE_MEMCPY=1, RESIDUAL_RMS_NORM=2).
    #[arg(long, value_parser = clap::value_parser!(i64).range(0..=3))]
    config: Option<i64>,
}

/// Prints a line; a closed stdout (`| head`) is not an error of the pass.
fn say(text: impl std::fmt::Display) {
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

fn run(cli: &Cli) -> Result<()> {
    let (bytes, mut model) = model_file::read(&cli.input)?;
    if let Some(out) = &cli.output {
        model_file::check_output_folder(&cli.input, out, &model)?;
    }
    let before = check_structure(&model);
    let strategy = cli.strategy.map(|s| s as i64);
    let options = Options { only: cli.only.clone(), fields: Fields { strategy, config: cli.config } };
    let report = fuse(&mut model, &options, &model_file::data_dir(&cli.input))?;
    say(&report);
    if let Err(e) = &before {
        eprintln!("warning: the input model already fails the structural check: {e}");
    } else if let Err(e) = check_structure(&model) {
        return Err(Error::Invalid(e));
    }
    let Some(out) = cli.output.as_ref().filter(|_| !cli.dry_run) else {
        say("dry run: nothing written");
        return Ok(());
    };
    let written = if report.fused() == 0 { bytes } else { model_file::serialize(&model)? };
    model_file::write(out, &written)?;
    say(format_args!("wrote {}", out.display()));
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edgellm-allreduce-fuse: {e}");
            ExitCode::FAILURE
        }
    }
}
