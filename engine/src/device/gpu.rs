//! The `gpu` device: the WGSL kernels of `shaders/` run through wgpu on any Vulkan, Metal or DX12 adapter.
//!
//! Work is recorded into one pending command encoder and submitted when a result is read back (or after
//! `MAX_PENDING_PASSES` passes), so a forward pass is a handful of submissions, not hundreds.
//!
//! Large tensors: one storage binding is limited (lavapipe: 128 MiB; even an H100 near 2 GiB), so every
//! op binds *windows* of its tensors, aligned down to the adapter's offset alignment, and passes the
//! remaining element offset to the kernel. Ops whose operands do not fit split their work (rows, vocabulary
//! ranges, or the M/N/K ranges of a product) until every window does.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ops::Range;

use anyhow::{Context, Result, bail};

use super::alloc::{AllocCosts, AllocStats, ByteBudget, Charge};
use super::attention_tuning::AttentionTable;
use super::matmul_tuning::MatmulTable;
use super::spare_reads::SpareReads;
use super::{Activation, AttentionDims, Backend, DecodeDims, DropoutMask, HalfFormat, MatmulInputs, MatmulShape, VocabChunk};
use crate::ops::elementwise::SUM_SQUARES_GROUP;
use crate::ops::encoder::TokenBuckets;
use busy::BusyClock;
use zerostream_shaders::{self as shaders, AttentionTile, CoopTile, MatmulTile};

pub use super::adapter::{AdapterSummary, CoopMatrixConfig, list_adapters, preferred_adapter, quiet_wayland_probe};
use super::adapter::{adapters, instance};
pub use matmul::{MATMUL_COOP_PATH, MATMUL_PATH, coop_unavailable};

/// Passes recorded before the pending encoder is submitted even without a read-back.
const MAX_PENDING_PASSES: usize = 256;
/// Threads per workgroup of the 1-D kernels (elementwise and per-row).
const WORKGROUP_THREADS: usize = 256;
/// The optional features zerostream uses when an adapter has them (cooperative matrices only for
/// `--matmul-inputs f16`, and only where the adapter lists them: see `gpu/matmul.rs`).
const WANTED_FEATURES: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::TIMESTAMP_QUERY)
    .union(wgpu::Features::SUBGROUP)
    .union(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);

/// A flat buffer of 4-byte elements (f32, or u32 words holding two f16) on the GPU.
pub struct GpuTensor {
    buffer: wgpu::Buffer,
    /// Elements (not words: a 16-bit tensor packs two per 32-bit word).
    len: usize,
    /// f32, or 16-bit values packed two per word (element 2i in the low half).
    format: Option<HalfFormat>,
    /// Made while a copy route was set, and cleared on wgpu's queue then, so wgpu counts it as
    /// initialised and a raw copy may write it (`gpu/copy_route.rs`).
    ready_for_copies: bool,
    _charge: Charge,
}

impl GpuTensor {
    fn elems_per_word(&self) -> usize {
        if self.format.is_some() { 2 } else { 1 }
    }

    /// How the kernels that take any format name this one in their Params (`b_format`, `x_format`):
    /// 0 f32, 1 f16, 2 bf16.
    fn format_code(&self) -> u32 {
        match self.format {
            None => 0,
            Some(HalfFormat::F16) => 1,
            Some(HalfFormat::Bf16) => 2,
        }
    }
    fn words(&self) -> usize {
        self.len.div_ceil(self.elems_per_word())
    }
}

/// The Params of `dropout.wgsl` and `dropout_residual.wgsl` for a piece of `n` elements starting at
/// element `base` of the tensor (the mask is indexed by the whole tensor's rows and columns).
fn dropout_params(n: usize, x_off: u32, out_off: u32, base: usize, cols: usize, mask: &DropoutMask, residual_off: u32) -> [u32; 12] {
    let [n, base, cols] = [n, base, cols].map(|v| v as u32);
    [n, x_off, out_off, base, cols, mask.key[0], mask.key[1], mask.threshold, mask.scale.to_bits(), residual_off, 0, 0]
}

/// Token ids and their grouping by token (for the encoder backward), on the GPU.
pub struct GpuTokens {
    ids: GpuTensor,
    buckets: TokenBuckets,
    bucket_token: GpuTensor,
    bucket_start: GpuTensor,
    positions: GpuTensor,
}

/// One bound window of a tensor: the binding and the element offset of the requested first element in it.
struct Window<'a> {
    binding: wgpu::BufferBinding<'a>,
    elem_offset: u32,
}

pub struct GpuDevice {
    pub(super) device: wgpu::Device,
    pub(super) queue: wgpu::Queue,
    summary: AdapterSummary,
    /// The cooperative size `matmul_coop.wgsl` runs at here, decided once when the device opens (None:
    /// `matmul::coop_unavailable` refuses the adapter).
    coop_size: Option<u32>,
    pub(super) budget: ByteBudget,
    /// Largest window, in elements, that any op binds (the adapter's limit less the alignment slack).
    max_window_elems: usize,
    align_elems: usize,
    modules: RefCell<HashMap<&'static str, wgpu::ShaderModule>>,
    pipelines: RefCell<HashMap<(&'static str, &'static str), wgpu::ComputePipeline>>,
    encoder: RefCell<Option<wgpu::CommandEncoder>>,
    pending_passes: Cell<usize>,
    /// One uniform buffer holding the Params of every pending pass, a slot each, instead of a buffer per
    /// dispatch; `uniform_bytes` is its contents, written to it just before the encoder is submitted.
    uniform_arena: wgpu::Buffer,
    uniform_bytes: RefCell<Vec<u8>>,
    /// Bytes per slot: the adapter's uniform offset alignment (at least the largest Params).
    uniform_slot_bytes: usize,
    /// Bound as the matmul's vec4 view of an operand too small to hold one vec4.
    matmul_placeholder: wgpu::Buffer,
    /// Read-back vectors handed back by the trainer ([`Backend::recycle`]).
    spare_reads: SpareReads,
    /// Staging buffers of finished reads, by size, for the next read of the same total size.
    spare_staging: RefCell<Vec<pinned::ReadStaging>>,
    /// The largest read-back so far: the spares kept are capped as the planner counts them.
    largest_read_bytes: Cell<u64>,
    /// Large writes' staging buffers (`gpu/staging.rs`).
    upload_ring: staging::UploadRing,
    /// Host buffers uploads copy from directly (`gpu/pinned.rs`).
    pinned: pinned::PinnedRegions,
    /// `--matmul-inputs`: f16 runs every matmul through `matmul_coop.wgsl` (set only where it can run).
    matmul_inputs: Cell<MatmulInputs>,
    /// The fp32 matmul's variant per shape class (`zerostream tune`'s table, or the vendor's default).
    matmul_table: RefCell<MatmulTable>,
    /// One variant for every product, whatever the table says (the tuner and the variant tests).
    matmul_forced: Cell<Option<MatmulTile>>,
    /// The cooperative-matrix variant every `--matmul-inputs f16` product runs, when forced (tests, the tuner).
    coop_forced: Cell<Option<CoopTile>>,
    /// The training attention kernels' variant per shape class (from the same tuning file).
    attention_table: RefCell<AttentionTable>,
    /// One attention variant for every call, whatever the table says (the tuner and the tests).
    attention_forced: Cell<Option<AttentionTile>>,
    /// The kernels' busy time from GPU timestamps (`gpu/busy.rs`), where the adapter has them.
    busy: Option<BusyClock>,
    /// The column sums' partials per block of rows (`gpu/columns.rs`), made by the first column sum
    /// (the planner counts it in `AllocCosts::fixed_bytes`; generation never needs it).
    column_partials: std::cell::OnceCell<GpuTensor>,
    /// A precast product's operands rounded to f16 (`gpu/matmul.rs`), made by the first such product
    /// (the planner counts it in `AllocCosts::f16_inputs_bytes`); None where the budget could not hold it.
    coop_scratch: std::cell::OnceCell<Option<GpuTensor>>,
    /// Queues beside wgpu's that copies may run on (`gpu/copy_queue.rs`): none off Vulkan.
    copy_queues: Vec<copy_queue::CopyQueue>,
    /// `--copy-queue`: the copy queue the big uploads and read-backs take, and the order kept between
    /// it and wgpu's queue (`gpu/copy_route.rs`); None: everything on wgpu's queue.
    copy_route: RefCell<Option<std::rc::Rc<copy_route::Route>>>,
}

/// The largest Params any kernel takes, in bytes (the attention kernels': 20 words).
const MAX_PARAMS_BYTES: usize = 80;

impl GpuTensor {
    /// The buffer, for the device's own modules beside this one (`transfer.rs`).
    pub(in crate::device) fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

impl GpuDevice {
    /// Opens an adapter: `selector` is an index or a case-insensitive substring of the name, as listed by
    /// `zerostream devices`; without one, the most capable adapter (discrete first, software last).
    /// On Vulkan it asks for the queues beside wgpu's that copies may run on (`gpu/copy_queue.rs`).
    pub fn open(selector: Option<&str>, budget_bytes: Option<u64>) -> Result<Self> {
        wait::WaitLimits::from_env()?;
        let instance = instance();
        let found = adapters(&instance);
        if found.is_empty() {
            bail!(
                "no GPU adapter found (wgpu saw no Vulkan, Metal or DX12 device). Install a driver \
                 (on Debian: apt-get install mesa-vulkan-drivers libvulkan1 for the lavapipe software device) \
                 or use --device cpu"
            );
        }
        let summaries: Vec<AdapterSummary> = found.iter().enumerate().map(|(i, a)| AdapterSummary::new(i, a)).collect();
        let index = match selector {
            Some(sel) => match sel.parse::<usize>() {
                Ok(i) if i < found.len() => i,
                Ok(i) => bail!(
                    "--adapter {i}: there {} (see `zerostream devices`; adapters count from 0)",
                    if found.len() == 1 { "is only adapter 0".to_string() } else { format!("are only {} adapters", found.len()) }
                ),
                Err(_) => summaries.iter().position(|s| s.name.to_lowercase().contains(&sel.to_lowercase())).with_context(|| {
                    let names: Vec<_> = summaries.iter().map(|s| s.name.as_str()).collect();
                    format!("--adapter {sel:?} matches no adapter; found: {}", names.join(", "))
                })?,
            },
            None => preferred_adapter(&summaries).expect("adapters were found"),
        };
        Self::from_adapter(&found[index], summaries[index].clone(), budget_bytes)
    }

    fn from_adapter(adapter: &wgpu::Adapter, summary: AdapterSummary, budget_bytes: Option<u64>) -> Result<Self> {
        let limits = adapter.limits();
        matmul::check_limits(&limits, &summary.name)?;
        let (device, queue, copy_queues) = open_device(adapter, &summary, &limits)?;
        let align_elems = limits.min_storage_buffer_offset_alignment as usize / 4;
        let max_window_elems = (limits.max_storage_buffer_binding_size as usize / 4).saturating_sub(align_elems);
        // Each pass's slot starts at a multiple of the uniform offset alignment.
        let uniform_slot_bytes = MAX_PARAMS_BYTES.next_multiple_of(limits.min_uniform_buffer_offset_alignment as usize);
        let matmul_placeholder = matmul::placeholder_vec4_buffer(&device);
        let (matmul_table, table_problem) = MatmulTable::load(&summary);
        let (attention_table, attention_problem) = AttentionTable::load(&summary);
        // One warning per file: a file the matmul's loader refused, the attention's refuses too.
        if let Some(problem) = &table_problem {
            eprintln!("warning: {problem}; using {}", matmul_table.describe());
        } else if let Some(problem) = attention_problem {
            eprintln!("warning: {problem}; attention: {}", attention_table.describe());
        }
        let uniform_arena = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params arena"),
            size: (uniform_slot_bytes * MAX_PENDING_PASSES) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let (upload_staging, read_back) = (matmul_table.upload_staging, matmul_table.read_back);
        let dev = GpuDevice {
            coop_size: matmul::coop_unavailable(&summary).is_none().then(|| summary.coop_f16_size()).flatten(),
            summary,
            budget: ByteBudget::new(budget_bytes.unwrap_or(u64::MAX)),
            max_window_elems,
            align_elems,
            modules: RefCell::default(),
            pipelines: RefCell::default(),
            encoder: RefCell::default(),
            pending_passes: Cell::new(0),
            uniform_arena,
            uniform_bytes: RefCell::default(),
            uniform_slot_bytes,
            matmul_placeholder,
            spare_reads: SpareReads::default(),
            spare_staging: RefCell::new(Vec::new()),
            largest_read_bytes: Cell::new(0),
            upload_ring: Default::default(),
            pinned: Default::default(),
            matmul_inputs: Cell::default(),
            matmul_table: RefCell::new(matmul_table),
            matmul_forced: Cell::new(None),
            coop_forced: Cell::new(None),
            attention_table: RefCell::new(attention_table),
            attention_forced: Cell::new(None),
            busy: BusyClock::new(&device, &queue),
            column_partials: Default::default(),
            coop_scratch: Default::default(),
            copy_queues,
            copy_route: RefCell::new(None),
            device,
            queue,
        };
        // The tuned staging, where this adapter still makes it (a driver update can change that).
        if let Err(e) = dev.set_upload_staging(upload_staging) {
            eprintln!("warning: {e:#}; uploads stage in mapped buffers");
        }
        if let Err(e) = dev.set_read_back(read_back) {
            eprintln!("warning: {e:#}; read-backs land in mapped buffers");
        }
        Ok(dev)
    }

    pub fn summary(&self) -> &AdapterSummary {
        &self.summary
    }

    /// Pretends one binding holds at most `bytes`, so tests exercise the split paths on small tensors.
    pub fn limit_binding_bytes_for_tests(&mut self, bytes: u64) {
        let elems = (bytes as usize / 4).saturating_sub(self.align_elems);
        self.max_window_elems = self.max_window_elems.min(elems.max(self.align_elems));
    }

    /// Passes recorded and not yet submitted (the tests hold host waits to submitting them first).
    pub fn unsubmitted_passes(&self) -> usize {
        self.pending_passes.get()
    }

    /// Binds elements `range` of `t` (the window starts at or before `range.start`, aligned).
    /// Binds the words holding elements `range` of an f32 tensor; `elem_offset` locates the first.
    fn window<'a>(&self, t: &'a GpuTensor, range: Range<usize>) -> Window<'a> {
        assert!(t.format.is_none(), "a 16-bit tensor can only be the B operand of a matmul");
        self.packed_window(t, range)
    }

    /// [`Self::window`] for a tensor of any format: `elem_offset` counts elements (halves, for a
    /// 16-bit tensor) from the start of the binding.
    fn packed_window<'a>(&self, t: &'a GpuTensor, range: Range<usize>) -> Window<'a> {
        assert!(range.end <= t.len.max(1), "window {range:?} past the end of a tensor of {} elements", t.len);
        let per = t.elems_per_word();
        let (first_word, end_word) = (range.start / per, range.end.div_ceil(per));
        let start = first_word / self.align_elems * self.align_elems;
        let end = end_word.max(start + 1).min(t.words().max(1)); // bind at least one word; buffers hold one
        Window {
            binding: wgpu::BufferBinding {
                buffer: &t.buffer,
                offset: start as u64 * 4,
                size: wgpu::BufferSize::new((end - start) as u64 * 4),
            },
            elem_offset: (range.start - start * per) as u32,
        }
    }

    /// Whether a window over `range` fits one binding.
    fn fits(&self, range: &Range<usize>) -> bool {
        range.len() <= self.max_window_elems
    }

    /// Splits `0..n` into consecutive pieces of at most `max` elements (and multiples of `multiple`).
    fn pieces(n: usize, max: usize, multiple: usize) -> Vec<Range<usize>> {
        let step = (max / multiple).max(1) * multiple;
        (0..n.max(1)).step_by(step).map(|s| s..(s + step).min(n)).collect()
    }

    /// Rows per dispatch such that `rows * row_elems` fits one binding for every operand.
    fn rows_per_piece(&self, row_elems: usize) -> usize {
        (self.max_window_elems / row_elems.max(1)).max(1)
    }

    /// A 1-D grid of `groups` workgroups, folded into two dimensions past the per-dimension limit.
    fn grid(groups: usize) -> [u32; 3] {
        const MAX: usize = crate::ops::MAX_GRID_DIM;
        if groups <= MAX { [groups as u32, 1, 1] } else { [MAX as u32, groups.div_ceil(MAX) as u32, 1] }
    }

    fn elementwise_grid(n: usize) -> [u32; 3] {
        Self::grid(n.div_ceil(WORKGROUP_THREADS))
    }
}

// The children below share this file's private fields and helpers (windows, pieces) and
// gpu/dispatch.rs's `dispatch` without widening their visibility.
// The ops by family and kind: Llama's kernels (RMSNorm, RoPE, SwiGLU), the decode attention of
// generation with a KV cache, the matmul's dispatch (and its splitting across bindings), the
// cross-entropy's (whole rows and vocabulary chunks), attention, GPT-2's, the column sums, and the
// casts (f32 to packed halves and back).
mod attention;
mod casts;
mod columns;
mod crossentropy;
mod decode;
mod gpt2;
mod llama;
mod matmul;
// The `Backend` ops, each to its dispatch: the element-wise kernels inline, the others in the
// family's file above.
mod backend;
// Recording, submission, the pipeline cache and dispatch; wgpu's errors caught per call instead of
// fatal (`zerostream selftest`); waits bounded and reported; the kernels' busy time.
mod busy;
mod dispatch;
mod errors;
mod wait;
// Moving bytes: uploads and read-backs, the upload ring, host staging, pinned memory, the parallel
// fills of staging, the copy queues and the route the trainer's copies take.
mod copy_queue;
mod copy_route;
mod fill;
mod host_buffer;
mod host_staging;
mod memory;
mod pinned;
mod staging;
pub use copy_queue::CopyQueueKind;
pub use host_buffer::HostBuffer;

/// For the library's own GPU tests (as `tests/common::gpu_or_skip` is for the integration tests): the
/// adapter `--device gpu` opens by default, or None after saying `test` skipped, or a panic under
/// ZEROSTREAM_REQUIRE_GPU=1 (CI).
#[cfg(test)]
pub(crate) fn gpu_or_skip(test: &str) -> Option<GpuDevice> {
    match GpuDevice::open(None, None) {
        Ok(dev) => Some(dev),
        Err(e) if std::env::var("ZEROSTREAM_REQUIRE_GPU").as_deref() == Ok("1") => {
            panic!("{test}: ZEROSTREAM_REQUIRE_GPU=1 but no GPU adapter: {e:#}")
        }
        Err(e) => {
            eprintln!("SKIPPED {test}: no GPU adapter ({e:#})");
            None
        }
    }
}
pub use memory::GpuPendingRead;
pub use pinned::PINNED_COPY_MIN_BYTES;
pub use staging::Prestaged;

/// Opens `adapter` with the features zerostream uses (where it has them) and all of its limits: the
/// device, its queue, and the copy queues Vulkan gives beside it (none where it refuses them, said).
fn open_device(
    adapter: &wgpu::Adapter,
    summary: &AdapterSummary,
    limits: &wgpu::Limits,
) -> Result<(wgpu::Device, wgpu::Queue, Vec<copy_queue::CopyQueue>)> {
    let features = adapter.features() & WANTED_FEATURES;
    // Cooperative matrices are an experimental wgpu feature, usable only with the opt-in token.
    let experimental_features = if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        // SAFETY: wgpu asks the caller to accept that experimental features may have bugs. Only
        // `matmul_coop.wgsl` uses this one, only under `--matmul-inputs f16`, and its results are
        // checked against the twin by `tests/kernels_coop.rs` on any adapter that has the feature.
        unsafe { wgpu::ExperimentalFeatures::enabled() }
    } else {
        wgpu::ExperimentalFeatures::disabled()
    };
    let desc = wgpu::DeviceDescriptor {
        label: Some("zerostream"),
        required_features: features,
        required_limits: limits.clone(),
        experimental_features,
        ..Default::default()
    };
    // Where Vulkan refuses the extra queues, the device opens as always, without them (said).
    match copy_queue::open_with_queues(adapter, &desc) {
        Ok(Some(opened)) => return Ok(opened),
        Ok(None) => {}
        Err(e) => eprintln!("warning: {e:#}; opening {:?} without copy queues", summary.name),
    }
    let (device, queue) =
        pollster::block_on(adapter.request_device(&desc)).with_context(|| format!("opening adapter {:?}", summary.name))?;
    Ok((device, queue, Vec::new()))
}
