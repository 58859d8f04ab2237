//! [`Model`]: the one type the engine outside `model/` sees. Each method is a dispatch to the family's
//! module; tensors cross the seam as flat lists in the family's table order (a parameter group), and
//! activations as the family's own structs behind [`BlockActs`] / [`HeadActs`].

use std::path::Path;

use anyhow::{Context, Result, bail};
use zerostream_checkpoints::{ArchConfig, Gpt2Config, HfModel, LlamaConfig};

use super::TensorSpec;
use super::gpt2::{self, Block, BlockActivations, HeadActivations};
use super::llama;
use super::vocab::{self, DEFAULT_CHUNK_ROWS, LossActs, VocabChunks};
use crate::device::{AttentionDims, Backend};
use crate::ops::dropout::{DropoutKeys, DropoutRates};

/// A model: its family and configuration.
#[derive(Clone, Debug, PartialEq)]
pub enum Model {
    Gpt2(Gpt2Config),
    Llama(LlamaConfig),
}

/// What one block keeps from forward for backward (the family's own struct).
pub enum BlockActs<T> {
    Gpt2(BlockActivations<T>),
    Llama(llama::BlockActivations<T>),
}

/// The activations outside the blocks and the backward scratch (the family's own struct).
pub enum HeadActs<T> {
    Gpt2(HeadActivations<T>),
    Llama(llama::HeadActivations<T>),
}

/// Next-token logits of a model resident on the cpu device, for a sequence of token ids.
pub type ResidentLogits<'a> = Box<dyn FnMut(&[u32]) -> Result<Vec<f32>> + 'a>;
/// Where `resident_logits` reads each weight: `(name, shape)` to its values in row-major order.
pub type WeightSource<'w> = dyn Fn(&str, &[usize]) -> Result<Vec<f32>> + 'w;

impl Model {
    /// The model a Hugging Face `config.json` describes (by its `model_type`).
    pub fn from_config_file(path: &Path) -> Result<Self> {
        Self::of_arch(ArchConfig::from_file(path)?)
    }

    fn of_arch(config: ArchConfig) -> Result<Self> {
        match config {
            ArchConfig::Gpt2(c) => Ok(Model::Gpt2(c)),
            ArchConfig::Llama(c) => {
                llama::check_supported(&c)?;
                Ok(Model::Llama(c))
            }
        }
    }

    /// The model of a config.json already parsed (a checkpoint's record of it).
    pub fn from_hf_json(value: &serde_json::Value) -> Result<Self> {
        let map = value.as_object().context("the model configuration: expected a JSON object")?;
        if map.get("model_type").and_then(|t| t.as_str()) == Some("gpt2") {
            let config: Gpt2Config = serde_json::from_value(value.clone()).context("the model configuration")?;
            config.validate()?;
            return Ok(Model::Gpt2(config));
        }
        Self::of_arch(ArchConfig::Llama(LlamaConfig::from_json(map)?))
    }

    /// The model of an opened Hugging Face directory.
    pub fn of_hf(hf: &HfModel) -> Result<Self> {
        Self::of_arch(hf.config.clone())
    }

    /// A preset by name, with random weights to come.
    pub fn preset(name: &str) -> Option<Self> {
        Gpt2Config::preset(name).map(Model::Gpt2).or_else(|| LlamaConfig::preset(name).map(Model::Llama))
    }
    pub const PRESETS: &'static str = "gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-3.2-1b, llama-3-8b";

    /// The built-in run's model: a 4-layer, 128-wide GPT-2 over the words of its text, with dropout
    /// 0.1 against a corpus this small (0.8M parameters besides the vocab_size x 128 embedding).
    pub fn demo(vocab_size: usize) -> Self {
        Model::Gpt2(Gpt2Config {
            vocab_size,
            n_positions: 128,
            n_embd: 128,
            n_layer: 4,
            n_head: 4,
            n_inner: None,
            layer_norm_epsilon: 1e-5,
            activation_function: "gelu_new".into(),
            resid_pdrop: 0.1,
            embd_pdrop: 0.1,
            attn_pdrop: 0.1,
            scale_attn_weights: true,
            scale_attn_by_inverse_layer_idx: false,
            reorder_and_upcast_attn: false,
            tie_word_embeddings: true,
        })
    }

    pub fn validate(&self) -> Result<()> {
        match self {
            Model::Gpt2(c) => c.validate(),
            Model::Llama(c) => c.validate(),
        }
    }

    /// config.json as transformers writes it.
    pub fn to_hf_json(&self) -> serde_json::Value {
        match self {
            Model::Gpt2(c) => c.to_hf_json(),
            Model::Llama(c) => c.to_hf_json(),
        }
    }

    pub fn n_layer(&self) -> usize {
        match self {
            Model::Gpt2(c) => c.n_layer,
            Model::Llama(c) => c.num_hidden_layers,
        }
    }
    pub fn vocab_size(&self) -> usize {
        match self {
            Model::Gpt2(c) => c.vocab_size,
            Model::Llama(c) => c.vocab_size,
        }
    }
    /// C: the residual stream's width.
    pub fn width(&self) -> usize {
        match self {
            Model::Gpt2(c) => c.n_embd,
            Model::Llama(c) => c.hidden_size,
        }
    }
    /// The longest sequence the model takes.
    pub fn max_seq_len(&self) -> usize {
        match self {
            Model::Gpt2(c) => c.n_positions,
            Model::Llama(c) => c.max_position_embeddings,
        }
    }

    /// One line for people: family and shape.
    pub fn describe(&self) -> String {
        match self {
            Model::Gpt2(c) => format!(
                "GPT-2, {} layers, {} channels, {} heads, vocab {}, context {}",
                c.n_layer, c.n_embd, c.n_head, c.vocab_size, c.n_positions
            ),
            Model::Llama(c) => format!(
                "Llama ({}), {} layers, {} hidden, {} heads ({} key/value) of {}, MLP {}, vocab {}, context {}{}",
                c.model_type,
                c.num_hidden_layers,
                c.hidden_size,
                c.num_attention_heads,
                c.num_key_value_heads,
                c.head_dim,
                c.intermediate_size,
                c.vocab_size,
                c.max_position_embeddings,
                if c.tie_word_embeddings { ", tied head" } else { "" }
            ),
        }
    }

    /// The dropout probabilities training applies (all 0 for the families without dropout).
    pub fn dropout_rates(&self) -> DropoutRates {
        match self {
            Model::Gpt2(c) => gpt2::dropout_rates(c),
            Model::Llama(_) => DropoutRates::default(),
        }
    }

    /// The dropout training applies, described by the config's names; `None` without dropout.
    pub fn describe_dropout(&self) -> Option<String> {
        match self {
            Model::Gpt2(c) => c.dropout_requested(),
            Model::Llama(_) => None,
        }
    }

    /// The model with every dropout probability set to `p` (`--dropout P`); refused for a family that
    /// has no dropout unless p is 0.
    pub fn with_dropout(&self, p: f64) -> Result<Model> {
        if !(0.0..1.0).contains(&p) {
            bail!("--dropout {p}: expected a probability 0 <= p < 1");
        }
        match self {
            Model::Gpt2(c) => Ok(Model::Gpt2(Gpt2Config { resid_pdrop: p, embd_pdrop: p, attn_pdrop: p, ..c.clone() })),
            Model::Llama(_) if p == 0.0 => Ok(self.clone()),
            Model::Llama(_) => bail!("--dropout {p}: the llama family has no dropout in zerostream (attention_dropout must be 0)"),
        }
    }

    /// The masks' keys of one training micro-batch (global index `micro_batch` of the training
    /// contract), or `None` when the model drops nothing, so runs without dropout never draw a mask.
    pub fn dropout_keys(&self, seed: u64, step: u64, micro_batch: u64) -> Option<DropoutKeys> {
        let rates = self.dropout_rates();
        (!rates.is_zero()).then_some(DropoutKeys { rates, seed, step, micro_batch })
    }

    pub fn attention_dims(&self, batch: usize, seq_len: usize) -> AttentionDims {
        match self {
            Model::Gpt2(c) => gpt2::attention_dims(c, batch, seq_len),
            Model::Llama(c) => llama::attention_dims(c, batch, seq_len),
        }
    }

    /// The tensors outside the blocks (the head group), in table order.
    pub fn head_specs(&self) -> Vec<TensorSpec> {
        match self {
            Model::Gpt2(c) => gpt2::head_specs(c),
            Model::Llama(c) => llama::head_specs(c),
        }
    }
    /// Block `l`'s tensors, in table order.
    pub fn block_specs(&self, l: usize) -> Vec<TensorSpec> {
        match self {
            Model::Gpt2(c) => Block::<()>::specs(c, &gpt2::block_prefix(l)),
            Model::Llama(c) => llama::block_specs(c, l),
        }
    }
    /// Every tensor in the order of the family's Hugging Face checkpoints.
    pub fn checkpoint_specs(&self) -> Vec<TensorSpec> {
        match self {
            Model::Gpt2(c) => gpt2::parameter_specs(c),
            Model::Llama(c) => llama::parameter_specs(c),
        }
    }

    /// The family's random initialisation of tensor `spec` (number `index` in checkpoint order), seeded.
    pub fn init(&self, spec: &TensorSpec, index: usize, seed: u64) -> Vec<f32> {
        match self {
            Model::Gpt2(c) => gpt2::init_values(c, spec, index, seed),
            Model::Llama(_) => llama::init_values(spec, index, seed),
        }
    }

    /// Device bytes of one block's activations, for the plan.
    pub fn block_activation_bytes(&self, batch: usize, seq_len: usize) -> u64 {
        match self {
            Model::Gpt2(c) => BlockActivations::<()>::bytes(c, batch, seq_len),
            Model::Llama(c) => llama::BlockActivations::<()>::bytes(c, batch, seq_len),
        }
    }
    /// Device bytes of the head's activations and the backward scratch, besides the loss's buffers
    /// ([`LossActs::tensor_lens`]), for the plan.
    pub fn head_activation_bytes(&self, batch: usize, seq_len: usize) -> u64 {
        match self {
            Model::Gpt2(c) => HeadActivations::<()>::bytes(c, batch, seq_len),
            Model::Llama(c) => llama::HeadActivations::<()>::bytes(c, batch, seq_len),
        }
    }

    pub fn block_acts<D: Backend>(&self, dev: &D, batch: usize, seq_len: usize) -> Result<BlockActs<D::Tensor>> {
        match self {
            Model::Gpt2(c) => Ok(BlockActs::Gpt2(BlockActivations::new(dev, c, batch, seq_len)?)),
            Model::Llama(c) => Ok(BlockActs::Llama(llama::BlockActivations::new(dev, c, batch, seq_len)?)),
        }
    }
    /// The head's activations for a resident head: every chunk's logits kept, default chunks.
    pub fn head_acts<D: Backend>(&self, dev: &D, batch: usize, seq_len: usize) -> Result<HeadActs<D::Tensor>> {
        self.head_acts_with(dev, batch, seq_len, self.vocab_chunks(DEFAULT_CHUNK_ROWS), true)
    }
    /// The head's activations with the loss in `chunks`, every chunk's logits kept or one chunk's.
    pub fn head_acts_with<D: Backend>(
        &self,
        dev: &D,
        batch: usize,
        seq_len: usize,
        chunks: VocabChunks,
        keep_logits: bool,
    ) -> Result<HeadActs<D::Tensor>> {
        match self {
            Model::Gpt2(c) => Ok(HeadActs::Gpt2(HeadActivations::new(dev, c, batch, seq_len, chunks, keep_logits)?)),
            Model::Llama(c) => Ok(HeadActs::Llama(llama::HeadActivations::new(dev, c, batch, seq_len, chunks, keep_logits)?)),
        }
    }

    /// The vocabulary cut into chunks of `rows_per_chunk` ids.
    pub fn vocab_chunks(&self, rows_per_chunk: usize) -> VocabChunks {
        VocabChunks::new(self.vocab_size(), rows_per_chunk)
    }

    /// The head group's (V, C) matrices, as indices into its table: (the token embedding, the output
    /// projection) — the same index when the two are tied.
    pub fn vocab_tensors(&self) -> (usize, usize) {
        let (embedding, tied) = match self {
            Model::Gpt2(c) => ("transformer.wte.weight", c.tie_word_embeddings),
            Model::Llama(c) => ("model.embed_tokens.weight", c.tie_word_embeddings),
        };
        let specs = self.head_specs();
        let at = |name: &str| specs.iter().position(|t| t.name == name).unwrap_or_else(|| panic!("the head table names {name}"));
        let embedding = at(embedding);
        (embedding, if tied { embedding } else { at("lm_head.weight") })
    }

    /// The loss's buffers inside the head's activations.
    pub fn loss_acts<'t, T>(&self, acts: &'t HeadActs<T>) -> &'t LossActs<T> {
        match acts {
            HeadActs::Gpt2(a) => &a.loss,
            HeadActs::Llama(a) => &a.loss,
        }
    }

    /// The final norm of the last block's output `x`: the input of the vocabulary projection
    /// ([`Model::final_hidden`]).
    pub fn final_norm_forward<D: Backend>(&self, dev: &D, head: &[D::Tensor], acts: &HeadActs<D::Tensor>, x: &D::Tensor) {
        match (self, acts) {
            (Model::Gpt2(c), HeadActs::Gpt2(a)) => gpt2::final_norm_forward(dev, c, &gpt2::head_view(c, head), a, x),
            (Model::Llama(c), HeadActs::Llama(a)) => llama::final_norm_forward(dev, c, head, a, x),
            _ => unreachable!("activations of another family"),
        }
    }
    /// Backward of [`Model::final_norm_forward`] from [`Model::final_hidden_grad`]: adds into the norm's
    /// gradients and leaves d(x) in the head's residual gradient.
    pub fn final_norm_backward<D: Backend>(
        &self,
        dev: &D,
        head: &[D::Tensor],
        grads: &[D::Tensor],
        acts: &HeadActs<D::Tensor>,
        x: &D::Tensor,
    ) {
        match (self, acts) {
            (Model::Gpt2(c), HeadActs::Gpt2(a)) => {
                gpt2::final_norm_backward(dev, c, &gpt2::head_view(c, head), &gpt2::head_view(c, grads), a, x)
            }
            (Model::Llama(c), HeadActs::Llama(a)) => llama::final_norm_backward(dev, c, head, grads, a, x),
            _ => unreachable!("activations of another family"),
        }
    }
    /// Where the vocabulary projection's backward leaves d(final hidden) (BT, C).
    pub fn final_hidden_grad<'t, T>(&self, acts: &'t HeadActs<T>) -> &'t T {
        match acts {
            HeadActs::Gpt2(a) => a.ln_f_grad(),
            HeadActs::Llama(a) => a.ln_f_grad(),
        }
    }

    /// [`Model::embed_forward`] from the token rows `rows` (BT, C) the caller gathered from the
    /// embedding (row i is token i's), with `positions` the ids 0..BT: the same bits, without the
    /// embedding on the device.
    #[allow(clippy::too_many_arguments)]
    pub fn embed_rows_forward<D: Backend>(
        &self,
        dev: &D,
        x: &D::Tensor,
        rows: &D::Tensor,
        head: &[D::Tensor],
        acts: &HeadActs<D::Tensor>,
        positions: &D::Tokens,
        seq_len: usize,
        dropout: Option<&DropoutKeys>,
    ) {
        match (self, acts) {
            (Model::Gpt2(c), HeadActs::Gpt2(a)) => {
                gpt2::embed_rows_forward(dev, c, x, rows, &gpt2::head_view(c, head), a, positions, seq_len, dropout)
            }
            (Model::Llama(c), HeadActs::Llama(a)) => llama::embed_rows_forward(dev, c, x, rows, a, positions, seq_len),
            _ => unreachable!("activations of another family"),
        }
    }
    /// Backward of [`Model::embed_rows_forward`]: the other embeddings' gradients added into `grads`;
    /// returns the tensor holding d(rows) (BT, C), for the caller to add into the token rows.
    pub fn embed_rows_backward<'t, D: Backend>(
        &self,
        dev: &D,
        grads: &[D::Tensor],
        acts: &'t HeadActs<D::Tensor>,
        positions: &D::Tokens,
        dropout: Option<&DropoutKeys>,
    ) -> &'t D::Tensor {
        match (self, acts) {
            (Model::Gpt2(c), HeadActs::Gpt2(a)) => gpt2::embed_rows_backward(dev, c, &gpt2::head_view(c, grads), a, positions, dropout),
            (Model::Llama(_), HeadActs::Llama(a)) => llama::embed_rows_backward(a),
            _ => unreachable!("activations of another family"),
        }
    }

    /// x (B, T, C): the input of block 0, from the head group's embeddings.
    #[allow(clippy::too_many_arguments, reason = "the families' embedding forwards take these, one for one")]
    pub fn embed_forward<D: Backend>(
        &self,
        dev: &D,
        x: &D::Tensor,
        head: &[D::Tensor],
        acts: &HeadActs<D::Tensor>,
        inputs: &D::Tokens,
        seq_len: usize,
        dropout: Option<&DropoutKeys>,
    ) {
        match (self, acts) {
            (Model::Gpt2(c), HeadActs::Gpt2(a)) => gpt2::embed_forward(dev, c, x, &gpt2::head_view(c, head), a, inputs, seq_len, dropout),
            (Model::Llama(c), HeadActs::Llama(a)) => llama::embed_forward(dev, c, x, head, a, inputs, seq_len),
            _ => unreachable!("activations of another family"),
        }
    }

    /// Block `l` (its group's tensors in `block`) from `input` to `output`, keeping what backward needs;
    /// `dropout` is the micro-batch's in training ([`Model::dropout_keys`]), `None` in evaluation.
    #[allow(clippy::too_many_arguments)]
    pub fn block_forward<D: Backend>(
        &self,
        dev: &D,
        l: usize,
        block: &[D::Tensor],
        acts: &BlockActs<D::Tensor>,
        input: &D::Tensor,
        output: &D::Tensor,
        batch: usize,
        seq_len: usize,
        dropout: Option<&DropoutKeys>,
    ) {
        match (self, acts) {
            (Model::Gpt2(c), BlockActs::Gpt2(a)) => {
                gpt2::block_forward(dev, c, l, &Block::view(block), a, input, output, batch, seq_len, dropout)
            }
            (Model::Llama(c), BlockActs::Llama(a)) => llama::block_forward(dev, c, block, a, input, output, batch, seq_len),
            _ => unreachable!("activations of another family"),
        }
    }

    /// The loss of the last block's output `x` against `targets`; with `loss_grad_scale`, the gradient
    /// of `scale * loss` is left for [`Model::head_backward`].
    pub fn head_forward<D: Backend>(
        &self,
        dev: &D,
        head: &[D::Tensor],
        acts: &HeadActs<D::Tensor>,
        x: &D::Tensor,
        targets: &D::Tokens,
        loss_grad_scale: Option<f32>,
    ) -> f32 {
        self.final_norm_forward(dev, head, acts, x);
        let (_, projection) = self.vocab_tensors();
        let (loss, h) = (self.loss_acts(acts), self.final_hidden(acts));
        vocab::resident_forward(dev, loss, h, &head[projection], targets, self.width(), loss_grad_scale)
    }

    /// Backward of [`Model::head_forward`] (which must have had a gradient scale): adds into the output
    /// projection's (the tied embedding's) and the final norm's gradients and leaves d(x) in the head's
    /// residual gradient.
    pub fn head_backward<D: Backend>(&self, dev: &D, head: &[D::Tensor], grads: &[D::Tensor], acts: &HeadActs<D::Tensor>, x: &D::Tensor) {
        let (_, projection) = self.vocab_tensors();
        let (loss, h, d_h) = (self.loss_acts(acts), self.final_hidden(acts), self.final_hidden_grad(acts));
        vocab::resident_backward(dev, loss, h, d_h, &head[projection], &grads[projection], self.width());
        self.final_norm_backward(dev, head, grads, acts, x);
    }

    /// Backward of [`Model::block_forward`]: the residual gradient in the head's scratch goes from the
    /// block's output to its input; block `l`'s gradients are added into `grads`.
    #[allow(clippy::too_many_arguments)]
    pub fn block_backward<D: Backend>(
        &self,
        dev: &D,
        l: usize,
        block: &[D::Tensor],
        grads: &[D::Tensor],
        acts: &BlockActs<D::Tensor>,
        input: &D::Tensor,
        head_acts: &HeadActs<D::Tensor>,
        dropout: Option<&DropoutKeys>,
    ) {
        match (self, acts, head_acts) {
            (Model::Gpt2(c), BlockActs::Gpt2(a), HeadActs::Gpt2(h)) => {
                gpt2::block_backward(dev, c, l, &Block::view(block), &Block::view(grads), a, input, h, dropout)
            }
            (Model::Llama(c), BlockActs::Llama(a), HeadActs::Llama(h)) => llama::block_backward(dev, c, block, grads, a, input, h),
            _ => unreachable!("activations of another family"),
        }
    }

    pub fn embed_backward<D: Backend>(
        &self,
        dev: &D,
        grads: &[D::Tensor],
        acts: &HeadActs<D::Tensor>,
        inputs: &D::Tokens,
        dropout: Option<&DropoutKeys>,
    ) {
        match (self, acts) {
            (Model::Gpt2(c), HeadActs::Gpt2(a)) => gpt2::embed_backward(dev, c, &gpt2::head_view(c, grads), a, inputs, dropout),
            (Model::Llama(c), HeadActs::Llama(a)) => llama::embed_backward(dev, c, grads, a, inputs),
            _ => unreachable!("activations of another family"),
        }
    }

    /// The model resident on `dev`, its weights from `weight(name, shape)`, as a function from a
    /// sequence of token ids to its logits (T x V): every group uploaded once, the layers run in turn.
    pub fn resident_logits<'a, D: Backend>(&'a self, dev: &'a D, weight: &WeightSource) -> Result<ResidentLogits<'a>> {
        let upload = |specs: Vec<TensorSpec>| -> Result<Vec<D::Tensor>> {
            specs
                .iter()
                .map(|t| {
                    let values = weight(&t.name, &t.shape)?;
                    let x = dev.alloc(t.len(), &t.name)?;
                    dev.write(&x, &values);
                    Ok(x)
                })
                .collect()
        };
        let head = upload(self.head_specs())?;
        let blocks = (0..self.n_layer()).map(|l| upload(self.block_specs(l))).collect::<Result<Vec<_>>>()?;
        Ok(Box::new(move |ids: &[u32]| {
            let t = ids.len();
            let tokens = dev.tokens(ids)?;
            let (block_acts, head_acts) = (self.block_acts(dev, 1, t)?, self.head_acts(dev, 1, t)?);
            let x = [dev.alloc(t * self.width(), "x A")?, dev.alloc(t * self.width(), "x B")?];
            self.embed_forward(dev, &x[0], &head, &head_acts, &tokens, t, None);
            for (l, block) in blocks.iter().enumerate() {
                self.block_forward(dev, l, block, &block_acts, &x[l % 2], &x[(l + 1) % 2], 1, t, None);
            }
            self.head_forward(dev, &head, &head_acts, &x[self.n_layer() % 2], &tokens, None);
            Ok(dev.read(self.logits(&head_acts)))
        }))
    }

    /// The output of the final norm in the last head forward (Hugging Face's last hidden state).
    pub fn final_hidden<'t, T>(&self, acts: &'t HeadActs<T>) -> &'t T {
        match acts {
            HeadActs::Gpt2(a) => a.ln_f(),
            HeadActs::Llama(a) => a.ln_f(),
        }
    }

    /// The logits of the last head forward (or their gradient, after one with a gradient scale).
    pub fn logits<'t, T>(&self, acts: &'t HeadActs<T>) -> &'t T {
        match acts {
            HeadActs::Gpt2(a) => a.logits(),
            HeadActs::Llama(a) => a.logits(),
        }
    }

    /// Refuses a sequence length the model cannot take.
    pub fn check_seq_len(&self, seq_len: usize) -> Result<()> {
        if seq_len > self.max_seq_len() {
            bail!("--seq-len {seq_len} is longer than the model's context of {} positions", self.max_seq_len());
        }
        Ok(())
    }
}
