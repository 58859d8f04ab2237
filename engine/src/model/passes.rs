//! [`Model`]'s passes, each a dispatch to its family's module: the activations a device holds, the
//! embedding, block and head forwards and backwards (tensors as flat lists in table order), the final
//! norm, and the whole model resident on one device as a function from ids to logits. What a model is
//! (its configuration, tables, sizes) is in `seam.rs`.

use anyhow::Result;

use super::TensorSpec;
use super::gpt2::{self, Block, BlockActivations, HeadActivations};
use super::llama;
use super::seam::{BlockActs, HeadActs, Model, ResidentLogits, WeightSource};
use super::vocab::{self, DEFAULT_CHUNK_ROWS, LossActs, VocabChunks};
use crate::device::Backend;
use crate::ops::dropout::DropoutKeys;

impl Model {
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
}
