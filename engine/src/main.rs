//! The `zerostream` command line. Each subcommand's flags are resolved and checked here (or in
//! [`cli`]), then handed to the library.

mod cli;

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use cli::bench::BenchCommand;
use cli::train::TrainArgs;
use zerostream::device::attention_tuning::AttentionTable;
use zerostream::device::matmul_tuning::{MatmulTable, TableSource};
use zerostream::device::{self, DeviceChoice};

#[derive(Parser)]
#[command(name = "zerostream", version, about = "Train models larger than GPU memory: ZeRO-style offload with WGSL kernels on any GPU.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print only results, warnings and errors: no progress bar or progress lines, no run description
    /// or summary (train, eval, generate, prepare, plot, bench adam, kernels and all, and selftest
    /// --json's text lines on stderr; placed before or after the command; tune prints what it times).
    /// Without it, progress is a bar on a terminal and one plain line per update elsewhere (a log file,
    /// a pipe).
    #[arg(long, global = true)]
    quiet: bool,
}

#[derive(clap::Args, Clone)]
pub struct DeviceArgs {
    /// Where to compute: `auto` takes a real GPU if there is one, else the cpu device; `gpu` takes a
    /// wgpu adapter (software ones such as lavapipe too); `cpu` runs the plain-Rust kernels.
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceChoice,
    /// Which wgpu adapter: its index or part of its name, as `zerostream devices` lists them.
    #[arg(long)]
    adapter: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// List the GPU adapters wgpu finds, with the limits and features zerostream uses, and the cpu device.
    Devices {
        /// Print one JSON object per device instead of a table: each adapter (`"device": "gpu"`, its
        /// index, limits, features and tables), then the cpu device (`"device": "cpu"`, its threads);
        /// `"auto": true` marks the one `--device auto` opens.
        #[arg(long)]
        json: bool,
    },
    /// Mean loss of a model over the first micro-batches of a token file; prints one JSON line.
    Eval {
        /// A Hugging Face model directory (GPT-2 or Llama): config.json and model.safetensors (or sharded);
        /// or a --checkpoint-dir, meaning the checkpoint its `latest` names.
        #[arg(long)]
        model: PathBuf,
        /// Token file: llm.c's formats (header with magic 20240520: uint16 tokens; 20240801: uint32) or raw
        /// little-endian tokens (see --data-dtype).
        #[arg(long)]
        data: PathBuf,
        /// Token width of a raw --data file without llm.c's header: u16 or u32.
        #[arg(long, value_enum, default_value = "u16")]
        data_dtype: zerostream_checkpoints::TokenWidth,
        /// B: sequences per micro-batch.
        #[arg(long, default_value_t = 4, value_parser = crate::positive_count())]
        batch_size: usize,
        /// T: tokens per sequence (at most the model's n_positions).
        #[arg(long, default_value_t = 64, value_parser = crate::positive_count())]
        seq_len: usize,
        /// N: how many micro-batches, from the start of the file; at most as many as it holds (said when
        /// this asks for more, since the first ones read again would count twice).
        #[arg(long, default_value_t = 1, value_parser = crate::positive_count())]
        batches: usize,
        #[command(flatten)]
        device: DeviceArgs,
    },
    /// Train a GPT-2 or Llama-family model with parameters streamed to the device and AdamW on the CPU.
    /// With no --model, --config or --data: a small GPT-2 on Shakespeare's Hamlet in words (built in), a
    /// few minutes. Exits 0 when done, 130 or 143 when SIGINT or SIGTERM stopped it (after the step and
    /// its checkpoint), 2 when the command line cannot be read (an unknown flag, a value of the wrong
    /// form), 1 on any other error (a value refused once read, such as a rate out of range, included).
    Train(Box<TrainArgs>),
    /// Does it fit? The placement `train` would use with the same flags — host bytes per rank on each
    /// tier, device bytes, block slots — for a model, a batch, a world size and a ZeRO stage, without
    /// loading weights or training. Exits 1, with the numbers, when the device budget is too small, and 3
    /// when all ranks' host state would not fit in the RAM available on this machine (ranks spread
    /// over several machines may still fit).
    Plan(Box<TrainArgs>),
    /// Tokenise a text file into token files `train --data` / `--val-data` read (llm.c's format).
    Prepare(cli::prepare::PrepareArgs),
    /// Generate text from a saved model (greedy or sampled), printed as it comes; on a GPU or the cpu device.
    Generate(Box<cli::generate::GenerateArgs>),
    /// Training curves from metrics files (`train --metrics`): loss and validation loss against tokens,
    /// learning rate and tokens/s against the step; several files are overlaid for comparison.
    Plot {
        /// Metrics files (one JSON object per step), one curve each.
        #[arg(required = true)]
        metrics: Vec<PathBuf>,
        /// The SVG file to write.
        #[arg(short, long, default_value = "loss.svg")]
        out: PathBuf,
    },
    /// Time the fp32 matmul's variants on this GPU for the products of GPT-2 and Llama training steps, the
    /// training attention kernels' variants (forward and backward) at their head dims and --seq-len, and,
    /// where the adapter has cooperative matrices, the f16 cooperative-matrix matmul's (`train
    /// --matmul-inputs f16`), and keep the fastest per shape class in a table in the user's cache directory (by adapter, driver
    /// and zerostream version; `ZEROSTREAM_TUNE_DIR` overrides the place). Every later run on the adapter
    /// uses it; `devices` says which table is in use. Variants give identical bits: only the speed changes.
    /// Each class's "default" time is the vendor's built-in variant's, which an untuned run uses.
    Tune(Box<cli::tune::TuneArgs>),
    /// Measure one link of the offload path against its ceiling.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Check every kernel on this device against its plain-Rust twin: seeded random inputs at awkward
    /// sizes, a line per kernel (PASS or FAIL, the worst error and its tolerance), what the adapter
    /// lacks, then `selftest: N passed, M failed`. Exit code 0 when nothing failed, 1 when something did.
    /// On `--device cpu` it checks the cpu device's fast kernels against the same twins.
    Selftest(cli::selftest::SelftestArgs),
}

/// `--grad-compression MODE` (train and bench collectives): the error names the flag and the modes.
pub(crate) fn parse_grad_compression(text: &str) -> Result<zerostream::comm::compress::GradCompression, String> {
    text.parse().map_err(|e: anyhow::Error| e.to_string())
}

/// The value parser of a time in seconds (`tune --max-seconds`, `selftest --check-timeout`): 0 to 1e9,
/// fractions allowed.
pub(crate) fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=1e9).contains(&s) => Ok(s),
        _ => Err(format!("expected seconds from 0 to 1e9, e.g. 170 or 2.5; got {text:?}")),
    }
}

/// The value parser of a count that must be at least 1 (a batch, a world size, a number of batches):
/// "invalid value '0' for '--seq-len <SEQ_LEN>': must be at least 1".
pub(crate) fn positive_count() -> fn(&str) -> Result<usize, String> {
    |text| match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err("expected a whole number of at least 1".to_string()),
    }
}

/// `--gpu-mem-budget 2GiB`, `--block-size 1MiB`: bytes with an optional binary unit.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    device::parse_bytes(text).map_err(|e| e.to_string())
}

fn main() {
    quiet_on_closed_stdout();
    // SAFETY: no other thread has started yet.
    unsafe { device::gpu::quiet_wayland_probe() };
    let matches = parse_args().unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    });
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // The flags typed on the command line (not defaulted), by flag name: `--resume` keeps the
    // checkpoint's settings for the rest.
    let explicit: BTreeSet<String> = matches
        .subcommand()
        .map(|(_, sub)| {
            sub.ids()
                // `--quiet` says how much to print, not what to run: a resume or the first run ignores it.
                .filter(|id| id.as_str() != "quiet" && sub.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine))
                .map(|id| id.as_str().replace('_', "-"))
                .collect()
        })
        .unwrap_or_default();
    // Of those, the ones whose value is not their default: the resolved copy a run is repeated from
    // lists every flag, and only a value someone chose is worth a note that it does nothing.
    let changed: BTreeSet<String> = matches.subcommand().map(|(name, sub)| changed_flags(name, sub, &explicit)).unwrap_or_default();
    // `train`'s flags as resolved (file, command line, defaults), for the copy beside its metrics.
    let resolved = matches
        .subcommand()
        .filter(|(name, _)| *name == "train")
        .map(|(name, sub)| cli::config_file::resolved(Cli::command().find_subcommand(name).expect("train"), sub))
        .unwrap_or_default();
    match run(cli, &Given { explicit, changed }, &resolved) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Exit code of a command whose standard output was closed under it (`zerostream devices | head`):
/// the shell's code for a process a closed pipe stopped (128 + SIGPIPE).
const CLOSED_STDOUT_EXIT_CODE: i32 = 141;

/// Makes a closed standard output end the command quietly, as it does Unix's own tools: Rust ignores
/// SIGPIPE, so `println!` into a closed pipe panics instead. Leaving SIGPIPE ignored keeps a closed
/// socket under MPI an error the transport reports rather than a silent death. Any other failure to
/// write standard output (a full disk, `> /dev/full`) is an error in words, not a panic.
fn quiet_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info.payload().downcast_ref::<String>().map(String::as_str).unwrap_or_default();
        if let Some(why) = message.strip_prefix("failed printing to stdout: ") {
            if why.contains("Broken pipe") {
                std::process::exit(CLOSED_STDOUT_EXIT_CODE);
            }
            eprintln!("error: writing to standard output failed: {why}");
            std::process::exit(1);
        }
        report(info)
    }));
}

/// `command` and every subcommand under it taking `-1` as a value (`--lr -1` then meets the flag's own
/// range check, not clap's "unexpected argument '-1'").
fn with_negative_numbers(command: clap::Command) -> clap::Command {
    let names: Vec<String> = command.get_subcommands().map(|s| s.get_name().to_string()).collect();
    names.iter().fold(command.allow_negative_numbers(true), |c, name| c.mut_subcommand(name, with_negative_numbers))
}

/// The command line, with `train`/`plan --config-file FILE`'s flags placed before the command line's
/// own (which win). A later flag overrides an earlier one of the same name.
fn parse_args() -> Result<clap::ArgMatches> {
    let command = || {
        // `--measure` is plan's; train refuses it, so its help leaves it out.
        let cli = with_negative_numbers(Cli::command()).mut_subcommand("train", |t| t.mut_arg("measure", |a| a.hide(true)));
        cli::config_file::COMMANDS.iter().fold(cli, |c, name| c.mut_subcommand(*name, |s| s.args_override_self(true)))
    };
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = command().get_matches_from(&argv);
    let Some((name, sub_matches)) = matches.subcommand().filter(|(n, _)| cli::config_file::COMMANDS.contains(n)) else {
        return Ok(matches);
    };
    let mut cmd = command();
    // Built, so the subcommand holds the global flags too (`quiet = true` in a config file).
    cmd.build();
    let sub = cmd.find_subcommand(name).expect("a subcommand of the table");
    let expanded = cli::config_file::expand_args(argv.clone(), name, sub, sub_matches)?;
    if expanded == argv {
        return Ok(matches);
    }
    Ok(command().get_matches_from(expanded))
}

/// Runs a subcommand; returns the exit code (non-zero when training was stopped by a signal).
/// The flags of `explicit` whose values differ from their defaults (a flag without a default counts).
fn changed_flags(name: &str, sub: &clap::ArgMatches, explicit: &BTreeSet<String>) -> BTreeSet<String> {
    let command = Cli::command();
    let Some(sub_command) = command.find_subcommand(name) else { return explicit.clone() };
    let text = |v: &std::ffi::OsStr| v.to_string_lossy().into_owned();
    explicit
        .iter()
        .filter(|flag| {
            let id = flag.replace('-', "_");
            let Some(arg) = sub_command.get_arguments().find(|a| a.get_id().as_str() == id) else { return true };
            let defaults: Vec<String> = arg.get_default_values().iter().map(|v| text(v)).collect();
            let given: Vec<String> = sub.get_raw(&id).map(|values| values.map(text).collect()).unwrap_or_default();
            defaults.is_empty() || given != defaults
        })
        .cloned()
        .collect()
}

/// The flags given: typed (on the command line or in a --config-file) and, of those, not at their defaults.
pub(crate) struct Given {
    pub(crate) explicit: BTreeSet<String>,
    pub(crate) changed: BTreeSet<String>,
}

fn run(cli: Cli, given: &Given, resolved: &str) -> Result<i32> {
    let cli_quiet = cli.quiet;
    if !runs_in_this_process(&cli.command) {
        return Ok(0);
    }
    match cli.command {
        Command::Devices { json } => print_devices(json),
        Command::Eval { model, data, data_dtype, batch_size, seq_len, batches, device } => {
            let dev = device::open(device.device, device.adapter.as_deref(), None)?;
            if !cli_quiet {
                eprintln!("device: {}", dev.describe());
            }
            let eval = zerostream::EvalData { path: &data, dtype: data_dtype, batch: batch_size, seq_len, batches, progress: !cli_quiet };
            // A checkpoint root means its latest checkpoint's model.
            let model = zerostream::checkpoints::checkpoint::model_dir(&model)?;
            let report = zerostream::eval::evaluate_on(&dev, &model, &eval)?;
            println!("{}", report.to_json(&dev.describe()));
            Ok(0)
        }
        Command::Train(args) => cli::train::train(*args, given, resolved, cli_quiet),
        Command::Plan(args) => cli::train::plan(*args, given),
        Command::Bench(b) => cli::bench::run(b, cli_quiet).map(|()| 0),
        Command::Tune(args) => cli::tune::run(*args),
        Command::Plot { metrics, out } => {
            if let Some(input) = metrics.iter().find(|m| zerostream::train::outputs::same_file(m, &out)) {
                anyhow::bail!("-o {} is the metrics file {}: it would be overwritten", out.display(), input.display());
            }
            if out.is_dir() {
                anyhow::bail!("-o {}: is a directory; give the SVG file's path (e.g. {})", out.display(), out.join("loss.svg").display());
            }
            if out.extension().is_some_and(|e| !e.eq_ignore_ascii_case("svg")) {
                anyhow::bail!("-o {}: plot writes SVG only; give a .svg path (or one without an extension)", out.display());
            }
            let curves = metrics.iter().map(|m| zerostream::plot::read_metrics(m)).collect::<Result<Vec<_>>>()?;
            zerostream::plot::plot(&curves, &out)?;
            if !cli_quiet {
                eprintln!("plot: {} ({})", out.display(), zerostream::words::counted(curves.len() as u64, "run"));
            }
            Ok(0)
        }
        Command::Prepare(args) => cli::prepare::prepare(args, cli_quiet).map(|()| 0),
        Command::Generate(args) => cli::generate::run(*args, cli_quiet).map(|()| 0),
        Command::Selftest(args) => cli::selftest::run(args, cli_quiet),
    }
}

/// Under mpirun, whether this process runs `command`. `train` and `bench collectives` run on every
/// rank (they are the job); a command about one machine (`devices`, `tune`, `selftest`, the other
/// benches) on the first process of each machine; any other (`eval`, `generate`, `plan`, `prepare`,
/// `plot`) on the first process alone, so it is done and printed once rather than once a process.
/// The others end at once with success.
fn runs_in_this_process(command: &Command) -> bool {
    use zerostream::comm::{launcher_local_rank, launcher_rank};
    match command {
        Command::Train(_) | Command::Bench(BenchCommand::Collectives { .. }) => true,
        Command::Devices { .. } | Command::Tune(_) | Command::Selftest(_) | Command::Bench(_) => launcher_local_rank() == 0,
        Command::Eval { .. } | Command::Generate(_) | Command::Plan(_) | Command::Prepare(_) | Command::Plot { .. } => launcher_rank() == 0,
    }
}

/// `zerostream devices`: every adapter wgpu sees, with its limits, features and tuning tables (one JSON
/// object each with --json), then the cpu device.
fn print_devices(json: bool) -> Result<i32> {
    let adapters = device::gpu::list_adapters();
    let preferred = device::gpu::preferred_adapter(&adapters);
    if json {
        // One row a device, as the text lists them: each adapter, then the cpu device; `auto`: the one
        // `--device auto` opens.
        let auto = device::auto_among(&adapters);
        for a in &adapters {
            let mut row = adapter_json(a, preferred == Some(a.index));
            row["auto"] = (auto == DeviceChoice::Gpu && preferred == Some(a.index)).into();
            println!("{row}");
        }
        let threads = rayon::current_num_threads();
        println!("{}", serde_json::json!({ "device": "cpu", "threads": threads, "auto": auto == DeviceChoice::Cpu }));
        return Ok(0);
    }
    if adapters.is_empty() {
        println!("no GPU adapters found; `--device auto` will use the cpu device");
    }
    for a in &adapters {
        print_adapter(a, preferred == Some(a.index));
    }
    println!("cpu: the plain-Rust kernels on {} threads (--device cpu)", rayon::current_num_threads());
    Ok(0)
}

/// One adapter as `devices --json` prints it: its limits and features, and the tables it would run with.
fn adapter_json(a: &device::gpu::AdapterSummary, preferred: bool) -> serde_json::Value {
    let table = MatmulTable::load(a).0;
    serde_json::json!({
        "device": "gpu", "index": a.index, "preferred": preferred, "name": a.name, "backend": a.backend,
        "type": format!("{:?}", a.device_type), "driver": a.driver,
        "max_storage_binding_bytes": a.max_storage_binding_bytes,
        "max_buffer_bytes": a.max_buffer_bytes,
        "max_workgroup_storage_bytes": a.max_workgroup_storage_bytes,
        "max_invocations_per_workgroup": a.max_invocations_per_workgroup,
        "shader_f16": a.shader_f16, "timestamp_query": a.timestamp_query, "subgroup": a.subgroup,
        "cooperative_matrix": a.cooperative_matrix,
        "cooperative_matrix_configs": a.cooperative_matrix_configs.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        "matmul_f16_coop": device::gpu::coop_unavailable(a).is_none(),
        "matmul_table": table.describe(),
        "upload_staging": table.upload_staging.name(),
        "read_back": table.read_back.name(),
        "attention_table": AttentionTable::load(a).0.describe(),
    })
}

/// One adapter as `devices` prints it, in words: limits, features, what `--matmul-inputs f16` needs,
/// and the tuning tables (and upload and read-back kinds) it would run with.
fn print_adapter(a: &device::gpu::AdapterSummary, preferred: bool) {
    let opened = if preferred { " (opened by --device gpu without --adapter)" } else { "" };
    println!("[{}] {} ({}, {:?}) driver: {}{opened}", a.index, a.name, a.backend, a.device_type, a.driver);
    println!(
        "    max storage binding {} MiB, max buffer {} MiB, workgroup storage {} KiB, {} invocations/workgroup",
        a.max_storage_binding_bytes >> 20,
        a.max_buffer_bytes >> 20,
        a.max_workgroup_storage_bytes >> 10,
        a.max_invocations_per_workgroup
    );
    println!("    shader-f16: {}, timestamp-query: {}, subgroup: {}", a.shader_f16, a.timestamp_query, a.subgroup);
    let configs: Vec<String> = a.cooperative_matrix_configs.iter().map(|c| c.to_string()).collect();
    println!(
        "    cooperative matrices: {}; --matmul-inputs f16: {}",
        if configs.is_empty() { "none".to_string() } else { configs.join(", ") },
        device::gpu::coop_unavailable(a).map_or("available".to_string(), |why| format!("unavailable ({why})"))
    );
    let (table, problem) = MatmulTable::load(a);
    println!("    fp32 matmul variants: {}", table.describe());
    if let (None, Some(size)) = (device::gpu::coop_unavailable(a), a.coop_f16_size()) {
        println!(
            "    cooperative-matrix variants: {} tuned shape classes, default {}",
            table.coop_entries.values().filter(|t| t.coop == size).count(),
            table.coop_default_for(size)
        );
    }
    if let Some(problem) = problem {
        println!("    warning: {problem}");
    }
    println!(
        "    upload staging: {} (`zerostream tune` times mapped buffers against host memory and keeps the faster)",
        match table.upload_staging {
            device::UploadStaging::Mapped => "wgpu's mapped buffers",
            device::UploadStaging::Host => "host memory the GPU copies from",
        }
    );
    println!(
        "    read-back: {} (`zerostream tune` times mapped buffers against pinned host memory and keeps the faster)",
        match table.read_back {
            device::ReadBack::Mapped => "wgpu's mapped buffers",
            device::ReadBack::Pinned => "pinned host memory the GPU copies into",
        }
    );
    let (attention, problem) = AttentionTable::load(a);
    println!("    attention variants: {}", attention.describe());
    if let Some(problem) = problem.filter(|_| matches!(table.source, TableSource::Tuned { .. })) {
        println!("    warning: {problem}"); // (a file the matmul's loader refused is reported once, above)
    }
}
