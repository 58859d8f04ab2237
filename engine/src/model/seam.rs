//! [`Model`]: the one type the engine outside `model/` sees. Each method is a dispatch to the family's
//! module; tensors cross the seam as flat lists in the family's table order (a parameter group), and
//! activations as the family's own structs behind [`BlockActs`] / [`HeadActs`].

use std::path::Path;

use anyhow::{Context, Result, bail};
use zerostream_checkpoints::{ArchConfig, Gpt2Config, HfModel, LlamaConfig};

use super::TensorSpec;
use super::gpt2::{self, Block, BlockActivations, HeadActivations};
use super::llama;
use crate::device::AttentionDims;
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

    /// Refuses, from the files' headers alone, weights this model cannot be read from: a tensor it needs
    /// that is not stored, or stored in another shape (`plan`, which reads no weights, would otherwise
    /// plan a model that cannot load).
    pub fn check_stored_shapes(&self, hf: &HfModel) -> Result<()> {
        for spec in self.checkpoint_specs() {
            let stored = hf.stored_shape(&spec.name)?;
            if stored != spec.shape.as_slice() {
                bail!(
                    "{}: tensor {} is stored with shape {stored:?}, but config.json makes it {:?}",
                    hf.dir.display(),
                    spec.name,
                    spec.shape
                );
            }
        }
        Ok(())
    }

    /// A warning naming the tensors `hf` stores that this model reads none of: weights config.json does
    /// not describe (a bias where it says none, a norm the family has no place for), which training
    /// would drop from the saved model as transformers would ignore them. Buffers a save carries
    /// besides the weights (GPT-2's attention masks, rotary frequencies) and a tied head's stored
    /// copy are not weights. None where every stored tensor is read.
    pub fn unused_tensors_warning(&self, hf: &HfModel) -> Option<String> {
        let read: std::collections::HashSet<&str> = self.checkpoint_specs().iter().filter_map(|s| hf.resolve(&s.name)).collect();
        let buffer = |name: &str| {
            [".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"].iter().any(|b| name.ends_with(b)) || name == "lm_head.weight"
        };
        let mut unused: Vec<&str> = hf.stored_names().filter(|n| !read.contains(n) && !buffer(n)).collect();
        if unused.is_empty() {
            return None;
        }
        unused.sort_unstable();
        let shown = unused.iter().take(5).copied().collect::<Vec<_>>().join(", ");
        let more = if unused.len() > 5 { format!(" and {} more", unused.len() - 5) } else { String::new() };
        Some(format!(
            "warning: {} holds {} config.json does not describe; they are left out of the model (and of any model saved \
             from it): {shown}{more}",
            hf.dir.display(),
            crate::words::counted(unused.len() as u64, "tensor"),
        ))
    }

    /// A preset by name, with random weights to come.
    pub fn preset(name: &str) -> Option<Self> {
        Gpt2Config::preset(name).map(Model::Gpt2).or_else(|| LlamaConfig::preset(name).map(Model::Llama))
    }
    pub const PRESETS: &'static str = "gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-3.2-1b, llama-3.2-3b, llama-3-8b";

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

    /// The same model with `n` blocks (everything else as it is): what `plan --measure` times to
    /// learn a block's and the head's cost on the device.
    pub fn with_layers(&self, n: usize) -> Model {
        match self {
            Model::Gpt2(c) => Model::Gpt2(Gpt2Config { n_layer: n, ..c.clone() }),
            Model::Llama(c) => Model::Llama(LlamaConfig { num_hidden_layers: n, ..c.clone() }),
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
            Model::Llama(c) => c.context(),
        }
    }

    /// The sliding window where it, not the position table, bounds the context (Mistral's, Qwen2's
    /// with `use_sliding_window`): each layer attends over its last W keys and values, computed from
    /// the whole history, so past W a recompute over the last W tokens is another model.
    pub fn sliding_window(&self) -> Option<usize> {
        match self {
            Model::Gpt2(_) => None,
            Model::Llama(c) => c.sliding_window.filter(|&w| w < c.max_position_embeddings),
        }
    }

    /// One line for people: family and shape.
    pub fn describe(&self) -> String {
        use crate::words::counted;
        match self {
            Model::Gpt2(c) => format!(
                "GPT-2, {}, {} channels, {}, vocab {}, context {}",
                counted(c.n_layer as u64, "layer"),
                c.n_embd,
                counted(c.n_head as u64, "head"),
                c.vocab_size,
                c.n_positions
            ),
            Model::Llama(c) => format!(
                "Llama ({}), {}, {} hidden, {} ({} key/value) of {}, MLP {}, vocab {}, context {}{}{}",
                c.model_type,
                counted(c.num_hidden_layers as u64, "layer"),
                c.hidden_size,
                counted(c.num_attention_heads as u64, "head"),
                c.num_key_value_heads,
                c.head_dim,
                c.intermediate_size,
                c.vocab_size,
                c.context(),
                match c.sliding_window {
                    Some(w) if w < c.max_position_embeddings =>
                        format!(" (its sliding window; {} positions embedded)", c.max_position_embeddings),
                    _ => String::new(),
                },
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

    /// Refuses a sequence length the model cannot take.
    pub fn check_seq_len(&self, seq_len: usize) -> Result<()> {
        if seq_len > self.max_seq_len() {
            let window = match self {
                Model::Llama(c) if c.context() < c.max_position_embeddings => {
                    ", its sliding window (longer sequences would need sliding-window attention, which is not implemented)"
                }
                _ => "",
            };
            bail!("--seq-len {seq_len} is longer than the model's context of {} positions{window}", self.max_seq_len());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stored tensors the config does not describe are named; buffers a save carries and the golden
    /// model's own weights are not.
    #[test]
    fn tensors_no_part_of_the_model_reads_are_named() {
        let golden = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gpt2-tiny/model"));
        let hf = HfModel::open(golden).unwrap();
        let model = Model::of_hf(&hf).unwrap();
        assert_eq!(model.unused_tensors_warning(&hf), None);
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(golden.join("config.json"), dir.path().join("config.json")).unwrap();
        let bytes = std::fs::read(golden.join("model.safetensors")).unwrap();
        let stored = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let extra = [0u8; 16];
        let view = |shape: Vec<usize>| safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape, &extra).unwrap();
        let mut tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = stored.tensors();
        tensors.push(("transformer.h.0.attn.q_norm.weight".into(), view(vec![4])));
        tensors.push(("transformer.h.1.attn.bias".into(), view(vec![1, 1, 2, 2])));
        safetensors::serialize_to_file(tensors, None, &dir.path().join("model.safetensors")).unwrap();
        let hf = HfModel::open(dir.path()).unwrap();
        let warning = model.unused_tensors_warning(&hf).expect("a warning");
        assert!(
            warning.contains("holds 1 tensor config.json does not describe") && warning.ends_with("transformer.h.0.attn.q_norm.weight"),
            "{warning}"
        );
    }
}
