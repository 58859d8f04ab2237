//! Generation with a KV cache, at the model seam: each family's step on the new rows of one sequence
//! (`gpt2.rs`, `llama.rs`) behind [`Decoder`] and [`StepActs`], so `crate::generate` streams blocks and
//! keeps the cache without naming a family. A step runs the same kernels as the family's
//! `block_forward`, on the new rows only; attention reads every earlier position from the layer's cache
//! (`Backend::attention_decode`).

mod gpt2;
mod llama;

use anyhow::{Result, bail};

use super::{Model, TensorSpec};
use crate::device::{Backend, DecodeDims};

/// The head group on the device, and what the family needs beside it to embed and to read logits.
pub enum Decoder<T> {
    Gpt2(gpt2::Decoder<T>),
    Llama(llama::Decoder<T>),
}

/// Scratch for a step of up to `rows` new rows (the family's own struct).
pub enum StepActs<T> {
    Gpt2(gpt2::Acts<T>),
    Llama(llama::Acts<T>),
}

/// Uploads a group's values (table order) as new device tensors, refusing values of the wrong size.
fn upload<D: Backend>(dev: &D, specs: &[TensorSpec], values: Vec<Vec<f32>>) -> Result<Vec<D::Tensor>> {
    specs
        .iter()
        .zip(values)
        .map(|(spec, v)| {
            if v.len() != spec.len() {
                bail!("{}: {} values given for shape {:?}", spec.name, v.len(), spec.shape);
            }
            let t = dev.alloc(v.len(), &spec.name)?;
            dev.write(&t, &v);
            Ok(t)
        })
        .collect()
}

impl Model {
    /// Floats of one layer's key/value cache for `capacity` positions.
    pub fn kv_cache_len(&self, capacity: usize) -> usize {
        match self {
            Model::Gpt2(c) => gpt2::cache_len(c, capacity),
            Model::Llama(c) => llama::cache_len(c, capacity),
        }
    }

    /// Device bytes of [`Model::step_acts`] for `rows` new rows.
    pub fn step_acts_bytes(&self, rows: usize) -> u64 {
        match self {
            Model::Gpt2(c) => gpt2::Acts::<()>::bytes(c, rows),
            Model::Llama(c) => llama::Acts::<()>::bytes(c, rows),
        }
    }

    pub fn step_acts<D: Backend>(&self, dev: &D, rows: usize) -> Result<StepActs<D::Tensor>> {
        match self {
            Model::Gpt2(c) => Ok(StepActs::Gpt2(gpt2::Acts::new(dev, c, rows)?)),
            Model::Llama(c) => Ok(StepActs::Llama(llama::Acts::new(dev, c, rows)?)),
        }
    }

    /// Block l's attention on `rows` new rows after `past` cached ones, in a cache of `capacity`.
    pub fn decode_dims(&self, l: usize, rows: usize, past: usize, capacity: usize) -> DecodeDims {
        match self {
            Model::Gpt2(c) => gpt2::decode_dims(c, l, rows, past, capacity),
            Model::Llama(c) => llama::decode_dims(c, rows, past, capacity),
        }
    }

    /// The decoder of this model, its head group's values given in table order.
    pub fn decoder<D: Backend>(&self, dev: &D, head: Vec<Vec<f32>>) -> Result<Decoder<D::Tensor>> {
        match self {
            Model::Gpt2(c) => Ok(Decoder::Gpt2(gpt2::Decoder::new(dev, c, head)?)),
            Model::Llama(c) => Ok(Decoder::Llama(llama::Decoder::new(dev, c, head)?)),
        }
    }
}

impl<T> Decoder<T> {
    /// x (n, C): the embedding of the n new tokens at positions first_position ...
    pub fn embed<D: Backend<Tensor = T>>(
        &self,
        dev: &D,
        acts: &StepActs<T>,
        x: &T,
        tokens: &D::Tokens,
        rows: usize,
        first_position: usize,
    ) {
        match (self, acts) {
            (Decoder::Gpt2(d), StepActs::Gpt2(a)) => d.embed(dev, a, x, tokens, rows, first_position),
            (Decoder::Llama(d), StepActs::Llama(a)) => d.embed(dev, a, x, tokens, rows),
            _ => unreachable!("activations of another family"),
        }
    }

    /// Block l (its group's tensors in `block`) on the new rows, from `input` to `output`; their keys
    /// and values join `cache` (layer l's) at rows dims.past ...
    #[allow(clippy::too_many_arguments)]
    pub fn block<D: Backend<Tensor = T>>(
        &self,
        dev: &D,
        l: usize,
        block: &[T],
        acts: &StepActs<T>,
        cache: &T,
        input: &T,
        output: &T,
        dims: DecodeDims,
    ) {
        match (self, acts) {
            (Decoder::Gpt2(d), StepActs::Gpt2(a)) => d.block(dev, l, block, a, cache, input, output, dims),
            (Decoder::Llama(d), StepActs::Llama(a)) => d.block(dev, block, a, cache, input, output, dims),
            _ => unreachable!("activations of another family"),
        }
    }

    /// The next-token logits (V) after the last of `rows` rows of the last block's output `x`.
    pub fn logits<D: Backend<Tensor = T>>(&self, dev: &D, acts: &StepActs<T>, x: &T, rows: usize) -> Vec<f32> {
        match (self, acts) {
            (Decoder::Gpt2(d), StepActs::Gpt2(a)) => d.logits(dev, a, x, rows),
            (Decoder::Llama(d), StepActs::Llama(a)) => d.logits(dev, a, x, rows),
            _ => unreachable!("activations of another family"),
        }
    }
}
