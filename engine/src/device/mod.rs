//! Devices: the [`Backend`] trait every model op goes through, the `cpu` device (the plain-Rust twins in
//! [`crate::ops`], parallel with rayon) and the `gpu` device (the WGSL kernels through wgpu).
//!
//! A tensor is a flat buffer of f32 that belongs to one device. Ops take outputs first, then inputs, then
//! dimensions, as in llm.c. Outputs of `*_backward` ops are accumulated into (`+=`) unless the doc says
//! otherwise, so gradients of a micro-batch sum into place.

pub mod adapter;
pub mod alloc;
pub mod attention_tuning;
pub mod cpu;
pub mod gpu;
pub mod matmul_tuning;
mod spare_reads;
pub mod timing;
pub mod transfer;

use anyhow::{Result, bail};

pub use crate::ops::activation::Activation;
pub use crate::ops::attention::AttentionDims;
pub use crate::ops::attention_decode::DecodeDims;
pub use crate::ops::crossentropy::VocabChunk;
pub use crate::ops::dropout::DropoutMask;
pub use crate::ops::{MatmulShape, Operand};
pub use alloc::{AllocCosts, AllocStats, ByteBudget};
pub use cpu::CpuDevice;
pub use gpu::{AdapterSummary, GpuDevice};

/// Why [`Backend::alloc_pinned`] made no buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinRefused {
    /// Not of this size (past the adapter's largest buffer): a smaller one may be made.
    TooLarge(String),
    /// Not on this adapter at all.
    Unavailable(String),
}

impl std::fmt::Display for PinRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PinRefused::TooLarge(why) | PinRefused::Unavailable(why) => f.write_str(why),
        }
    }
}

/// The operations of GPT-2 training, implemented once per device.
pub trait Backend {
    /// A flat f32 buffer on this device.
    type Tensor;
    /// Token ids on this device, with whatever index the encoder backward needs.
    type Tokens;
    /// A read-back in flight: started by [`Backend::begin_read`], completed by [`Backend::finish_read`].
    type PendingRead;

    /// One line naming the device: "cpu (2 threads)", "NVIDIA H100 (Vulkan)".
    fn describe(&self) -> String;
    /// A zero-filled tensor of `len` elements, charged to the device's byte budget.
    fn alloc(&self, len: usize, label: &str) -> Result<Self::Tensor>;
    fn len(&self, t: &Self::Tensor) -> usize;
    fn write(&self, t: &Self::Tensor, data: &[f32]);
    fn read(&self, t: &Self::Tensor) -> Vec<f32>;
    /// Several tensors at once (the gpu device waits once for all of them).
    fn read_many(&self, tensors: &[&Self::Tensor]) -> Vec<Vec<f32>> {
        self.finish_read(self.begin_read(tensors))
    }
    /// Starts reading `tensors` back as they are once all work recorded so far has run; work recorded
    /// afterwards may overwrite them without changing what is read. The gpu device submits the copies
    /// and returns at once, so the download overlaps whatever is recorded next.
    fn begin_read(&self, tensors: &[&Self::Tensor]) -> Self::PendingRead;
    /// Waits for a read started by [`Backend::begin_read`] and returns the values.
    fn finish_read(&self, pending: Self::PendingRead) -> Vec<Vec<f32>>;
    /// [`Backend::finish_read`] with the values lent to `f` rather than returned: the gpu device lends its
    /// f32 tensors straight out of the mapped read-back memory, so no host copy stands between the link
    /// and what `f` adds them into. The default lends the vectors `finish_read` returns, then recycles them.
    fn finish_read_with<R>(&self, pending: Self::PendingRead, f: impl FnOnce(&[&[f32]]) -> R) -> R {
        let values = self.finish_read(pending);
        let lent: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
        let out = f(&lent);
        self.recycle(values);
        out
    }
    /// Hands back vectors a read returned, once their values are used, so that later reads of the same
    /// lengths fill them instead of fresh memory (whose first touch page-faults). The default drops them.
    fn recycle(&self, _vectors: Vec<Vec<f32>>) {}
    /// Uploads token ids (each must be below the vocabulary size; callers check).
    fn tokens(&self, ids: &[u32]) -> Result<Self::Tokens>;
    fn alloc_stats(&self) -> AllocStats;
    /// What each kind of allocation charges the budget on this device (the planner counts with it).
    fn alloc_costs(&self) -> AllocCosts;
    /// A tensor that holds 16-bit values where the device can store them so (the gpu device packs two
    /// per word; elsewhere it is an ordinary f32 tensor). Written with [`Backend::write_16bit`] in the same
    /// format, read back widened, and usable only as the B operand of [`Backend::matmul`].
    fn alloc_16bit(&self, len: usize, label: &str, _format: HalfFormat) -> Result<Self::Tensor> {
        self.alloc(len, label)
    }
    /// Fails, with the numbers, if these attention dimensions are inconsistent or exceed what the device's
    /// kernels support: the gpu device's head dim and workgroup memory, and one binding for one sequence's
    /// q, k and v (it splits attention by batch only).
    fn check_attention(&self, dims: AttentionDims) -> Result<()> {
        dims.check()
    }
    /// Waits until all work recorded so far has run (a no-op where ops run synchronously).
    fn synchronize(&self) {}
    /// Seconds the device's kernels have kept it busy so far, by the device's own clock (the gpu device's
    /// timestamps: `device/gpu/busy.rs`), once all work recorded so far has run; None where there is no
    /// such clock (the cpu device, adapters without timestamp queries).
    fn kernel_seconds(&self) -> Option<f64> {
        None
    }
    /// Whether ops return before their work has run (the gpu device), so host work done meanwhile
    /// overlaps it.
    fn is_async(&self) -> bool {
        false
    }
    /// A zeroed host buffer of `len_bytes` that uploads copy from without staging (the gpu device's
    /// pinned memory: `device/gpu/pinned.rs`), for data uploaded often (the working copies); Some(Err)
    /// says why it made none; None where the device reads host memory as it is (cpu).
    fn alloc_pinned(&self, _len_bytes: usize) -> Option<std::result::Result<zerostream_offload::AlignedBuf, PinRefused>> {
        None
    }
    /// t[..n] = 16-bit values widened to f32 (exact). The gpu device sends the 16-bit words (half the
    /// bytes of an f32 upload) and widens them with a kernel; this default widens on the host.
    fn write_16bit(&self, t: &Self::Tensor, bits: &[u16], format: HalfFormat) -> Result<()> {
        let wide: Vec<f32> = bits.iter().map(|&b| format.to_f32(b)).collect();
        self.write(t, &wide);
        Ok(())
    }

    /// x = value.
    fn fill(&self, x: &Self::Tensor, value: f32);
    /// y = alpha * x + beta * y.
    fn axpy(&self, y: &Self::Tensor, alpha: f32, x: &Self::Tensor, beta: f32);
    /// Sum of squares of every element (for the global gradient norm).
    fn sum_squares(&self, x: &Self::Tensor) -> f64;

    /// C = A @ B (+ bias) (+ C if `accumulate`), operands addressed as in `shape`.
    fn matmul(
        &self,
        c: &Self::Tensor,
        a: &Self::Tensor,
        b: &Self::Tensor,
        bias: Option<&Self::Tensor>,
        shape: &MatmulShape,
        accumulate: bool,
    );
    /// What the operands of every later [`Backend::matmul`] are rounded to before they are multiplied
    /// (`train --matmul-inputs`). F32: nothing, the default. F16: the gpu device runs
    /// `matmul_coop.wgsl` on cooperative matrices, the cpu device its twin's arithmetic
    /// ([`crate::ops::matmul_f16`]); a gpu adapter without a 16x16x16 or 8x8x8 f16 configuration refuses,
    /// naming itself.
    fn set_matmul_inputs(&self, inputs: MatmulInputs) -> Result<()>;
    /// `--copy-queue`: a gpu device's big uploads and read-backs on a second queue beside the kernels,
    /// the same bits (`gpu/copy_route.rs`); the cpu device, which copies nothing, refuses `on`.
    fn set_copy_queue(&self, on: bool) -> Result<()>;
    /// dbias (N) += column sums of dout (M, N).
    fn bias_backward(&self, dbias: &Self::Tensor, dout: &Self::Tensor, m: usize, n: usize);

    /// out (B*T, C) = `wte[tokens] + wpe[t]`.
    fn encoder_forward(
        &self,
        out: &Self::Tensor,
        tokens: &Self::Tokens,
        wte: &Self::Tensor,
        wpe: &Self::Tensor,
        seq_len: usize,
        channels: usize,
    );
    /// `dwte[token] += ...`, `dwpe[t] += ...` from dout (B*T, C).
    #[allow(clippy::too_many_arguments)]
    fn encoder_backward(
        &self,
        dwte: &Self::Tensor,
        dwpe: &Self::Tensor,
        dout: &Self::Tensor,
        tokens: &Self::Tokens,
        batch: usize,
        seq_len: usize,
        channels: usize,
    );

    #[allow(clippy::too_many_arguments)]
    fn layernorm_forward(
        &self,
        out: &Self::Tensor,
        mean: &Self::Tensor,
        rstd: &Self::Tensor,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        bias: &Self::Tensor,
        rows: usize,
        channels: usize,
        eps: f32,
    );
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward(
        &self,
        dx: &Self::Tensor,
        dweight: &Self::Tensor,
        dbias: &Self::Tensor,
        dout: &Self::Tensor,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        mean: &Self::Tensor,
        rstd: &Self::Tensor,
        rows: usize,
        channels: usize,
    );

    /// out (B, T, H D), lse (B, H, T) from qkv (B, T, (H + 2G) D): see [`crate::ops::attention`].
    fn attention_forward(&self, out: &Self::Tensor, lse: &Self::Tensor, qkv: &Self::Tensor, dims: AttentionDims);
    /// dqkv (B, T, (H + 2G) D) is overwritten, not accumulated; delta (B, H, T) is scratch.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        dqkv: &Self::Tensor,
        delta: &Self::Tensor,
        dout: &Self::Tensor,
        qkv: &Self::Tensor,
        out: &Self::Tensor,
        lse: &Self::Tensor,
        dims: AttentionDims,
    );

    /// Generation with a KV cache: copies the k and v of the new rows of qkv (n, (H + 2G) D) into
    /// cache (capacity, 2 G D) at rows past .., then out (n, H D) = causal attention of the new queries
    /// over cache rows 0 ..= past + i. See [`crate::ops::attention_decode`].
    fn attention_decode(&self, out: &Self::Tensor, cache: &Self::Tensor, qkv: &Self::Tensor, dims: DecodeDims);
    /// Fails, with the numbers, if these decode dimensions are inconsistent or exceed what the device's
    /// kernel supports (the gpu device: the head dim, and one layer's cache within one binding).
    fn check_attention_decode(&self, dims: DecodeDims) -> Result<()> {
        dims.check()
    }

    /// out = f(x) elementwise, f an MLP activation ([`Activation`]).
    fn activation_forward(&self, f: Activation, out: &Self::Tensor, x: &Self::Tensor);
    /// dx += dout * f'(x).
    fn activation_backward(&self, f: Activation, dx: &Self::Tensor, x: &Self::Tensor, dout: &Self::Tensor);
    /// out = a + b.
    fn residual_forward(&self, out: &Self::Tensor, a: &Self::Tensor, b: &Self::Tensor);
    /// out = x * mask, x and out (rows, `cols`): kept elements scaled by 1/(1 - p), dropped ones 0
    /// ([`crate::ops::dropout`]). out and x may have different lengths: the shorter one's elements.
    fn dropout(&self, out: &Self::Tensor, x: &Self::Tensor, cols: usize, mask: &DropoutMask);
    /// out = residual + x * mask: a residual connection after a dropout, in one pass.
    fn dropout_residual(&self, out: &Self::Tensor, residual: &Self::Tensor, x: &Self::Tensor, cols: usize, mask: &DropoutMask);

    /// losses (rows) = cross-entropy of each row of logits (rows, V) against targets; with `grad_scale`,
    /// logits are overwritten by dloss/dlogits for a total loss of sum(losses) * grad_scale.
    fn crossentropy(&self, losses: &Self::Tensor, logits: &Self::Tensor, targets: &Self::Tokens, vocab: usize, grad_scale: Option<f32>);
    /// The cross-entropy's statistics of one vocabulary chunk of logits, per row: (max, sum of
    /// exp(x - max), the target's logit or 0) into `stats` (rows, n_chunks, 3) at the chunk's index
    /// ([`crate::ops::crossentropy::crossentropy_chunk_stats`]).
    fn crossentropy_chunk_stats(&self, stats: &Self::Tensor, logits: &Self::Tensor, targets: &Self::Tokens, chunk: &VocabChunk);
    /// The chunk's logits overwritten by d(loss)/d(logits) = (exp(x - lse) - onehot(target)) * grad_scale,
    /// lse (rows) from [`crate::ops::crossentropy::crossentropy_combine`].
    fn crossentropy_chunk_grad(
        &self,
        logits: &Self::Tensor,
        lse: &Self::Tensor,
        targets: &Self::Tokens,
        chunk: &VocabChunk,
        grad_scale: f32,
    );

    // Llama's ops (transformers' LlamaForCausalLM).

    /// RMSNorm fused with its weight: rstd (rows) = 1 / sqrt(mean(x^2) + eps), out (rows, C) =
    /// weight (C) * (x * rstd); x (rows, C).
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_forward(
        &self,
        out: &Self::Tensor,
        rstd: &Self::Tensor,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        rows: usize,
        channels: usize,
        eps: f32,
    );
    /// dx (rows, C) += rstd * (g - xhat * mean(g * xhat)) with g = dout * weight, xhat = x * rstd;
    /// dweight (C) += sum over rows of dout * xhat. dout, x (rows, C), weight (C), rstd (rows) as saved by
    /// [`Backend::rmsnorm_forward`].
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_backward(
        &self,
        dx: &Self::Tensor,
        dweight: &Self::Tensor,
        dout: &Self::Tensor,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        rstd: &Self::Tensor,
        rows: usize,
        channels: usize,
    );
    /// Rotary position embedding in place, transformers' rotate-half convention: in each row r of
    /// x (rows, row_stride) (rows = B*T; position t = r % rows_per_seq), each of `heads` heads of head_dim
    /// D at columns col_offset + h*D, each i < D/2: `angle = f32(t) * inv_freq[i]`,
    /// `(x[i], x[i + D/2]) = (a cos - b sin, b cos + a sin)`. inv_freq (D/2) is the caller's (rope scaling
    /// included). `inverse` rotates by -angle: RoPE's backward, applied in place to the gradient. For
    /// q and k packed as (B, T, (H + 2*KV) * D) [q | k | v]: col_offset 0, heads H + KV. D must be even.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &Self::Tensor,
        inv_freq: &Self::Tensor,
        rows_per_seq: usize,
        rows: usize,
        row_stride: usize,
        col_offset: usize,
        heads: usize,
        head_dim: usize,
        inverse: bool,
    );
    /// [`Backend::rope`] forward with row r at position `first_position + r` (no wrap): the new rows of
    /// a generation step with a KV cache.
    #[allow(clippy::too_many_arguments)]
    fn rope_at(
        &self,
        x: &Self::Tensor,
        inv_freq: &Self::Tensor,
        first_position: usize,
        rows: usize,
        row_stride: usize,
        col_offset: usize,
        heads: usize,
        head_dim: usize,
    );
    /// out (rows, F) = silu(gate) * up, silu(g) = g * sigmoid(g); gate_up (rows, 2F) is [gate | up] per row.
    fn swiglu_forward(&self, out: &Self::Tensor, gate_up: &Self::Tensor, rows: usize, hidden: usize);
    /// d_gate_up (rows, 2F) = [dout * up * silu'(gate) | dout * silu(gate)], overwritten, not accumulated
    /// (it is the gradient of one matmul's output); dout (rows, F), gate_up (rows, 2F) = [gate | up].
    fn swiglu_backward(&self, d_gate_up: &Self::Tensor, dout: &Self::Tensor, gate_up: &Self::Tensor, rows: usize, hidden: usize);
}

/// `--matmul-inputs`: what a matmul's operands are rounded to before they are multiplied (sums are f32
/// either way). Part of what a run computes: a resumed run keeps it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MatmulInputs {
    /// Exact f32 inputs (the fp32 kernels, bit-identical to every earlier run).
    #[default]
    F32,
    /// Inputs rounded to f16 (nearest, ties to even; beyond 65504 infinity), for cooperative matrices.
    F16,
}

/// Where the gpu device's upload ring stages a write before the device copies it (speed only: the
/// bytes that arrive are the same). `zerostream tune` times both and keeps the faster for the adapter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UploadStaging {
    /// wgpu's mappable buffers: on a GPU with a resizable BAR, VRAM the host writes across the link.
    #[default]
    Mapped,
    /// Host memory the device's copy engine reads across the link (Vulkan only), like a pinned copy.
    Host,
}

impl UploadStaging {
    pub fn name(self) -> &'static str {
        match self {
            UploadStaging::Mapped => "mapped",
            UploadStaging::Host => "host",
        }
    }

    pub fn parse(name: &str) -> Option<UploadStaging> {
        [UploadStaging::Mapped, UploadStaging::Host].into_iter().find(|s| s.name() == name)
    }
}

/// Where the gpu device's read-backs (gradients, losses, every download) land. The bytes are the same
/// either way; `zerostream tune` times both and keeps the faster for the adapter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadBack {
    /// wgpu's mappable buffers, mapped (`map_async`) after each copy into them.
    #[default]
    Mapped,
    /// Host memory mapped for good that the device's copy engine writes across the link (Vulkan only),
    /// read once the copy's submission is done, like PyTorch's copy into a pinned buffer.
    Pinned,
}

impl ReadBack {
    pub fn name(self) -> &'static str {
        match self {
            ReadBack::Mapped => "mapped",
            ReadBack::Pinned => "pinned",
        }
    }

    pub fn parse(name: &str) -> Option<ReadBack> {
        [ReadBack::Mapped, ReadBack::Pinned].into_iter().find(|s| s.name() == name)
    }
}

/// A 16-bit floating-point format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfFormat {
    F16,
    Bf16,
}

impl HalfFormat {
    /// The value of 16-bit word `bits` (exact: every 16-bit value is an f32).
    pub fn to_f32(self, bits: u16) -> f32 {
        match self {
            HalfFormat::F16 => half::f16::from_bits(bits).to_f32(),
            HalfFormat::Bf16 => half::bf16::from_bits(bits).to_f32(),
        }
    }
}

/// What `--device` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceChoice {
    /// A real GPU if one is found, else the cpu device.
    Auto,
    /// A wgpu adapter (software adapters such as lavapipe count); fail if there is none.
    Gpu,
    /// The plain-Rust twins on CPU threads.
    Cpu,
}

/// The device a run got.
#[allow(clippy::large_enum_variant, reason = "one per rank, borrowed as `&D` by generic code that a Box would get in the way of")]
pub enum AnyDevice {
    Cpu(CpuDevice),
    Gpu(GpuDevice),
}

impl AnyDevice {
    pub fn describe(&self) -> String {
        match self {
            AnyDevice::Cpu(d) => d.describe(),
            AnyDevice::Gpu(d) => d.describe(),
        }
    }
}

/// Opens the device `choice` asks for. `adapter` (an index or a substring of the name from
/// `zerostream devices`) picks among wgpu adapters. `budget_bytes` bounds device allocations.
pub fn open(choice: DeviceChoice, adapter: Option<&str>, budget_bytes: Option<u64>) -> Result<AnyDevice> {
    check_choice(choice, adapter)?;
    match choice {
        DeviceChoice::Cpu => Ok(AnyDevice::Cpu(CpuDevice::new(budget_bytes))),
        DeviceChoice::Gpu => Ok(AnyDevice::Gpu(GpuDevice::open(adapter, budget_bytes)?)),
        DeviceChoice::Auto => open(resolve_auto(adapter), adapter, budget_bytes),
    }
}

/// Refuses `--adapter` with `--device cpu`, where it would pick nothing (checked by `open`, and by
/// `plan`, which opens no device).
pub fn check_choice(choice: DeviceChoice, adapter: Option<&str>) -> Result<()> {
    if let (DeviceChoice::Cpu, Some(adapter)) = (choice, adapter) {
        bail!("--adapter {adapter} picks a GPU, but --device cpu computes on the CPU: leave --adapter out, or give --device gpu");
    }
    Ok(())
}

/// The device `--device auto` opens: the gpu device when `--adapter` names one or wgpu finds a real
/// GPU, else the cpu device (never a software rasteriser such as lavapipe). Whether a real GPU is
/// present is asked once a process, so the planner and every rank's `open` agree (opening a GPU lists
/// the adapters again to pick one).
pub fn resolve_auto(adapter: Option<&str>) -> DeviceChoice {
    static REAL_GPU_FOUND: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let real_gpu_found = || *REAL_GPU_FOUND.get_or_init(|| any_real_gpu(&gpu::list_adapters()));
    if adapter.is_some() || real_gpu_found() { DeviceChoice::Gpu } else { DeviceChoice::Cpu }
}

/// [`resolve_auto`]'s choice without `--adapter`, among adapters already listed (`devices`).
pub fn auto_among(adapters: &[gpu::AdapterSummary]) -> DeviceChoice {
    if any_real_gpu(adapters) { DeviceChoice::Gpu } else { DeviceChoice::Cpu }
}

fn any_real_gpu(adapters: &[gpu::AdapterSummary]) -> bool {
    adapters.iter().any(|a| a.is_real_gpu())
}

/// Parses a byte size such as `512MiB`, `2GiB`, `4GB`, `1048576`.
pub fn parse_bytes(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = match num.parse() {
        Ok(v) => v,
        Err(_) => bail!("invalid size {text:?}: expected a number with an optional unit, like 512MiB or 2GiB"),
    };
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        other => bail!("invalid size {text:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"),
    };
    let bytes = (value * scale).round();
    // Past 2^63 bytes (8 EiB) no machine has it, and the cast would quietly saturate.
    if bytes >= 2f64.powi(63) {
        bail!("invalid size {text:?}: more than 8 EiB");
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes_parse_with_units_and_bad_ones_say_why() {
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("2GiB").unwrap(), 2 << 30);
        let err = parse_bytes("99999999999999999999999").unwrap_err().to_string();
        assert!(err.contains("more than 8 EiB"), "{err}");
        assert!(parse_bytes("9000000TiB").is_err());
        assert_eq!(parse_bytes("4GB").unwrap(), 4_000_000_000);
        assert_eq!(parse_bytes("1048576").unwrap(), 1 << 20);
        assert!(parse_bytes("12 parsecs").unwrap_err().to_string().contains("unknown unit"));
        assert!(parse_bytes("MiB").unwrap_err().to_string().contains("expected a number"));
    }
}
