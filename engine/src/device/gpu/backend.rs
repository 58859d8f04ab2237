//! `impl Backend for GpuDevice`: every op of the device trait, each to its dispatch — the element-wise
//! kernels (fill, axpy, the gradient norm's sum of squares, activations, residual, dropout, bias
//! backward) here, the others in their family's file (`gpu/gpt2.rs`, `gpu/attention.rs`, `gpu/llama.rs`,
//! `gpu/crossentropy.rs`, `gpu/matmul.rs`, `gpu/decode.rs`, `gpu/memory.rs`).

use super::*;

impl Backend for GpuDevice {
    type Tensor = GpuTensor;
    type Tokens = GpuTokens;
    type PendingRead = GpuPendingRead;

    fn describe(&self) -> String {
        let copies = match self.copy_queue_in_use() {
            Some(kind) => format!(", big copies on {}", kind.describe()),
            None => String::new(),
        };
        format!("{} ({}, {:?}{copies})", self.summary.name, self.summary.backend, self.summary.device_type)
    }
    fn alloc(&self, len: usize, label: &str) -> Result<GpuTensor> {
        self.storage_tensor(len, label)
    }
    fn len(&self, t: &GpuTensor) -> usize {
        t.len
    }
    fn write(&self, t: &GpuTensor, data: &[f32]) {
        assert!(t.format.is_none(), "a 16-bit tensor is written with write_16bit");
        assert!(data.len() <= t.len, "write of {} elements into a tensor of {}", data.len(), t.len);
        self.write_words(t, bytemuck::cast_slice(data));
    }
    fn read(&self, t: &GpuTensor) -> Vec<f32> {
        self.read_many(&[t]).pop().expect("one tensor read")
    }
    fn begin_read(&self, tensors: &[&GpuTensor]) -> GpuPendingRead {
        self.begin_read_words(tensors)
    }
    fn finish_read(&self, pending: GpuPendingRead) -> Vec<Vec<f32>> {
        let formats = pending.formats.clone();
        self.with_mapped(pending, |words| words.iter().zip(formats).map(|(w, (format, len))| self.widen(format, len, w)).collect())
    }
    fn finish_read_with<R>(&self, pending: GpuPendingRead, f: impl FnOnce(&[&[f32]]) -> R) -> R {
        let formats = pending.formats.clone();
        self.with_mapped(pending, |words| {
            // Only 16-bit tensors need a host vector (widened); f32 ones are lent from the mapping.
            let widened: Vec<Option<Vec<f32>>> =
                words.iter().zip(&formats).map(|(w, &(format, len))| format.map(|_| self.widen(format, len, w))).collect();
            let lent: Vec<&[f32]> = words
                .iter()
                .zip(&formats)
                .zip(&widened)
                .map(|((w, &(_, len)), wide)| match wide {
                    Some(v) => v.as_slice(),
                    None => bytemuck::cast_slice(&w[..len]),
                })
                .collect();
            let out = f(&lent);
            self.spare_reads.keep(widened.into_iter().flatten().collect());
            out
        })
    }
    fn recycle(&self, vectors: Vec<Vec<f32>>) {
        self.spare_reads.keep(vectors);
    }
    fn tokens(&self, ids: &[u32]) -> Result<GpuTokens> {
        let buckets = TokenBuckets::new(ids);
        Ok(GpuTokens {
            ids: self.upload_words(ids, "tokens")?,
            bucket_token: self.upload_words(&buckets.token, "token buckets")?,
            bucket_start: self.upload_words(&buckets.start, "token bucket starts")?,
            positions: self.upload_words(&buckets.positions, "token positions")?,
            buckets,
        })
    }
    fn alloc_stats(&self) -> AllocStats {
        self.budget.stats()
    }
    fn alloc_costs(&self) -> AllocCosts {
        AllocCosts::GPU
    }
    fn synchronize(&self) {
        GpuDevice::synchronize(self)
    }
    fn is_async(&self) -> bool {
        true
    }
    fn kernel_seconds(&self) -> Option<f64> {
        GpuDevice::kernel_seconds(self)
    }
    fn alloc_16bit(&self, len: usize, label: &str, format: HalfFormat) -> Result<GpuTensor> {
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        self.create_formatted(len, Some(format), label, usage)
    }
    fn check_attention(&self, d: AttentionDims) -> Result<()> {
        d.check_kernel_limits(self.max_window_elems, self.device.limits().max_compute_workgroup_storage_size as usize)
    }
    fn alloc_pinned(&self, len_bytes: usize) -> Option<std::result::Result<zerostream_offload::AlignedBuf, crate::device::PinRefused>> {
        Some(GpuDevice::alloc_pinned(self, len_bytes))
    }
    fn write_16bit(&self, t: &GpuTensor, bits: &[u16], format: HalfFormat) -> Result<()> {
        assert!(bits.len() <= t.len, "write of {} elements into a tensor of {}", bits.len(), t.len);
        if bits.is_empty() {
            return Ok(());
        }
        // Half the bytes cross the bus, straight from `bits` (two halves per word, as the device packs
        // them); the widening runs on the device, or not at all for a 16-bit tensor.
        if let Some(stored) = t.format {
            assert_eq!(stored, format, "write_16bit of {format:?} values into a {stored:?} tensor");
            self.write_halves(t, bits);
            return Ok(());
        }
        let packed = self.storage_tensor(bits.len().div_ceil(2), "16-bit upload")?;
        self.write_halves(&packed, bits);
        match format {
            HalfFormat::F16 => self.cast_f16_to_f32(t, &packed, bits.len()),
            HalfFormat::Bf16 => self.cast_bf16_to_f32(t, &packed, bits.len()),
        }
        Ok(())
    }

    fn fill(&self, x: &GpuTensor, value: f32) {
        for r in Self::pieces(x.len, self.max_window_elems, self.align_elems) {
            let w = self.window(x, r.clone());
            self.dispatch(
                shaders::FILL,
                "main",
                &[r.len() as u32, w.elem_offset, value.to_bits(), 0],
                &[(1, w.binding)],
                Self::elementwise_grid(r.len()),
            );
        }
    }
    fn axpy(&self, y: &GpuTensor, alpha: f32, x: &GpuTensor, beta: f32) {
        for r in Self::pieces(y.len.min(x.len), self.max_window_elems, self.align_elems) {
            let (xw, yw) = (self.window(x, r.clone()), self.window(y, r.clone()));
            self.dispatch(
                shaders::AXPY,
                "main",
                &[r.len() as u32, xw.elem_offset, yw.elem_offset, 0, alpha.to_bits(), beta.to_bits(), 0, 0],
                &[(1, xw.binding), (2, yw.binding)],
                Self::elementwise_grid(r.len()),
            );
        }
    }
    fn sum_squares(&self, x: &GpuTensor) -> f64 {
        let groups = x.len.div_ceil(SUM_SQUARES_GROUP);
        let partial = self.storage_tensor(groups, "sum_squares partials").expect("sum_squares scratch");
        // Pieces are whole groups, so the grouping (and the f32 rounding) matches the twin exactly.
        for r in Self::pieces(x.len, self.max_window_elems, SUM_SQUARES_GROUP) {
            let xw = self.window(x, r.clone());
            let first_group = r.start / SUM_SQUARES_GROUP;
            let piece_groups = r.len().div_ceil(SUM_SQUARES_GROUP);
            let pw = self.window(&partial, first_group..first_group + piece_groups);
            self.dispatch(
                shaders::SUM_SQUARES,
                "main",
                &[r.len() as u32, xw.elem_offset, pw.elem_offset, 0],
                &[(1, xw.binding), (2, pw.binding)],
                Self::grid(piece_groups),
            );
        }
        self.read(&partial).iter().map(|&v| v as f64).sum()
    }

    fn matmul(&self, c: &GpuTensor, a: &GpuTensor, b: &GpuTensor, bias: Option<&GpuTensor>, s: &MatmulShape, accumulate: bool) {
        assert_eq!(s.c.col_stride, 1, "matmul: C must have unit column stride");
        if s.m == 0 || s.n == 0 {
            return;
        }
        self.matmul_piece(c, a, b, bias, s, 0..s.m, 0..s.n, 0..s.k, accumulate, true);
    }
    fn set_copy_queue(&self, on: bool) -> Result<()> {
        GpuDevice::set_copy_queue(self, on)
    }

    fn set_matmul_inputs(&self, inputs: MatmulInputs) -> Result<()> {
        if inputs == MatmulInputs::F16
            && let Some(why) = matmul::coop_unavailable(&self.summary)
        {
            bail!(
                "--matmul-inputs f16: adapter {:?} cannot run the cooperative-matrix matmul ({why}); \
                 use --matmul-inputs f32 (the default), or --device cpu",
                self.summary.name
            );
        }
        self.matmul_inputs.set(inputs);
        Ok(())
    }
    fn bias_backward(&self, dbias: &GpuTensor, dout: &GpuTensor, m: usize, n: usize) {
        for piece in self.column_pieces(m, n, 1) {
            let dw = self.window(dout, piece.rows.start * n..piece.rows.end * n);
            let out = self.column_target(&piece, n, dbias, 0);
            let params = [
                piece.rows.len() as u32,
                n as u32,
                dw.elem_offset,
                out.elem_offset,
                piece.rows_per_block() as u32,
                piece.blocks as u32,
                0,
                0,
            ];
            self.dispatch(shaders::BIAS_BACKWARD, "main", &params, &[(1, dw.binding), (2, out.binding)], piece.grid(n));
            self.add_column_partials(&piece, n, &[dbias]);
        }
    }

    fn encoder_forward(&self, out: &GpuTensor, tokens: &GpuTokens, wte: &GpuTensor, wpe: &GpuTensor, seq_len: usize, channels: usize) {
        self.dispatch_encoder_forward(out, tokens, wte, wpe, seq_len, channels)
    }
    fn encoder_backward(
        &self,
        dwte: &GpuTensor,
        dwpe: &GpuTensor,
        dout: &GpuTensor,
        tokens: &GpuTokens,
        batch: usize,
        seq_len: usize,
        channels: usize,
    ) {
        self.dispatch_encoder_backward(dwte, dwpe, dout, tokens, batch, seq_len, channels)
    }

    fn layernorm_forward(
        &self,
        out: &GpuTensor,
        mean: &GpuTensor,
        rstd: &GpuTensor,
        x: &GpuTensor,
        weight: &GpuTensor,
        bias: &GpuTensor,
        rows: usize,
        channels: usize,
        eps: f32,
    ) {
        self.dispatch_layernorm_forward(out, mean, rstd, x, weight, bias, rows, channels, eps)
    }
    fn layernorm_backward(
        &self,
        dx: &GpuTensor,
        dweight: &GpuTensor,
        dbias: &GpuTensor,
        dout: &GpuTensor,
        x: &GpuTensor,
        weight: &GpuTensor,
        mean: &GpuTensor,
        rstd: &GpuTensor,
        rows: usize,
        channels: usize,
    ) {
        self.dispatch_layernorm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd, rows, channels)
    }

    fn attention_forward(&self, out: &GpuTensor, lse: &GpuTensor, qkv: &GpuTensor, d: AttentionDims) {
        self.dispatch_attention_forward(out, lse, qkv, d)
    }
    fn attention_backward(
        &self,
        dqkv: &GpuTensor,
        delta: &GpuTensor,
        dout: &GpuTensor,
        qkv: &GpuTensor,
        out: &GpuTensor,
        lse: &GpuTensor,
        d: AttentionDims,
    ) {
        self.dispatch_attention_backward(dqkv, delta, dout, qkv, out, lse, d)
    }

    fn activation_forward(&self, f: Activation, out: &GpuTensor, x: &GpuTensor) {
        let kernel = match f {
            Activation::GeluTanh => shaders::GELU_FORWARD,
            Activation::GeluErf => shaders::GELU_ERF_FORWARD,
            Activation::Relu => shaders::RELU_FORWARD,
        };
        for r in Self::pieces(out.len.min(x.len), self.max_window_elems, self.align_elems) {
            let (xw, ow) = (self.window(x, r.clone()), self.window(out, r.clone()));
            self.dispatch(
                kernel,
                "main",
                &[r.len() as u32, xw.elem_offset, ow.elem_offset, 0],
                &[(1, xw.binding), (2, ow.binding)],
                Self::elementwise_grid(r.len()),
            );
        }
    }
    fn activation_backward(&self, f: Activation, dx: &GpuTensor, x: &GpuTensor, dout: &GpuTensor) {
        // The three kernels share one Params layout and binding order.
        let kernel = match f {
            Activation::GeluTanh => shaders::GELU_BACKWARD,
            Activation::GeluErf => shaders::GELU_ERF_BACKWARD,
            Activation::Relu => shaders::RELU_BACKWARD,
        };
        for r in Self::pieces(dx.len.min(x.len), self.max_window_elems, self.align_elems) {
            let (xw, dw, gw) = (self.window(x, r.clone()), self.window(dout, r.clone()), self.window(dx, r.clone()));
            self.dispatch(
                kernel,
                "main",
                &[r.len() as u32, xw.elem_offset, dw.elem_offset, gw.elem_offset],
                &[(1, xw.binding), (2, dw.binding), (3, gw.binding)],
                Self::elementwise_grid(r.len()),
            );
        }
    }
    fn residual_forward(&self, out: &GpuTensor, a: &GpuTensor, b: &GpuTensor) {
        for r in Self::pieces(out.len, self.max_window_elems, self.align_elems) {
            let (aw, bw, ow) = (self.window(a, r.clone()), self.window(b, r.clone()), self.window(out, r.clone()));
            self.dispatch(
                shaders::RESIDUAL_FORWARD,
                "main",
                &[r.len() as u32, aw.elem_offset, bw.elem_offset, ow.elem_offset],
                &[(1, aw.binding), (2, bw.binding), (3, ow.binding)],
                Self::elementwise_grid(r.len()),
            );
        }
    }
    fn dropout(&self, out: &GpuTensor, x: &GpuTensor, cols: usize, mask: &DropoutMask) {
        for r in Self::pieces(out.len.min(x.len), self.max_window_elems, self.align_elems) {
            let (xw, ow) = (self.window(x, r.clone()), self.window(out, r.clone()));
            let params = dropout_params(r.len(), xw.elem_offset, ow.elem_offset, r.start, cols, mask, 0);
            self.dispatch(shaders::DROPOUT, "main", &params, &[(1, xw.binding), (2, ow.binding)], Self::elementwise_grid(r.len()));
        }
    }
    fn dropout_residual(&self, out: &GpuTensor, residual: &GpuTensor, x: &GpuTensor, cols: usize, mask: &DropoutMask) {
        for r in Self::pieces(out.len.min(x.len).min(residual.len), self.max_window_elems, self.align_elems) {
            let (xw, ow, rw) = (self.window(x, r.clone()), self.window(out, r.clone()), self.window(residual, r.clone()));
            let params = dropout_params(r.len(), xw.elem_offset, ow.elem_offset, r.start, cols, mask, rw.elem_offset);
            let bindings = [(1, xw.binding), (2, ow.binding), (3, rw.binding)];
            self.dispatch(shaders::DROPOUT_RESIDUAL, "main", &params, &bindings, Self::elementwise_grid(r.len()));
        }
    }

    // The cross-entropy ops: the dispatch code is in gpu/crossentropy.rs.
    fn crossentropy(&self, losses: &GpuTensor, logits: &GpuTensor, targets: &GpuTokens, vocab: usize, grad_scale: Option<f32>) {
        self.dispatch_crossentropy(losses, logits, targets, vocab, grad_scale)
    }
    fn crossentropy_chunk_stats(&self, stats: &GpuTensor, logits: &GpuTensor, targets: &GpuTokens, chunk: &VocabChunk) {
        self.dispatch_crossentropy_chunk_stats(stats, logits, targets, chunk)
    }
    fn crossentropy_chunk_grad(&self, logits: &GpuTensor, lse: &GpuTensor, targets: &GpuTokens, chunk: &VocabChunk, grad_scale: f32) {
        self.dispatch_crossentropy_chunk_grad(logits, lse, targets, chunk, grad_scale)
    }

    // Llama's ops: the dispatch code is in gpu/llama.rs.
    fn rmsnorm_forward(
        &self,
        out: &GpuTensor,
        rstd: &GpuTensor,
        x: &GpuTensor,
        weight: &GpuTensor,
        rows: usize,
        channels: usize,
        eps: f32,
    ) {
        self.dispatch_rmsnorm_forward(out, rstd, x, weight, rows, channels, eps)
    }
    fn rmsnorm_backward(
        &self,
        dx: &GpuTensor,
        dweight: &GpuTensor,
        dout: &GpuTensor,
        x: &GpuTensor,
        weight: &GpuTensor,
        rstd: &GpuTensor,
        rows: usize,
        channels: usize,
    ) {
        self.dispatch_rmsnorm_backward(dx, dweight, dout, x, weight, rstd, rows, channels)
    }
    fn rope(
        &self,
        x: &GpuTensor,
        inv_freq: &GpuTensor,
        rows_per_seq: usize,
        rows: usize,
        row_stride: usize,
        col_offset: usize,
        heads: usize,
        head_dim: usize,
        inverse: bool,
    ) {
        self.dispatch_rope(x, inv_freq, rows_per_seq, rows, row_stride, col_offset, heads, head_dim, inverse)
    }
    fn rope_at(
        &self,
        x: &GpuTensor,
        inv_freq: &GpuTensor,
        first_position: usize,
        rows: usize,
        row_stride: usize,
        col_offset: usize,
        heads: usize,
        head_dim: usize,
    ) {
        // A period no row reaches: row r is position first_position + r.
        let period = u32::MAX as usize;
        self.dispatch_rope_from(x, inv_freq, first_position, period, rows, row_stride, col_offset, heads, head_dim, false)
    }
    fn attention_decode(&self, out: &GpuTensor, cache: &GpuTensor, qkv: &GpuTensor, dims: DecodeDims) {
        self.dispatch_attention_decode(out, cache, qkv, dims)
    }
    fn check_attention_decode(&self, dims: DecodeDims) -> Result<()> {
        dims.check_kernel_limits(self.max_window_elems, self.device.limits().max_compute_workgroup_storage_size as usize)
    }
    fn swiglu_forward(&self, out: &GpuTensor, gate_up: &GpuTensor, rows: usize, hidden: usize) {
        self.dispatch_swiglu_forward(out, gate_up, rows, hidden)
    }
    fn swiglu_backward(&self, d_gate_up: &GpuTensor, dout: &GpuTensor, gate_up: &GpuTensor, rows: usize, hidden: usize) {
        self.dispatch_swiglu_backward(d_gate_up, dout, gate_up, rows, hidden)
    }
}
