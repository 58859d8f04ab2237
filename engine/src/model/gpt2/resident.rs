//! GPT-2 resident on one device, every block's parameters, gradients and activations kept: the model
//! the golden tests and sampling run whole. It calls the same block and head functions as the streaming
//! trainer.

use anyhow::{Result, bail};
use zerostream_checkpoints::HfModel;

use super::{
    Block, BlockActivations, Gpt2Config, HeadActivations, attention_dims, block_backward, block_forward, embed_backward, embed_forward,
    head_backward, head_forward, head_view, parameter_specs,
};
use crate::device::Backend;
use crate::model::vocab::{DEFAULT_CHUNK_ROWS, VocabChunks};
use crate::ops::dropout::DropoutKeys;

/// Every parameter of the model (or a gradient of the same structure).
pub struct Params<T> {
    /// The head group in table order ([`super::head_specs`]); [`head_view`] names its tensors.
    pub head: Vec<T>,
    pub blocks: Vec<Block<T>>,
}

impl<T> Params<T> {
    /// Builds every tensor with `make(name, shape)`, in the order of [`parameter_specs`].
    pub fn build(cfg: &Gpt2Config, mut make: impl FnMut(&str, &[usize]) -> Result<T>) -> Result<Self> {
        let mut made = parameter_specs(cfg).iter().map(|t| make(&t.name, &t.shape)).collect::<Result<Vec<T>>>()?.into_iter();
        let (wte, wpe) = (made.next().expect("wte"), made.next().expect("wpe"));
        let per_block = Block::<()>::specs(cfg, "").len();
        let blocks = (0..cfg.n_layer).map(|_| Block::from_tensors(made.by_ref().take(per_block).collect())).collect();
        let rest: Vec<T> = made.collect();
        let mut head = vec![wte, wpe];
        head.extend(rest);
        Ok(Params { head, blocks })
    }

    /// Every tensor, in the order of [`parameter_specs`].
    pub fn tensors(&self) -> Vec<&T> {
        let head: Vec<&T> = self.head.iter().collect();
        let mut all = head[..2].to_vec();
        for b in &self.blocks {
            all.extend(b.tensors());
        }
        all.extend_from_slice(&head[2..]);
        all
    }
}

/// Activations of a whole forward pass with every block kept.
struct Activations<T> {
    /// residual[l] is the input of block l, residual[L] the output of the last block: (L+1) x (BT, C).
    residual: Vec<T>,
    blocks: Vec<BlockActivations<T>>,
    head: HeadActivations<T>,
}

/// GPT-2 resident on one device: its parameters, gradients and the activations of the last forward pass.
/// (The streaming trainer in [`crate::train`] runs the same block functions with blocks streamed in.)
pub struct Gpt2<D: Backend> {
    pub config: Gpt2Config,
    pub params: Params<D::Tensor>,
    pub grads: Params<D::Tensor>,
    /// The dropout of the next forward and backward (None: none, as in evaluation).
    pub dropout: Option<DropoutKeys>,
    acts: Option<Activations<D::Tensor>>,
}

impl<D: Backend> Gpt2<D> {
    /// Uploads every parameter from a Hugging Face directory.
    pub fn from_hf(dev: &D, model: &HfModel) -> Result<Self> {
        let zerostream_checkpoints::ArchConfig::Gpt2(config) = &model.config else {
            bail!("{}: not a GPT-2 model", model.dir.display());
        };
        Self::from_fn(dev, config, |name, shape| model.tensor(name, shape))
    }

    /// Builds the model with `values(name, shape)` giving each parameter's f32 data.
    pub fn from_fn(dev: &D, cfg: &Gpt2Config, mut values: impl FnMut(&str, &[usize]) -> Result<Vec<f32>>) -> Result<Self> {
        cfg.validate()?;
        let params = Params::build(cfg, |name, shape| {
            let data = values(name, shape)?;
            let t = dev.alloc(data.len(), name)?;
            dev.write(&t, &data);
            Ok(t)
        })?;
        let grads = Params::build(cfg, |name, shape| dev.alloc(shape.iter().product(), &format!("grad {name}")))?;
        Ok(Gpt2 { config: cfg.clone(), params, grads, dropout: None, acts: None })
    }

    pub fn zero_grads(&self, dev: &D) {
        for g in self.grads.tensors() {
            dev.fill(g, 0.0);
        }
    }

    /// Forward pass over one micro-batch; returns the mean cross-entropy over its B*T tokens.
    /// With `loss_grad_scale = Some(s)` the gradient of `s * mean loss` is left in the logits buffer,
    /// ready for [`Self::backward`] (s = 1/M for a step of M micro-batches).
    pub fn forward(
        &mut self,
        dev: &D,
        inputs: &D::Tokens,
        targets: &D::Tokens,
        batch: usize,
        seq_len: usize,
        loss_grad_scale: Option<f32>,
    ) -> Result<f32> {
        let cfg = &self.config;
        if seq_len > cfg.n_positions {
            bail!("sequence length {seq_len} is longer than the model's n_positions {}", cfg.n_positions);
        }
        dev.check_attention(attention_dims(cfg, batch, seq_len))?;
        if self.acts.as_ref().is_none_or(|a| a.head.batch != batch || a.head.seq_len != seq_len) {
            self.acts = None; // free the old ones before allocating
            let bt = batch * seq_len;
            self.acts = Some(Activations {
                residual: (0..=cfg.n_layer).map(|l| dev.alloc(bt * cfg.n_embd, &format!("residual.{l}"))).collect::<Result<_>>()?,
                blocks: (0..cfg.n_layer).map(|_| BlockActivations::new(dev, cfg, batch, seq_len)).collect::<Result<_>>()?,
                head: HeadActivations::new(dev, cfg, batch, seq_len, VocabChunks::new(cfg.vocab_size, DEFAULT_CHUNK_ROWS), true)?,
            });
        }
        let acts = self.acts.as_ref().unwrap();
        let (p, dropout) = (&self.params, self.dropout.as_ref());
        embed_forward(dev, cfg, &acts.residual[0], &head_view(cfg, &p.head), &acts.head, inputs, seq_len, dropout);
        for (l, (w, a)) in p.blocks.iter().zip(&acts.blocks).enumerate() {
            block_forward(dev, cfg, l, &w.refs(), a, &acts.residual[l], &acts.residual[l + 1], batch, seq_len, dropout);
        }
        Ok(head_forward(dev, cfg, &head_view(cfg, &p.head), &acts.head, &acts.residual[cfg.n_layer], targets, loss_grad_scale))
    }

    /// Backward pass of the last forward (which must have had a gradient scale); adds into `grads`.
    pub fn backward(&mut self, dev: &D, inputs: &D::Tokens) -> Result<()> {
        let Some(acts) = self.acts.as_ref() else { bail!("backward called before forward") };
        let (cfg, p, g, dropout) = (&self.config, &self.params, &self.grads, self.dropout.as_ref());
        head_backward(dev, cfg, &head_view(cfg, &p.head), &head_view(cfg, &g.head), &acts.head, &acts.residual[cfg.n_layer]);
        for l in (0..cfg.n_layer).rev() {
            block_backward(dev, cfg, l, &p.blocks[l].refs(), &g.blocks[l].refs(), &acts.blocks[l], &acts.residual[l], &acts.head, dropout);
        }
        embed_backward(dev, cfg, &head_view(cfg, &g.head), &acts.head, inputs, dropout);
        Ok(())
    }

    /// The inputs of each block and the output of ln_f, as Hugging Face's `hidden_states` (after forward).
    pub fn hidden_states(&self) -> Vec<&D::Tensor> {
        let acts = self.acts.as_ref().expect("hidden_states after forward");
        let mut states: Vec<&D::Tensor> = acts.residual[..self.config.n_layer].iter().collect();
        states.push(&acts.head.ln_f);
        states
    }

    /// The logits of the last forward (or their gradient, if it had a gradient scale).
    pub fn logits(&self) -> Option<&D::Tensor> {
        self.acts.as_ref().map(|a| a.head.logits())
    }
}
