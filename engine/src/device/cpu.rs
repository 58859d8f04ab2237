//! The `cpu` device: every op is its plain-Rust twin from [`crate::ops`], run on rayon's threads, except
//! the ops with a fast kernel beside their twin (each tested against it, each deterministic for any
//! thread count): matmul ([`crate::ops::matmul_fast`]), attention ([`crate::ops::attention_fast`]), the
//! tanh GELU ([`crate::ops::gelu_fast`]), the cross-entropy, whole rows and vocabulary chunks ([`crate::ops::crossentropy_fast`]), and
//! bias and layer-norm backward ([`crate::ops::reduce_fast`], the twins' bits).
//! It lets zerostream run without a Vulkan driver and is the reference the GPU kernels are tested against.

use std::cell::{Cell, RefCell};

use anyhow::Result;
use rayon::prelude::*;

use super::alloc::{AllocCosts, AllocStats, ByteBudget, Charge};
use super::spare_reads::SpareReads;
use super::{Activation, AttentionDims, Backend, DecodeDims, DropoutMask, HalfFormat, MatmulInputs, MatmulShape, VocabChunk};
use crate::ops::{self, encoder::TokenBuckets};

pub struct CpuDevice {
    budget: ByteBudget,
    spare_reads: SpareReads,
    /// `--matmul-inputs`: with f16, matmuls round copies of their operands first.
    matmul_inputs: Cell<MatmulInputs>,
    /// The RAM available when the device opened: its memory is RAM, and a tensor past it is refused
    /// by name rather than left to the kernel's out-of-memory killer (None where unknown).
    ram_bytes: Option<u64>,
}

pub struct CpuTensor {
    data: RefCell<Vec<f32>>,
    _charge: Charge,
}

pub struct CpuTokens {
    ids: Vec<u32>,
    buckets: TokenBuckets,
}

impl CpuDevice {
    pub fn new(budget_bytes: Option<u64>) -> Self {
        CpuDevice {
            budget: ByteBudget::new(budget_bytes.unwrap_or(u64::MAX)),
            spare_reads: SpareReads::default(),
            matmul_inputs: Cell::default(),
            ram_bytes: super::alloc::available_ram_bytes(),
        }
    }
}

/// `len` zeros, or None where the allocator refuses (past the RAM and swap the kernel will promise):
/// `vec![0.0; len]` would abort the process. Like it, the pages are the kernel's zero pages until
/// written, so a tensor sized for the largest shape costs RAM only for what is used.
fn zeroed(len: usize) -> Option<Vec<f32>> {
    let layout = std::alloc::Layout::array::<f32>(len).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the layout is non-zero-sized; a non-null pointer from the global allocator with f32's
    // layout for `len` elements, all zero bytes (0.0f32), is a valid Vec<f32> of length and capacity `len`.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout) as *mut f32;
        (!ptr.is_null()).then(|| Vec::from_raw_parts(ptr, len, len))
    }
}

impl Backend for CpuDevice {
    type Tensor = CpuTensor;
    type Tokens = CpuTokens;
    type PendingRead = Vec<Vec<f32>>;

    fn describe(&self) -> String {
        format!("cpu ({} threads)", rayon::current_num_threads())
    }
    fn alloc(&self, len: usize, label: &str) -> Result<CpuTensor> {
        let bytes = AllocCosts::CPU.tensor_bytes(len);
        let charge = self.budget.charge(bytes, label)?;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let live = self.budget.stats().live_bytes;
        // What a command can do about it: a smaller batch or sequence, or a budget that streams blocks.
        let advice = "use a smaller --batch-size or --seq-len, or a --gpu-mem-budget (blocks then stream through it)";
        if let Some(ram) = self.ram_bytes
            && live > ram
        {
            anyhow::bail!(
                "cpu device: {label} ({:.2} GiB) brings the device's memory to {:.2} GiB, past the {:.2} GiB of RAM available: {advice}",
                gib(bytes),
                gib(live),
                gib(ram)
            );
        }
        let Some(data) = zeroed(len) else {
            anyhow::bail!("cpu device: {label} ({:.2} GiB): the system refused the memory: {advice}", gib(bytes));
        };
        Ok(CpuTensor { data: RefCell::new(data), _charge: charge })
    }
    fn len(&self, t: &CpuTensor) -> usize {
        t.data.borrow().len()
    }
    fn write(&self, t: &CpuTensor, data: &[f32]) {
        ops::elementwise::copy(&mut t.data.borrow_mut()[..data.len()], data);
    }
    /// The trait's widening (its twin: `tests/transfer.rs` holds them equal), straight into the tensor
    /// on rayon's threads with `half`'s slice conversions: the default's temporary cost every upload a
    /// fresh allocation's page faults and a second pass, most of a 16-bit oversized run's step here.
    fn write_16bit(&self, t: &CpuTensor, bits: &[u16], format: HalfFormat) -> Result<()> {
        use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
        let mut data = t.data.borrow_mut();
        let dst = &mut data[..bits.len()];
        dst.par_chunks_mut(ops::elementwise::HOST_CHUNK).zip(bits.par_chunks(ops::elementwise::HOST_CHUNK)).for_each(
            |(d, b)| match format {
                HalfFormat::F16 => b.reinterpret_cast::<half::f16>().convert_to_f32_slice(d),
                HalfFormat::Bf16 => b.reinterpret_cast::<half::bf16>().convert_to_f32_slice(d),
            },
        );
        Ok(())
    }
    fn begin_read(&self, tensors: &[&CpuTensor]) -> Vec<Vec<f32>> {
        tensors.iter().map(|t| self.read(t)).collect()
    }
    fn finish_read(&self, pending: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
        pending
    }
    fn read(&self, t: &CpuTensor) -> Vec<f32> {
        let data = t.data.borrow();
        let mut v = self.spare_reads.vector(data.len());
        ops::elementwise::copy(&mut v, &data);
        v
    }
    fn recycle(&self, vectors: Vec<Vec<f32>>) {
        self.spare_reads.keep(vectors);
    }
    fn tokens(&self, ids: &[u32]) -> Result<CpuTokens> {
        Ok(CpuTokens { ids: ids.to_vec(), buckets: TokenBuckets::new(ids) })
    }
    fn alloc_stats(&self) -> AllocStats {
        self.budget.stats()
    }
    fn alloc_costs(&self) -> AllocCosts {
        AllocCosts::CPU
    }

    fn fill(&self, x: &CpuTensor, value: f32) {
        ops::elementwise::fill(&mut x.data.borrow_mut(), value);
    }
    fn axpy(&self, y: &CpuTensor, alpha: f32, x: &CpuTensor, beta: f32) {
        ops::elementwise::axpy(&mut y.data.borrow_mut(), alpha, &x.data.borrow(), beta);
    }
    fn sum_squares(&self, x: &CpuTensor) -> f64 {
        ops::elementwise::sum_squares(&x.data.borrow())
    }
    fn matmul(&self, c: &CpuTensor, a: &CpuTensor, b: &CpuTensor, bias: Option<&CpuTensor>, shape: &MatmulShape, accumulate: bool) {
        let bias = bias.map(|t| t.data.borrow());
        let (c, a, b, bias) = (&mut c.data.borrow_mut(), &a.data.borrow(), &b.data.borrow(), bias.as_deref().map(|v| v.as_slice()));
        // The one op that is not its twin: the fast matmul (AVX-512 where the CPU has it), tested against
        // `ops::matmul::matmul` in `ops::matmul_fast`'s tests; with f16 inputs, on rounded copies.
        match self.matmul_inputs.get() {
            MatmulInputs::F32 => ops::matmul_fast::matmul(c, a, b, bias, shape, accumulate),
            MatmulInputs::F16 => ops::matmul_f16::matmul_rounded_with(ops::matmul_fast::matmul, c, a, b, bias, shape, accumulate),
        }
    }
    fn set_copy_queue(&self, on: bool) -> Result<()> {
        if on {
            anyhow::bail!("--copy-queue: the cpu device copies nothing to a device (its memory is RAM); use it with --device gpu");
        }
        Ok(())
    }

    fn set_matmul_inputs(&self, inputs: MatmulInputs) -> Result<()> {
        self.matmul_inputs.set(inputs);
        Ok(())
    }
    fn bias_backward(&self, dbias: &CpuTensor, dout: &CpuTensor, m: usize, n: usize) {
        ops::reduce_fast::bias_backward(&mut dbias.data.borrow_mut(), &dout.data.borrow(), m, n);
    }
    fn encoder_forward(&self, out: &CpuTensor, tokens: &CpuTokens, wte: &CpuTensor, wpe: &CpuTensor, seq_len: usize, channels: usize) {
        ops::encoder::encoder_forward(&mut out.data.borrow_mut(), &tokens.ids, &wte.data.borrow(), &wpe.data.borrow(), seq_len, channels);
    }
    fn encoder_backward(
        &self,
        dwte: &CpuTensor,
        dwpe: &CpuTensor,
        dout: &CpuTensor,
        tokens: &CpuTokens,
        batch: usize,
        seq_len: usize,
        channels: usize,
    ) {
        ops::encoder::encoder_backward(
            &mut dwte.data.borrow_mut(),
            &mut dwpe.data.borrow_mut(),
            &dout.data.borrow(),
            &tokens.buckets,
            batch,
            seq_len,
            channels,
        );
    }
    fn layernorm_forward(
        &self,
        out: &CpuTensor,
        mean: &CpuTensor,
        rstd: &CpuTensor,
        x: &CpuTensor,
        weight: &CpuTensor,
        bias: &CpuTensor,
        rows: usize,
        channels: usize,
        eps: f32,
    ) {
        ops::layernorm::layernorm_forward(
            &mut out.data.borrow_mut(),
            &mut mean.data.borrow_mut(),
            &mut rstd.data.borrow_mut(),
            &x.data.borrow(),
            &weight.data.borrow(),
            &bias.data.borrow(),
            rows,
            channels,
            eps,
        );
    }
    fn layernorm_backward(
        &self,
        dx: &CpuTensor,
        dweight: &CpuTensor,
        dbias: &CpuTensor,
        dout: &CpuTensor,
        x: &CpuTensor,
        weight: &CpuTensor,
        mean: &CpuTensor,
        rstd: &CpuTensor,
        rows: usize,
        channels: usize,
    ) {
        ops::reduce_fast::layernorm_backward(
            &mut dx.data.borrow_mut(),
            &mut dweight.data.borrow_mut(),
            &mut dbias.data.borrow_mut(),
            &dout.data.borrow(),
            &x.data.borrow(),
            &weight.data.borrow(),
            &mean.data.borrow(),
            &rstd.data.borrow(),
            rows,
            channels,
        );
    }
    fn attention_forward(&self, out: &CpuTensor, lse: &CpuTensor, qkv: &CpuTensor, dims: AttentionDims) {
        ops::attention_fast::attention_forward(&mut out.data.borrow_mut(), &mut lse.data.borrow_mut(), &qkv.data.borrow(), dims);
    }
    fn attention_backward(
        &self,
        dqkv: &CpuTensor,
        delta: &CpuTensor,
        dout: &CpuTensor,
        qkv: &CpuTensor,
        out: &CpuTensor,
        lse: &CpuTensor,
        dims: AttentionDims,
    ) {
        ops::attention_fast::attention_backward(
            &mut dqkv.data.borrow_mut(),
            &mut delta.data.borrow_mut(),
            &dout.data.borrow(),
            &qkv.data.borrow(),
            &out.data.borrow(),
            &lse.data.borrow(),
            dims,
        );
    }
    fn activation_forward(&self, f: Activation, out: &CpuTensor, x: &CpuTensor) {
        match f {
            Activation::GeluTanh => ops::gelu_fast::gelu_forward(&mut out.data.borrow_mut(), &x.data.borrow()),
            _ => f.forward(&mut out.data.borrow_mut(), &x.data.borrow()),
        }
    }
    fn activation_backward(&self, f: Activation, dx: &CpuTensor, x: &CpuTensor, dout: &CpuTensor) {
        match f {
            Activation::GeluTanh => ops::gelu_fast::gelu_backward(&mut dx.data.borrow_mut(), &x.data.borrow(), &dout.data.borrow()),
            _ => f.backward(&mut dx.data.borrow_mut(), &x.data.borrow(), &dout.data.borrow()),
        }
    }
    fn residual_forward(&self, out: &CpuTensor, a: &CpuTensor, b: &CpuTensor) {
        ops::elementwise::residual_forward(&mut out.data.borrow_mut(), &a.data.borrow(), &b.data.borrow());
    }
    fn dropout(&self, out: &CpuTensor, x: &CpuTensor, cols: usize, mask: &DropoutMask) {
        ops::dropout::dropout(&mut out.data.borrow_mut(), &x.data.borrow(), cols, mask);
    }
    fn dropout_residual(&self, out: &CpuTensor, residual: &CpuTensor, x: &CpuTensor, cols: usize, mask: &DropoutMask) {
        ops::dropout::dropout_residual(&mut out.data.borrow_mut(), &residual.data.borrow(), &x.data.borrow(), cols, mask);
    }
    fn crossentropy(&self, losses: &CpuTensor, logits: &CpuTensor, targets: &CpuTokens, vocab: usize, grad_scale: Option<f32>) {
        ops::crossentropy_fast::crossentropy(&mut losses.data.borrow_mut(), &mut logits.data.borrow_mut(), &targets.ids, vocab, grad_scale);
    }
    fn crossentropy_chunk_stats(&self, stats: &CpuTensor, logits: &CpuTensor, targets: &CpuTokens, chunk: &VocabChunk) {
        ops::crossentropy_fast::crossentropy_chunk_stats(&mut stats.data.borrow_mut(), &logits.data.borrow(), &targets.ids, chunk);
    }
    fn crossentropy_chunk_grad(&self, logits: &CpuTensor, lse: &CpuTensor, targets: &CpuTokens, chunk: &VocabChunk, grad_scale: f32) {
        ops::crossentropy_fast::crossentropy_chunk_grad(&mut logits.data.borrow_mut(), &lse.data.borrow(), &targets.ids, chunk, grad_scale);
    }

    fn rmsnorm_forward(
        &self,
        out: &CpuTensor,
        rstd: &CpuTensor,
        x: &CpuTensor,
        weight: &CpuTensor,
        rows: usize,
        channels: usize,
        eps: f32,
    ) {
        ops::rmsnorm::rmsnorm_forward(
            &mut out.data.borrow_mut(),
            &mut rstd.data.borrow_mut(),
            &x.data.borrow(),
            &weight.data.borrow(),
            rows,
            channels,
            eps,
        );
    }
    fn rmsnorm_backward(
        &self,
        dx: &CpuTensor,
        dweight: &CpuTensor,
        dout: &CpuTensor,
        x: &CpuTensor,
        weight: &CpuTensor,
        rstd: &CpuTensor,
        rows: usize,
        channels: usize,
    ) {
        ops::rmsnorm::rmsnorm_backward(
            &mut dx.data.borrow_mut(),
            &mut dweight.data.borrow_mut(),
            &dout.data.borrow(),
            &x.data.borrow(),
            &weight.data.borrow(),
            &rstd.data.borrow(),
            rows,
            channels,
        );
    }
    fn rope(
        &self,
        x: &CpuTensor,
        inv_freq: &CpuTensor,
        rows_per_seq: usize,
        rows: usize,
        row_stride: usize,
        col_offset: usize,
        heads: usize,
        head_dim: usize,
        inverse: bool,
    ) {
        ops::rope::rope(
            &mut x.data.borrow_mut(),
            &inv_freq.data.borrow(),
            rows_per_seq,
            rows,
            row_stride,
            col_offset,
            heads,
            head_dim,
            inverse,
        );
    }
    fn rope_at(
        &self,
        x: &CpuTensor,
        inv_freq: &CpuTensor,
        first_position: usize,
        rows: usize,
        row_stride: usize,
        col_offset: usize,
        heads: usize,
        head_dim: usize,
    ) {
        let (mut x, inv_freq) = (x.data.borrow_mut(), inv_freq.data.borrow());
        ops::rope::rope_at(&mut x, &inv_freq, first_position, rows, row_stride, col_offset, heads, head_dim);
    }
    fn attention_decode(&self, out: &CpuTensor, cache: &CpuTensor, qkv: &CpuTensor, dims: DecodeDims) {
        ops::attention_decode::attention_decode(&mut out.data.borrow_mut(), &mut cache.data.borrow_mut(), &qkv.data.borrow(), dims);
    }
    fn swiglu_forward(&self, out: &CpuTensor, gate_up: &CpuTensor, rows: usize, hidden: usize) {
        ops::swiglu::swiglu_forward(&mut out.data.borrow_mut(), &gate_up.data.borrow(), rows, hidden);
    }
    fn swiglu_backward(&self, d_gate_up: &CpuTensor, dout: &CpuTensor, gate_up: &CpuTensor, rows: usize, hidden: usize) {
        ops::swiglu::swiglu_backward(&mut d_gate_up.data.borrow_mut(), &dout.data.borrow(), &gate_up.data.borrow(), rows, hidden);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor past the RAM (or past what the allocator gives) is an error naming it, not an abort, and
    /// charges nothing.
    #[test]
    fn a_tensor_past_the_ram_is_refused_by_name() {
        let dev = CpuDevice::new(None);
        let err = dev.alloc(usize::MAX / 8, "huge activations").err().expect("refused").to_string();
        assert!(err.contains("huge activations") && err.contains("--gpu-mem-budget"), "{err}");
        assert_eq!(dev.alloc_stats().live_bytes, 0, "the refused tensor's charge is released");
        let t = dev.alloc(1000, "small").unwrap();
        assert_eq!((dev.len(&t), dev.read(&t).iter().all(|&x| x == 0.0)), (1000, true));
    }
}
