//! The `zerostream` command line: `devices`, `eval`, `bench`. Each subcommand's flags are resolved and
//! checked here, then handed to the library.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use zerostream::bench::{AdamBenchConfig, HalfOrFull};
use zerostream::device::{self, DeviceChoice};

#[derive(Parser)]
#[command(name = "zerostream", version, about = "Train models larger than GPU memory: ZeRO-style offload with WGSL kernels on any GPU.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct DeviceArgs {
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
    /// List the GPU adapters wgpu finds, with the limits and features zerostream uses.
    Devices {
        /// Print one JSON object per adapter instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Mean loss of a model over the first micro-batches of a token file; prints one JSON line.
    Eval {
        /// A Hugging Face GPT-2 directory: config.json and model.safetensors (or sharded with an index).
        #[arg(long)]
        model: PathBuf,
        /// Token file: llm.c's format (header with magic 20240520) or raw little-endian uint16.
        #[arg(long)]
        data: PathBuf,
        /// B: sequences per micro-batch.
        #[arg(long, default_value_t = 4)]
        batch_size: usize,
        /// T: tokens per sequence (at most the model's n_positions).
        #[arg(long, default_value_t = 64)]
        seq_len: usize,
        /// N: how many micro-batches, from the start of the file (wrapping around).
        #[arg(long, default_value_t = 1)]
        batches: usize,
        #[command(flatten)]
        device: DeviceArgs,
    },
    /// Measure one link of the offload path against its ceiling.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// CPU AdamW throughput, and the machine's memory bandwidth (STREAM triad) in the same run.
    Adam {
        /// Parameters in the shard.
        #[arg(long, default_value_t = 64 << 20)]
        params: usize,
        /// CPU threads (0 = one per core).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Precision of the gradients the update reads.
        #[arg(long, value_enum, default_value = "bf16")]
        grad: HalfOrFull,
        /// Precision of the parameter copy written for the GPU (`f32` = no copy).
        #[arg(long, value_enum, default_value = "bf16")]
        copy: HalfOrFull,
        /// Timed steps; the best is reported.
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Devices { json } => {
            let adapters = device::gpu::list_adapters();
            if json {
                for a in &adapters {
                    println!(
                        "{}",
                        serde_json::json!({
                            "index": a.index, "name": a.name, "backend": a.backend,
                            "type": format!("{:?}", a.device_type), "driver": a.driver,
                            "max_storage_binding_bytes": a.max_storage_binding_bytes,
                            "max_buffer_bytes": a.max_buffer_bytes,
                            "max_workgroup_storage_bytes": a.max_workgroup_storage_bytes,
                            "max_invocations_per_workgroup": a.max_invocations_per_workgroup,
                            "shader_f16": a.shader_f16, "timestamp_query": a.timestamp_query, "subgroup": a.subgroup,
                        })
                    );
                }
                return Ok(());
            }
            if adapters.is_empty() {
                println!("no GPU adapters found; `--device auto` will use the cpu device");
            }
            for a in &adapters {
                println!("[{}] {} ({}, {:?}) driver: {}", a.index, a.name, a.backend, a.device_type, a.driver);
                println!(
                    "    max storage binding {} MiB, max buffer {} MiB, workgroup storage {} KiB, {} invocations/workgroup",
                    a.max_storage_binding_bytes >> 20,
                    a.max_buffer_bytes >> 20,
                    a.max_workgroup_storage_bytes >> 10,
                    a.max_invocations_per_workgroup
                );
                println!("    shader-f16: {}, timestamp-query: {}, subgroup: {}", a.shader_f16, a.timestamp_query, a.subgroup);
            }
            println!("cpu: the plain-Rust kernels on {} threads (--device cpu)", rayon::current_num_threads());
            Ok(())
        }
        Command::Eval { model, data, batch_size, seq_len, batches, device } => {
            let dev = device::open(device.device, device.adapter.as_deref(), None)?;
            eprintln!("device: {}", dev.describe());
            let report = zerostream::eval::evaluate_on(&dev, &model, &data, batch_size, seq_len, batches)?;
            println!("{}", report.to_json(&dev.describe()));
            Ok(())
        }
        Command::Bench(BenchCommand::Adam { params, threads, grad, copy, reps, json }) => {
            let r = zerostream::bench::bench_adam(&AdamBenchConfig { params, threads, grad, copy, reps })?;
            if json {
                println!("{}", r.to_json());
            } else {
                println!(
                    "adam: {} params, {:?} grads, {:?} copy, {} threads ({}): {:.2} Gparam/s, {} B/param = {:.1} GB/s; triad {:.1} GB/s; {:.0}% of triad",
                    r.params, r.grad, r.copy, r.threads, r.isa, r.gparams_per_s, r.bytes_per_param, r.adam_gbps, r.triad_gbps,
                    100.0 * r.fraction_of_triad()
                );
            }
            Ok(())
        }
    }
}
