//! `bench kernels`' matrix products: each linear layer's forward and both backward products, and the
//! language-model head, in fp32, with a 16-bit B where the model holds the weight in 16 bits, and
//! through the cooperative-matrix kernel where the adapter has it. GPT-2's are written out here; any
//! other model's come from the tuner's list of a step's products (`tune::step_products`).

use anyhow::Result;

use super::{Bench, Bound, Case, f32_bytes, random_bf16_tensor, random_tensor};
use crate::bench::tune::operand_len;
use crate::device::gpu::GpuTensor;
use crate::device::{Backend, MatmulInputs, MatmulShape, Operand};
use crate::model::vocab::DEFAULT_CHUNK_ROWS;
use zerostream_checkpoints::LlamaConfig;

/// One product of the model: C = A @ B (+ bias) (+ C), with the bytes it must move.
struct Product<'t> {
    case: String,
    shape: MatmulShape,
    c: &'t GpuTensor,
    a: &'t GpuTensor,
    b: &'t GpuTensor,
    /// B as a 16-bit tensor, when the model may hold B in 16 bits (a weight).
    b16: Option<&'t GpuTensor>,
    bias: Option<&'t GpuTensor>,
    accumulate: bool,
    per_step: usize,
}

impl Bench<'_> {
    /// Times a product in fp32 and, when B is a weight, with B in bf16.
    fn product(&mut self, p: Product<'_>) -> Result<()> {
        let s = p.shape;
        let (m, n, k) = (s.m, s.n, s.k);
        let out_bytes = f32_bytes(m * n) * if p.accumulate { 2.0 } else { 1.0 };
        let bias_bytes = if p.bias.is_some() { f32_bytes(n) } else { 0.0 };
        let in_bytes = f32_bytes(m * k) + bias_bytes + out_bytes;
        let shape = format!("M={m} N={n} K={k}");
        let dev = self.dev;
        for (b, precision, b_bytes) in [(Some(p.b), "fp32", f32_bytes(k * n)), (p.b16, "bf16-B", 2.0 * (k * n) as f64)] {
            let Some(b) = b else { continue };
            let case = Case {
                kernel: "matmul",
                case: p.case.clone(),
                shape: shape.clone(),
                precision,
                bound: Bound::Compute,
                flops: s.flops(),
                bytes: in_bytes + b_bytes,
                per_step: if precision == "fp32" { p.per_step } else { 0 },
                variant: Some(dev.matmul_variant_for(&s, precision == "bf16-B").name()),
            };
            self.time(case, || dev.matmul(p.c, p.a, b, p.bias, &s, p.accumulate))?;
        }
        if dev.has_coop_matmul() {
            // The 16-bit path: f16-rounded inputs on cooperative matrices, with the 16-bit B when the
            // product has one (the weights of a bf16 working copy), as a training step would run it.
            let (b, precision, b_bytes) = match p.b16 {
                Some(b16) => (b16, "f16-coop bf16-B", 2.0 * (k * n) as f64),
                None => (p.b, "f16-coop", f32_bytes(k * n)),
            };
            let case = Case {
                kernel: "matmul",
                case: p.case.clone(),
                shape,
                precision,
                bound: Bound::Compute,
                flops: s.flops(),
                bytes: in_bytes + b_bytes,
                per_step: 0,
                variant: dev.coop_variant_for(&s, p.b16.is_some()).map(|t| t.name()),
            };
            dev.set_matmul_inputs(MatmulInputs::F16)?;
            let timed = self.time(case, || dev.matmul(p.c, p.a, b, p.bias, &s, p.accumulate));
            dev.set_matmul_inputs(MatmulInputs::F32)?;
            timed?;
        }
        Ok(())
    }

    /// The cooperative multiply-add's own rate (`coop_probe.wgsl`: fragments in registers, no loads in the
    /// loop), the ceiling of every `matmul_coop` variant on this adapter; `bt` sizes the grid.
    pub(super) fn coop_probe(&mut self, bt: usize) -> Result<()> {
        let dev = self.dev;
        let Some(size) = dev.coop_size().filter(|_| self.wants("matmul")) else { return Ok(()) };
        let (workgroups, iters) = ((bt / 4).clamp(8, 1024) as u32, if bt >= 1024 { 256 } else { 16 });
        let count_at = zerostream_shaders::coop_probe_count_at(size) as usize;
        let out = dev.alloc(count_at + 4, "coop probe")?;
        dev.coop_probe(&out, workgroups, iters)?;
        let subgroups = dev.read(&out)[count_at] as f64;
        if subgroups.is_nan() || subgroups < 1.0 {
            anyhow::bail!("the cooperative-matrix probe reported {subgroups} subgroups per workgroup");
        }
        let mma_flops = 2.0 * f64::from(size).powi(3);
        let case = Case {
            kernel: "matmul_coop_mma",
            case: "cooperative multiply-adds from registers (every matmul_coop variant's ceiling)".into(),
            shape: format!("{workgroups} workgroups x {subgroups} subgroups x {iters} x 8 of {size}x{size}x{size}"),
            precision: "f16-coop",
            bound: Bound::Compute,
            flops: f64::from(workgroups) * subgroups * f64::from(iters) * 8.0 * mma_flops,
            bytes: 0.0,
            per_step: 0,
            variant: None,
        };
        self.time(case, || dev.coop_probe(&out, workgroups, iters).expect("checked by the first dispatch"))
    }

    /// A linear layer (in `k`, out `n`): forward, the input gradient, the weight gradient, the bias gradient.
    pub(super) fn linear(&mut self, (name, k, n): (&str, usize, usize), bt: usize, layers: usize) -> Result<()> {
        let dev = self.dev;
        if self.wants("matmul") {
            let inp = random_tensor(dev, bt * k, 1, "input")?;
            let w = random_tensor(dev, k * n, 2, "weight")?;
            let w16 = random_bf16_tensor(dev, k * n, 2, "weight bf16")?;
            let bias = random_tensor(dev, n, 3, "bias")?;
            let out = dev.alloc(bt * n, "output")?;
            let dout = random_tensor(dev, bt * n, 4, "d output")?;
            let (dinp, dw) = (dev.alloc(bt * k, "d input")?, dev.alloc(k * n, "d weight")?);
            let products = [
                Product {
                    case: format!("{name} forward"),
                    shape: MatmulShape::row_major(bt, n, k),
                    c: &out,
                    a: &inp,
                    b: &w,
                    b16: Some(&w16),
                    bias: Some(&bias),
                    accumulate: false,
                    per_step: layers,
                },
                Product {
                    case: format!("{name} dinp"),
                    shape: MatmulShape { m: bt, n: k, k: n, a: Operand::row_major(n), b: Operand::transposed(n), c: Operand::row_major(k) },
                    c: &dinp,
                    a: &dout,
                    b: &w,
                    b16: Some(&w16),
                    bias: None,
                    accumulate: false,
                    per_step: layers,
                },
                Product {
                    case: format!("{name} dW"),
                    shape: MatmulShape { m: k, n, k: bt, a: Operand::transposed(k), b: Operand::row_major(n), c: Operand::row_major(n) },
                    c: &dw,
                    a: &inp,
                    b: &dout,
                    b16: None,
                    bias: None,
                    accumulate: true,
                    per_step: layers,
                },
            ];
            for p in products {
                self.product(p)?;
            }
        }
        if self.wants("bias_backward") {
            let dout = random_tensor(dev, bt * n, 4, "d output")?;
            let dbias = dev.alloc(n, "d bias")?;
            let case = Case::memory("bias_backward", &format!("{name} dbias"), format!("M={bt} N={n}"), f32_bytes(bt * n + 2 * n), layers);
            self.time(case, || dev.bias_backward(&dbias, &dout, bt, n))?;
        }
        Ok(())
    }

    /// A Llama step's products as the model makes them (`tune::step_products`: nn.Linear's layouts, the
    /// head one vocabulary chunk at a time), each with fresh operands; a weight's products (forward,
    /// dinp) also with the weight in bf16. Each linear's products run once per layer, the head's once
    /// per chunk; a weight's gradient and the head's input gradient add into what is there, as training
    /// adds them.
    pub(super) fn step_products(&mut self, model: &str, m: &LlamaConfig) -> Result<()> {
        if !self.wants("matmul") {
            return Ok(());
        }
        let dev = self.dev;
        let chunks = m.vocab_size.div_ceil(DEFAULT_CHUNK_ROWS.min(m.vocab_size));
        let products = crate::bench::tune::step_products(model, self.cfg.batch, self.cfg.seq_len, DEFAULT_CHUNK_ROWS, false)?;
        for (i, p) in products.iter().enumerate() {
            let s = p.shape;
            let case = p.name.strip_prefix(&format!("{model} ")).unwrap_or(&p.name).to_string();
            let head = case.starts_with("lm_head");
            let weight_is_b = !case.ends_with(" dW");
            let seed = 100 + 3 * i as u64;
            let a = random_tensor(dev, operand_len(&s.a, s.m, s.k), seed, "A")?;
            let b_len = operand_len(&s.b, s.k, s.n);
            let b = random_tensor(dev, b_len, seed + 1, "B")?;
            let b16 = if weight_is_b { Some(random_bf16_tensor(dev, b_len, seed + 1, "B bf16")?) } else { None };
            let c = random_tensor(dev, operand_len(&s.c, s.m, s.n), seed + 2, "C")?;
            self.product(Product {
                accumulate: if head { case.ends_with(" dinp") } else { !weight_is_b },
                per_step: if head { chunks } else { m.num_hidden_layers },
                case,
                shape: s,
                c: &c,
                a: &a,
                b: &b,
                b16: b16.as_ref(),
                bias: None,
            })?;
        }
        Ok(())
    }

    /// The tied lm_head as training runs it, one vocabulary chunk of `DEFAULT_CHUNK_ROWS` rows at a
    /// time (`model/vocab.rs`; the whole (BT, V) product is never made): a chunk's logits = ln_f @
    /// wte_j^T, d ln_f += dlogits_j @ wte_j, dwte_j = dlogits_j^T @ ln_f. Counted once per chunk of the
    /// step, the last (shorter) chunk as a whole one: a resident head's count. A streamed head keeps one
    /// chunk's logits, so its backward recomputes every chunk's but the last one's: the forward product
    /// runs 2 x chunks - 1 times there, and this count understates its share of the step.
    pub(super) fn lm_head(&mut self, bt: usize, c: usize, v: usize) -> Result<()> {
        if !self.wants("matmul") {
            return Ok(());
        }
        let dev = self.dev;
        let rows = crate::model::vocab::DEFAULT_CHUNK_ROWS.min(v);
        let chunks = v.div_ceil(rows);
        let wte = random_tensor(dev, rows * c, 5, "wte chunk")?;
        let wte16 = random_bf16_tensor(dev, rows * c, 5, "wte chunk bf16")?;
        let ln_f = random_tensor(dev, bt * c, 6, "ln_f")?;
        let logits = random_tensor(dev, bt * rows, 7, "logits chunk")?;
        let (d_ln_f, dwte) = (dev.alloc(bt * c, "d ln_f")?, dev.alloc(rows * c, "d wte chunk")?);
        let products = [
            Product {
                case: "lm_head forward".into(),
                shape: MatmulShape {
                    m: bt,
                    n: rows,
                    k: c,
                    a: Operand::row_major(c),
                    b: Operand::transposed(c),
                    c: Operand::row_major(rows),
                },
                c: &logits,
                a: &ln_f,
                b: &wte,
                b16: Some(&wte16),
                bias: None,
                accumulate: false,
                per_step: chunks,
            },
            Product {
                case: "lm_head dinp".into(),
                shape: MatmulShape::row_major(bt, c, rows),
                c: &d_ln_f,
                a: &logits,
                b: &wte,
                b16: Some(&wte16),
                bias: None,
                accumulate: true,
                per_step: chunks,
            },
            Product {
                case: "lm_head dW".into(),
                shape: MatmulShape {
                    m: rows,
                    n: c,
                    k: bt,
                    a: Operand::transposed(rows),
                    b: Operand::row_major(c),
                    c: Operand::row_major(c),
                },
                c: &dwte,
                a: &logits,
                b: &ln_f,
                b16: None,
                bias: None,
                accumulate: false,
                per_step: chunks,
            },
        ];
        for p in products {
            self.product(p)?;
        }
        Ok(())
    }
}
