//! `train`'s and `plan`'s flags: every one, with its help text, its default and its parser.

use std::path::PathBuf;

use zerostream::comm::compress::{GradCompression, ParamCompression};
use zerostream::train::{AdamState, LrSchedule, Optimizer, Precision, SaveDtype, ZeroStage};
use zerostream_checkpoints::TokenWidth;
use zerostream_offload::{IoConfig, IoEngineKind, Tier};

use crate::{DeviceArgs, parse_grad_compression, parse_size};

/// `--params-ram-cache`: a size, or `auto` (sized by `train::launch` from the RAM available).
#[derive(Clone, Copy, Debug)]
pub enum RamCache {
    Bytes(u64),
    Auto,
}

fn parse_ram_cache(text: &str) -> Result<RamCache, String> {
    if text.trim().eq_ignore_ascii_case("auto") { Ok(RamCache::Auto) } else { parse_size(text).map(RamCache::Bytes) }
}

/// Where a kind of state lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(in crate::cli) enum OffloadTarget {
    /// Host RAM (also spelled `ram`).
    #[value(alias = "ram")]
    Cpu,
    /// Files under --nvme-dir.
    Nvme,
}

impl OffloadTarget {
    pub(in crate::cli) fn tier(self) -> Tier {
        match self {
            OffloadTarget::Cpu => Tier::Ram,
            OffloadTarget::Nvme => Tier::Nvme,
        }
    }
}

#[derive(clap::Args)]
pub struct IoArgs {
    /// How NVMe files are read and written: `uring` (io_uring, Linux's default), `threads` (positioned
    /// reads and writes on a pool of threads, several requests in flight: the default elsewhere), or
    /// `mmap` (through the page cache, for comparison).
    #[arg(long, default_value_t = IoEngineKind::NATIVE)]
    pub(in crate::cli) io_engine: IoEngineKind,
    /// Bytes per NVMe request (a multiple of 4KiB).
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub(in crate::cli) block_size: u64,
    /// NVMe requests in flight.
    #[arg(long, default_value_t = 32)]
    pub(in crate::cli) queue_depth: usize,
    /// Use the page cache instead of uncached I/O (O_DIRECT on Linux, F_NOCACHE on macOS, unbuffered on Windows).
    #[arg(long)]
    pub(in crate::cli) buffered: bool,
}

impl IoArgs {
    pub(in crate::cli) fn config(&self) -> IoConfig {
        IoConfig { engine: self.io_engine, block_bytes: self.block_size as usize, queue_depth: self.queue_depth, direct: !self.buffered }
    }
}

fn parse_stage(text: &str) -> Result<ZeroStage, String> {
    text.trim().parse::<u8>().ok().and_then(ZeroStage::from_number).ok_or_else(|| format!("expected 0, 1, 2 or 3, got {text:?}"))
}

#[derive(clap::Args)]
pub struct TrainArgs {
    /// Flags from a TOML file, one `flag-name = value` per line (`lr = 3e-4`, `precision = "bf16"`,
    /// `recompute = true`); flags on the command line win. With --metrics, the run's resolved
    /// configuration is written beside them as `NAME.config.toml`, which repeats the run.
    #[arg(long)]
    pub(in crate::cli) config_file: Option<PathBuf>,
    /// A Hugging Face model directory to start from (GPT2LMHeadModel or LlamaForCausalLM: config.json +
    /// model.safetensors, or sharded).
    #[arg(long, conflicts_with = "config")]
    pub(in crate::cli) model: Option<PathBuf>,
    /// Start from random weights: a preset (gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-3.2-1b, llama-3.2-3b, llama-3-8b)
    /// or a config.json.
    #[arg(long)]
    pub(in crate::cli) config: Option<String>,
    /// Token file (llm.c's uint16 or Llama-3 uint32 format, or raw tokens: see --data-dtype; `zerostream
    /// prepare` writes one). Without --model and --config: the built-in Hamlet text; with either, required.
    #[arg(long)]
    pub(in crate::cli) data: Option<PathBuf>,
    /// Token width of a raw --data file without llm.c's header: u16 (GPT-2's vocabulary) or u32 (larger
    /// vocabularies, Llama-3's). llm.c's files say their own width.
    #[arg(long, value_enum, default_value = "u16")]
    pub(in crate::cli) data_dtype: TokenWidth,
    /// The tokenizer --data was prepared with, written into every saved model directory and checkpoint
    /// (GPT-2's BPE as vocab.json + merges.txt, a tokenizer.json copied, bytes as nothing): `gpt2`,
    /// `bytes` or the path of a tokenizer.json. Default: the record `prepare` leaves beside the token
    /// file (`NAME.tokenizer`); the built-in text has its own word tokenizer.
    #[arg(long)]
    pub(in crate::cli) tokenizer: Option<String>,
    /// Held-out token file for the validation loss (and perplexity): in the progress lines, the
    /// metrics rows (`val_loss`) and the summary. `prepare --val-fraction` makes one.
    #[arg(long)]
    pub(in crate::cli) val_data: Option<PathBuf>,
    /// Validate before every step that is a multiple of N, on the weights that step starts from (step
    /// 0: the initial model). 0 = only after the last step. Validation data is --val-data, or for the
    /// built-in run (no --data) the last scenes of Hamlet.
    #[arg(long, default_value_t = 100)]
    pub(in crate::cli) eval_every: u64,
    /// Micro-batches of --val-data per validation (the first ones, in the order `eval` reads them, so
    /// the number is the one `zerostream eval` gives for the same weights); at most as many as the file
    /// holds, which is said at the start where this asks for more.
    #[arg(long, default_value_t = 4, value_parser = crate::positive_count())]
    pub(in crate::cli) eval_batches: usize,
    /// B: sequences per micro-batch.
    #[arg(long, default_value_t = 8, value_parser = crate::positive_count())]
    pub(in crate::cli) batch_size: usize,
    /// T: tokens per sequence (at most the model's n_positions).
    #[arg(long, default_value_t = 128, value_parser = crate::positive_count())]
    pub(in crate::cli) seq_len: usize,
    /// Micro-batches per optimizer step (gradients accumulate on the host, where the optimizer state lives);
    /// at most 65536.
    #[arg(long, default_value_t = 1, value_parser = crate::positive_count())]
    pub(in crate::cli) grad_accum: usize,
    /// Optimizer steps.
    #[arg(long, default_value_t = 300)]
    pub(in crate::cli) steps: u64,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-3)]
    pub(in crate::cli) lr: f64,
    /// Learning rate at the end of a cosine schedule.
    #[arg(long, default_value_t = 1e-4)]
    pub(in crate::cli) min_lr: f64,
    /// Steps of linear warm-up from lr/warmup to lr.
    #[arg(long, default_value_t = 20)]
    pub(in crate::cli) warmup_steps: u64,
    /// Learning-rate schedule after warm-up.
    #[arg(long, value_enum, default_value = "cosine")]
    pub(in crate::cli) lr_schedule: LrSchedule,
    /// The update rule: adamw; lamb (Adam's step scaled per tensor by |weights| / |step|, You et al.
    /// 2020, for large batches); or lars (momentum SGD scaled per tensor by trust-coefficient x
    /// |weights| / (|gradient| + weight-decay x |weights|), You et al. 2017). LAMB and LARS leave
    /// biases and norms' gains unscaled and undecayed, and sum each tensor's norms over the ranks;
    /// they keep fp32 state (LARS one buffer, 8 bytes per parameter with the master weight).
    #[arg(long, value_enum, default_value = "adamw")]
    pub(in crate::cli) optimizer: Optimizer,
    /// AdamW's and LAMB's beta1.
    #[arg(long, default_value_t = 0.9)]
    pub(in crate::cli) beta1: f64,
    /// AdamW's and LAMB's beta2.
    #[arg(long, default_value_t = 0.95)]
    pub(in crate::cli) beta2: f64,
    /// AdamW's and LAMB's epsilon.
    #[arg(long, default_value_t = 1e-8)]
    pub(in crate::cli) eps: f64,
    /// LARS's momentum.
    #[arg(long, default_value_t = 0.9)]
    pub(in crate::cli) momentum: f64,
    /// LARS's trust coefficient (eta): its per-tensor step is this fraction of the weights' norm.
    #[arg(long, default_value_t = 0.001)]
    pub(in crate::cli) trust_coefficient: f64,
    /// Weight decay, applied to tensors of two or more dimensions only (AdamW: decoupled; LAMB: in
    /// the step the trust ratio scales; LARS: added to the gradient).
    #[arg(long, default_value_t = 0.1)]
    pub(in crate::cli) weight_decay: f64,
    /// Clip the global gradient L2 norm to this (0 = no clipping).
    #[arg(long, default_value_t = 1.0)]
    pub(in crate::cli) grad_clip: f64,
    /// Working precision of the parameters the device computes with: fp32, bf16, or fp16 (with
    /// dynamic loss scaling). Master weights and Adam moments are always fp32.
    #[arg(long, value_enum, default_value = "fp32")]
    pub(in crate::cli) precision: Precision,
    #[command(flatten)]
    pub(in crate::cli) device: DeviceArgs,
    /// Most device memory the run may hold, e.g. 512MiB or 2GiB (default: no limit). A budget too
    /// small for one block and its activations is refused at start-up with the numbers.
    #[arg(long, value_parser = parse_size)]
    pub(in crate::cli) gpu_mem_budget: Option<u64>,
    /// Keep only each block's input and recompute its activations during backward (less device memory).
    #[arg(long)]
    pub(in crate::cli) recompute: bool,
    /// Where fp32 master weights and Adam moments live, and the step's fp32 gradient accumulator unless
    /// --offload-gradients says otherwise (with nvme, host RAM holds only the few groups being updated
    /// or accumulated).
    #[arg(long, value_enum, default_value = "cpu")]
    pub(in crate::cli) offload_optimizer: OffloadTarget,
    /// `plan` only: time the links this run would use on this machine, in about a minute — the drive
    /// in DIR (default: the --nvme-dir directories) swept as the update sweeps it, the update (`--optimizer`), and the
    /// device on a one-block and a several-block cut of the model — and print the predicted steady
    /// step time and the link that sets it. The rates are kept (in the tuning directory) for `train`
    /// with the same flags, which prints the prediction at start-up and records it in the metrics.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = "")]
    pub(in crate::cli) measure: Option<String>,
    /// The format of AdamW's two moments: fp32 (PyTorch's state, bit for bit) or bf16 (4 bytes per
    /// parameter less to hold and, on nvme, to read and write each step; the update is still computed
    /// in f32 and the moments are rounded stochastically when stored, so small changes are not lost).
    /// Checkpoints keep the chosen format; a resume keeps the checkpoint's.
    #[arg(long, value_enum, default_value = "fp32")]
    pub(in crate::cli) adam_state: AdamState,
    /// How gradients cross between ranks in the reduce-scatter (--zero-stage 0: the all-reduce; at 2
    /// ranks every rank encodes its whole gradient and decodes every rank's, from 3 ranks it takes two
    /// phases, the reduce-scatter and then each rank's summed slice encoded again): none (f32, exact), bf16 (2 bytes per
    /// element), int8 (1 byte plus a scale per chunk), onebit (1 bit plus a scale per chunk) or topk:F
    /// (the largest-magnitude fraction F of each slice, e.g. topk:0.01, as index and value). Each
    /// rank keeps what compression dropped (error feedback) and adds it into the next gradient it
    /// sends for the same slice, so nothing is lost, only delayed; the residuals are checkpointed.
    /// Every rank decodes the same bytes and sums in rank order: in-process and MPI runs stay
    /// bit-identical. Does nothing with one rank.
    #[arg(long, value_name = "MODE", value_parser = parse_grad_compression, default_value = "none")]
    pub(in crate::cli) grad_compression: GradCompression,
    /// Optimizer steps at the start whose gradients cross uncompressed, exactly, before
    /// --grad-compression starts (as 1-bit Adam warms up): the first steps' large, fast-changing
    /// gradients are where a coarse codec's delayed error costs most.
    #[arg(long, value_name = "STEPS", default_value_t = 0)]
    pub(in crate::cli) grad_compression_warmup: u64,
    /// Freeze AdamW's (or LAMB's) second moment when --grad-compression-warmup ends, as 1-bit Adam
    /// does: from then on each step divides by the variance (and its bias correction) of the last
    /// warm-up step. The square of a one-bit gradient says little about the gradient's, so a variance
    /// kept updating from it steers the update worse than one learned from the exact warm-up. Needs
    /// --grad-compression-warmup >= 1; not with --optimizer lars (no second moment). Applies at any
    /// world size; the steps up to the freeze are unchanged.
    #[arg(long)]
    pub(in crate::cli) freeze_variance: bool,
    /// How --zero-stage 0 all-reduces a --grad-compression gradient: 1 (every rank's whole gradient
    /// encoded and gathered, N-1 encodings sent per rank), 2 (1-bit Adam's: the compressed
    /// reduce-scatter, then each rank's summed slice encoded again and gathered, 2 (N-1)/N encodings,
    /// but the other ranks' parts compressed twice: on 4 ranks the small models' loss gap to none
    /// doubled) or auto (2 from 3 ranks on, 1 at 2 ranks, where both send one encoding). Does nothing
    /// at other stages or without compression.
    #[arg(long, value_enum, value_name = "PHASES", default_value = "auto")]
    pub(in crate::cli) all_reduce_phases: zerostream::comm::AllReducePhases,
    /// How the working copy crosses between ranks in its all-gather (ZeRO++'s quantised weights): none
    /// (its words as they are), bf16 (2 bytes per element; the same as none with --precision bf16,
    /// refused with fp16: as many bytes, fewer bits) or int8 (1 byte plus a 4-byte scale per 256
    /// elements). Every rank, the sender included, computes with the decoded copy from the first step
    /// on, so ranks stay identical and stages 1-3 give one run; the fp32 master weights stay exact. Does nothing
    /// with one rank or at --zero-stage 0 (no working copy is gathered).
    #[arg(long, value_enum, default_value = "none")]
    pub(in crate::cli) param_compression: ParamCompression,
    /// Elements per scale of --grad-compression int8 and onebit (each chunk's scale costs 4 bytes).
    #[arg(long, value_name = "N", default_value_t = zerostream::comm::compress::DEFAULT_CHUNK_ELEMS)]
    pub(in crate::cli) grad_compression_chunk: usize,
    /// Where the step's fp32 gradient accumulator lives (default: with the optimizer state). `ram`
    /// (the same as cpu) with the optimizer on nvme spares the drive a read and a write of 4 bytes per
    /// parameter each micro-batch and the sweep's read, for 4 bytes per parameter of RAM; results are
    /// bit-identical either way.
    #[arg(long, value_enum)]
    pub(in crate::cli) offload_gradients: Option<OffloadTarget>,
    /// Where the working copy of the parameters lives between uploads.
    #[arg(long, value_enum, default_value = "cpu")]
    pub(in crate::cli) offload_params: OffloadTarget,
    /// With --offload-params nvme: RAM (e.g. 3GiB; default 0) that keeps the working copies of the
    /// blocks evicted from their device slots between their forward and backward uploads, so each is
    /// read from the drive once a step instead of twice — the blocks nearest the turn from forward to
    /// backward first. `auto`: what the RAM available at start-up leaves after the run's other state
    /// (and the device's share of RAM: the cpu device's memory, a GPU's host staging) and a margin of
    /// 1 GiB + 1/8 of it, shared by the ranks on this machine (a resumed run keeps the size its
    /// checkpoint recorded unless given `auto` again). `plan` says how many blocks it holds and the
    /// bytes saved; results are bit-identical with or without it.
    #[arg(long, value_name = "SIZE|auto", value_parser = parse_ram_cache, default_value = "0")]
    pub(in crate::cli) params_ram_cache: RamCache,
    /// Directory for the NVMe tier's files (`rank{r}/{group}.{kind}.rank{r}.bin`: scratch, written
    /// before they are read, and reused by later runs, a run of another shape sizing them anew; a
    /// run's state lives in its checkpoints), or several, comma-separated (`--nvme-dir /mnt/a/zs,/mnt/b/zs`), one per drive: every
    /// tensor is then striped over all of them (page-aligned stripes of equal size), so each drive
    /// moves an equal share of every read and write, all in flight at once.
    #[arg(long, value_delimiter = ',', value_parser = listed_dir)]
    pub(in crate::cli) nvme_dir: Vec<PathBuf>,
    #[command(flatten)]
    pub(in crate::cli) io: IoArgs,
    /// Do not checksum NVMe shards (faster; corruption then goes unnoticed).
    #[arg(long)]
    pub(in crate::cli) no_verify: bool,
    /// CPU threads for AdamW (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub(in crate::cli) adam_threads: usize,
    /// Ranks in this process, one thread and one device each (data parallel, ZeRO-partitioned state).
    /// Under `mpirun` leave this out: the world size comes from MPI.
    #[arg(long, value_parser = crate::positive_count())]
    pub(in crate::cli) world_size: Option<usize>,
    /// One device per rank, comma-separated: a GPU adapter's index or name, or `cpu` (e.g. `0,1` or
    /// `cpu,cpu`). Default: every rank opens --device/--adapter. Under mpirun, indexed by the node-local rank.
    #[arg(long)]
    pub(in crate::cli) devices: Option<String>,
    /// What is split between ranks: 0 = nothing (every rank keeps and updates the whole model, and the
    /// gradients are all-reduced: with --grad-compression only compressed gradients cross, no working
    /// copy; for slow links, at a whole model's optimizer state per rank); 1 = fp32 master weights and
    /// Adam moments; 2 = also the gradients; 3 = also the working copy of the parameters (gathered
    /// before each upload).
    #[arg(long, value_parser = parse_stage, default_value = "2")]
    pub(in crate::cli) zero_stage: ZeroStage,
    /// Run the strictly sequential schedule (no upload ahead, no download or AdamW overlapped with
    /// compute): slower, and bit-identical to the default overlapped one — for checking that it is.
    #[arg(long)]
    pub(in crate::cli) sequential: bool,
    /// Keep the working copies in ordinary (pageable) host memory. By default, with --device gpu and
    /// the working copy in RAM, it lives in pinned host memory the GPU copies from directly: the update
    /// writes each new copy there and an upload is one device copy, with no host copy into staging first
    /// (Vulkan adapters; elsewhere, or where the adapter refuses, the start-up notes say so). The same
    /// results either way. Not carried over by --resume: each run's own command line says.
    #[arg(long)]
    pub(in crate::cli) no_pin_memory: bool,
    /// With --device gpu on Vulkan: the big uploads (working copies from pinned host memory) and
    /// read-backs (gradients, into pinned host memory wherever the adapter makes it, whatever
    /// `zerostream tune` chose) run on a second queue of the GPU, beside the kernels, rather than between them on wgpu's one queue
    /// (`zerostream bench overlap` times whether the GPU overlaps them). Two timeline semaphores keep
    /// every read and write in the one-queue order, so the results are the same bits. Where the adapter
    /// has no second queue, its one queue stands in (no overlap). Refused off Vulkan and with --device
    /// cpu. Not carried over by --resume: each run's own command line says.
    #[arg(long)]
    pub(in crate::cli) copy_queue: bool,
    /// Write one JSON object per optimizer step to this file (and one for the validation after the last
    /// step, where there is validation data); beside it the loss curves, NAME.svg, and the resolved
    /// configuration, NAME.config.toml. A fresh run replaces an existing metrics file (saying how many
    /// rows go); a resumed one keeps its rows up to the checkpoint's step and appends. A file of anything
    /// else is refused, and on a resume so are another run's rows (the checkpoint's last loss differs).
    #[arg(long)]
    pub(in crate::cli) metrics: Option<PathBuf>,
    /// Write a timeline of the steps to this file (replaced if it exists), in the Chrome trace format:
    /// open it in https://ui.perfetto.dev or chrome://tracing. One row shows each operation of the step
    /// schedule on rank 0's device thread (fetch, forward, head, backward, each gradient download's start
    /// and finish, the update hand-off), another each parameter group the optimizer thread updates. Host
    /// time: what the thread spent recording, submitting and waiting. Written as the run goes.
    #[arg(long, value_name = "FILE")]
    pub(in crate::cli) trace: Option<PathBuf>,
    /// Write TensorBoard event files to this directory (created if missing; `tensorboard --logdir DIR`
    /// shows them): every number of each step's --metrics row as a scalar (losses, learning rate,
    /// gradient norm, loss scale, tokens/s, busy fractions, the step's time split, bytes per link) and
    /// the resolved configuration as text. Each run, a resumed one too, adds a new file there.
    #[arg(long, value_name = "DIR")]
    pub(in crate::cli) tensorboard: Option<PathBuf>,
    /// Save the trained model as a Hugging Face directory (config.json + model.safetensors), written
    /// beside it and moved into place whole. An existing model directory there is replaced; a directory
    /// holding other files is refused.
    #[arg(long)]
    pub(in crate::cli) save: Option<PathBuf>,
    /// The saved model's weights (--save and checkpoints): f32, bf16 or f16. Default: the working
    /// precision. The optimizer state in checkpoints is always f32.
    #[arg(long, value_enum)]
    pub(in crate::cli) save_dtype: Option<SaveDtype>,
    /// Write checkpoints under this directory (created if missing): step-NNNNNNNN/ with the model, every
    /// rank's optimizer state and the trainer state, written crash-safe; `latest` names the last saved. One
    /// is always written at the end and when SIGINT/SIGTERM stops the run. A directory already holding
    /// checkpoints takes only a run resumed from one of them (--resume DIR): a fresh run is refused there.
    #[arg(long)]
    pub(in crate::cli) checkpoint_dir: Option<PathBuf>,
    /// Also checkpoint every N optimizer steps (0 = only at the end and when stopped).
    #[arg(long, default_value_t = 0)]
    pub(in crate::cli) checkpoint_every: u64,
    /// Keep only the newest K checkpoints of this run's line (0 = keep all): those up to the one it
    /// resumed from, and those it wrote. A resume from an older step leaves the later ones uncounted
    /// (each replaced only if this run saves its step again).
    #[arg(long, default_value_t = 0)]
    pub(in crate::cli) keep_checkpoints: usize,
    /// Resume from a checkpoint: a step-NNNNNNNN/ directory, or a --checkpoint-dir (its latest). The
    /// model, optimizer state, counters and settings come from it; flags given override harmless
    /// settings (--steps, which counts from the start of training; world size, tiers, budget,
    /// checkpointing), and flags that would change what is computed (precision, batch geometry,
    /// optimizer, schedule, seed) must match it. --data defaults to the checkpoint's; --model or
    /// --config, if given, must name the checkpoint's model (its weights come from the checkpoint).
    /// What the run wrote goes on unless given (said at start-up): resumed from the newest checkpoint
    /// of the directory the run checkpointed into, checkpoints go on there, and its --metrics
    /// (appended), --tensorboard and --save are this run's; from an older or copied checkpoint (a
    /// branch) none of those files is taken, and a warning names them. Its --checkpoint-every,
    /// --keep-checkpoints, --val-data, --eval-every, --eval-batches, --save-dtype, --sample-tokens and
    /// --prompt are taken either way. Never its --trace.
    #[arg(long)]
    pub(in crate::cli) resume: Option<PathBuf>,
    /// Seed of the random initialisation (with --config or the built-in model) and of the sample.
    #[arg(long, default_value_t = 1337)]
    pub(in crate::cli) seed: u64,
    /// Dropout probability (0 <= P < 1) for every dropout of the model, overriding its config.json
    /// (GPT-2's resid_pdrop, embd_pdrop, attn_pdrop; the published gpt2 asks for 0.1, the presets for 0).
    /// Masks are drawn from the seed, the step and the micro-batch, so they are the same on every device,
    /// at any world size and after a resume. Evaluation, validation and generation never drop.
    #[arg(long)]
    pub(in crate::cli) dropout: Option<f64>,
    /// Vocabulary ids per chunk of the output projection and the loss. The device holds one chunk of
    /// the (vocab x width) matrix at a time when --gpu-mem-budget cannot hold it whole, so its minimum
    /// does not grow with the vocabulary. Part of what is computed (the loss is combined chunk by
    /// chunk): a resumed run must keep it; where the matrix lives never changes a result.
    #[arg(long, default_value_t = zerostream::model::vocab::DEFAULT_CHUNK_ROWS, value_parser = crate::positive_count())]
    pub(in crate::cli) vocab_chunk_rows: usize,
    /// What every matmul's inputs are rounded to before they are multiplied (sums are f32 either way).
    /// f32 (default): exact inputs, the fp32 kernels. f16: A and B rounded to f16 (nearest even; past
    /// 65504 they become infinity, below ~6e-8 zero) and multiplied on the GPU's cooperative matrices
    /// (tensor cores) where the adapter lists a 16x16x16 or 8x8x8 f16->f32 configuration (`zerostream devices`
    /// says); a GPU without one refuses, and `--device cpu` rounds the same way on the CPU (no faster
    /// there). With f16 the loss is scaled dynamically, as with --precision fp16 (from 65536, halved and
    /// the step skipped when a gradient overflows, doubled after 2000 clean steps), so that output
    /// gradients near 1 / (tokens x vocab) do not round to zero. It changes the numbers, so a resumed
    /// run keeps it.
    #[arg(long, value_enum, default_value_t = zerostream::device::MatmulInputs::F32)]
    pub(in crate::cli) matmul_inputs: zerostream::device::MatmulInputs,
    /// Tokens of text to sample at the end at temperature 0.8 (0 = none; `zerostream generate` samples a
    /// saved model with every setting), written with the data's tokenizer (--tokenizer, or the
    /// one `prepare` recorded beside --data; else the built-in one of the vocabulary's size).
    #[arg(long, default_value_t = 300)]
    pub(in crate::cli) sample_tokens: usize,
    /// Text the sample continues.
    #[arg(long, default_value = "HAMLET\n")]
    pub(in crate::cli) prompt: String,
}

/// One directory of `--nvme-dir`'s list: an empty one is a stray comma, said so (clap's own words
/// would be "a value is required").
fn listed_dir(text: &str) -> Result<PathBuf, String> {
    if text.is_empty() { Err("an empty directory name (a stray comma in the list?)".into()) } else { Ok(PathBuf::from(text)) }
}
