//! GPT-2's hyper-parameters as Hugging Face's `config.json` names them, and the checks that keep a
//! config the engine would train differently from what it asks (an option the engine does not
//! implement, another model family) from being trained at all.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde_json::{Map, Value};

/// The `activation_function`s the engine implements: the tanh GELU under both of its names, the exact
/// (erf) GELU, and ReLU.
pub const ACTIVATIONS: [&str; 4] = ["gelu_new", "gelu_pytorch_tanh", "gelu", "relu"];

/// Largest vocabulary, context, width or MLP width accepted (2^24). Far above any GPT-2, and low
/// enough that products of them (parameter counts, activation sizes) cannot overflow.
const MAX_DIM: usize = 1 << 24;
/// Most transformer blocks accepted.
const MAX_LAYERS: usize = 1 << 16;
/// Most parameters accepted (2^40, about 1.1 trillion).
const MAX_PARAMETERS: u128 = 1 << 40;

/// The GPT-2 hyper-parameters zerostream uses, as named in Hugging Face's `config.json`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Gpt2Config {
    /// V: vocabulary size (rows of wte).
    pub vocab_size: usize,
    /// P: maximum sequence length (rows of wpe).
    pub n_positions: usize,
    /// C: channels.
    pub n_embd: usize,
    /// L: transformer blocks.
    pub n_layer: usize,
    /// NH: attention heads; C must be a multiple of it.
    pub n_head: usize,
    /// Width of the MLP's hidden layer; `null` in config.json means 4C.
    #[serde(default)]
    pub n_inner: Option<usize>,
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    #[serde(default = "default_activation")]
    pub activation_function: String,
    /// Dropout probabilities (0 when absent; the published `gpt2` checkpoints ask for 0.1), applied in
    /// training only; `zerostream train --dropout P` overrides all three.
    #[serde(default)]
    pub resid_pdrop: f64,
    #[serde(default)]
    pub embd_pdrop: f64,
    #[serde(default)]
    pub attn_pdrop: f64,
    /// Whether attention scores are divided by sqrt(head size) (transformers' default; false leaves
    /// them unscaled).
    #[serde(default = "yes")]
    pub scale_attn_weights: bool,
    /// Whether block l's attention scores are further divided by l + 1 (a stabiliser for deep models).
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    /// With this set, transformers scales q before the q k product instead of after it (equal in exact
    /// arithmetic) and computes the softmax in float32 whatever the model's dtype. The engine's attention
    /// is float32 throughout, so both values compute the same: it is only kept to be written back.
    #[serde(default)]
    pub reorder_and_upcast_attn: bool,
    /// Whether the output layer is wte (tied) or a separate `lm_head.weight` (V, C).
    #[serde(default = "yes")]
    pub tie_word_embeddings: bool,
}

fn yes() -> bool {
    true
}

fn default_eps() -> f64 {
    1e-5
}
fn default_activation() -> String {
    "gelu_new".into()
}

impl Gpt2Config {
    /// The published GPT-2 sizes by name (gpt2, gpt2-medium, gpt2-large, gpt2-xl), without dropout.
    pub fn preset(name: &str) -> Option<Self> {
        let (n_embd, n_layer, n_head) = match name {
            "gpt2" => (768, 12, 12),
            "gpt2-medium" => (1024, 24, 16),
            "gpt2-large" => (1280, 36, 20),
            "gpt2-xl" => (1600, 48, 25),
            _ => return None,
        };
        Some(Gpt2Config {
            vocab_size: 50257,
            n_positions: 1024,
            n_embd,
            n_layer,
            n_head,
            n_inner: None,
            layer_norm_epsilon: 1e-5,
            activation_function: "gelu_new".into(),
            resid_pdrop: 0.0,
            embd_pdrop: 0.0,
            attn_pdrop: 0.0,
            scale_attn_weights: true,
            scale_attn_by_inverse_layer_idx: false,
            reorder_and_upcast_attn: false,
            tie_word_embeddings: true,
        })
    }

    /// config.json as Hugging Face's `GPT2Config` writes it (the fields transformers needs to load it).
    pub fn to_hf_json(&self) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": self.vocab_size,
            "n_positions": self.n_positions,
            "n_ctx": self.n_positions,
            "n_embd": self.n_embd,
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_inner": self.n_inner,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "activation_function": self.activation_function,
            "resid_pdrop": self.resid_pdrop,
            "embd_pdrop": self.embd_pdrop,
            "attn_pdrop": self.attn_pdrop,
            "scale_attn_weights": self.scale_attn_weights,
            "scale_attn_by_inverse_layer_idx": self.scale_attn_by_inverse_layer_idx,
            "reorder_and_upcast_attn": self.reorder_and_upcast_attn,
            "tie_word_embeddings": self.tie_word_embeddings,
        })
    }

    pub fn hidden(&self) -> usize {
        self.n_inner.unwrap_or(4 * self.n_embd)
    }

    /// The non-zero dropout probabilities, described (`"resid_pdrop = 0.1, attn_pdrop = 0.1"`); `None`
    /// when the config asks for no dropout.
    pub fn dropout_requested(&self) -> Option<String> {
        let set: Vec<String> = [("resid_pdrop", self.resid_pdrop), ("embd_pdrop", self.embd_pdrop), ("attn_pdrop", self.attn_pdrop)]
            .iter()
            .filter(|(_, p)| *p != 0.0)
            .map(|(k, p)| format!("{k} = {p}"))
            .collect();
        (!set.is_empty()).then(|| set.join(", "))
    }

    /// Checks what the model code relies on.
    pub fn validate(&self) -> Result<()> {
        let sizes = [
            ("n_embd", self.n_embd),
            ("n_head", self.n_head),
            ("n_layer", self.n_layer),
            ("vocab_size", self.vocab_size),
            ("n_positions", self.n_positions),
        ];
        let zero: Vec<&str> = sizes.iter().filter(|(_, v)| *v == 0).map(|(k, _)| *k).collect();
        if !zero.is_empty() {
            bail!("config: {} = 0; n_embd, n_head, n_layer, vocab_size and n_positions must all be positive", zero.join(" = 0, "));
        }
        for (key, value) in [("vocab_size", self.vocab_size), ("n_positions", self.n_positions), ("n_embd", self.n_embd)] {
            if value > MAX_DIM {
                bail!("config: {key} = {value} is above the {MAX_DIM} zerostream supports");
            }
        }
        if let Some(inner) = self.n_inner
            && (inner == 0 || inner > MAX_DIM)
        {
            bail!("config: n_inner = {inner} must be positive and at most {MAX_DIM} (or null for 4 * n_embd)");
        }
        if self.n_layer > MAX_LAYERS {
            bail!("config: n_layer = {} is above the {MAX_LAYERS} zerostream supports", self.n_layer);
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            bail!("config: n_embd ({}) must be a multiple of n_head ({})", self.n_embd, self.n_head);
        }
        if self.n_embd / self.n_head > 256 {
            bail!("config: head size n_embd/n_head = {} is above the 256 the attention kernels support", self.n_embd / self.n_head);
        }
        let (v, p, c, h, l) =
            (self.vocab_size as u128, self.n_positions as u128, self.n_embd as u128, self.hidden() as u128, self.n_layer as u128);
        // wte, wpe, final LayerNorm, an untied lm_head; per block: 2 LayerNorms, qkv, attention
        // projection, MLP.
        let lm_head = if self.tie_word_embeddings { 0 } else { v * c };
        let parameters = (v + p + 2) * c + lm_head + l * (4 * c + 3 * c * c + 3 * c + c * c + c + 2 * c * h + h + c);
        if parameters > MAX_PARAMETERS {
            bail!("config: {parameters} parameters is above the {MAX_PARAMETERS} zerostream supports");
        }
        if !self.layer_norm_epsilon.is_finite() || self.layer_norm_epsilon <= 0.0 {
            bail!("config: layer_norm_epsilon = {} must be a positive number", self.layer_norm_epsilon);
        }
        if !ACTIVATIONS.contains(&self.activation_function.as_str()) {
            bail!("config: activation_function {:?} is not supported (expected one of {ACTIVATIONS:?})", self.activation_function);
        }
        for (key, p) in [("resid_pdrop", self.resid_pdrop), ("embd_pdrop", self.embd_pdrop), ("attn_pdrop", self.attn_pdrop)] {
            if !(0.0..1.0).contains(&p) {
                bail!("config: {key} = {p} is not a dropout probability (expected 0 <= p < 1)");
            }
        }
        Ok(())
    }

    /// Reads a Hugging Face `config.json`, refusing (by key) options the engine does not implement
    /// and model families other than GPT-2, then [`Gpt2Config::validate`]s it.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = crate::io::read_regular_text(path, "config")?;
        let value: Value = serde_json::from_str(&text).with_context(|| format!("config {}: not valid JSON", path.display()))?;
        let Some(object) = value.as_object() else {
            bail!("config {}: expected a JSON object (Hugging Face's config.json), found {}", path.display(), kind(&value));
        };
        refuse_unsupported(object).map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))?;
        let config: Gpt2Config = serde_path_to_error::deserialize(value)
            .map_err(|e| anyhow::anyhow!("config {}: not a GPT-2 config: {}: {}", path.display(), e.path(), e.inner()))?;
        config.validate().with_context(|| format!("config {}", path.display()))?;
        Ok(config)
    }
}

/// Fails naming the first key of `config` that asks for something the engine does not do: another
/// model family, or a GPT-2 option with a non-default value that would change what is computed.
fn refuse_unsupported(config: &Map<String, Value>) -> std::result::Result<(), String> {
    if let Some(model_type) = config.get("model_type") {
        match model_type.as_str() {
            Some("gpt2") => {}
            Some(other) => {
                return Err(format!(
                    "model_type {other:?}: this model family is not supported yet (zerostream reads gpt2, llama, mistral and qwen2)"
                ));
            }
            None => return Err(format!("model_type is {}, expected the string \"gpt2\"", kind(model_type))),
        }
    }
    // Options the engine implements either way: only a value that is not a boolean is refused.
    for key in ["scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "tie_word_embeddings"] {
        if let Some(value) = config.get(key)
            && !value.is_boolean()
        {
            return Err(format!("{key} is {}, expected true or false", kind(value)));
        }
    }
    // (key, the value the engine implements, what the other value would ask for)
    let options = [("add_cross_attention", false, "cross-attention to an encoder")];
    for (key, supported, meaning) in options {
        match config.get(key) {
            None => {}
            Some(Value::Bool(b)) if *b == supported => {}
            Some(Value::Bool(_)) => {
                return Err(format!(
                    "{key} = {} asks for {meaning}, which zerostream does not implement (supported: {key} = {supported})",
                    !supported
                ));
            }
            Some(other) => return Err(format!("{key} is {}, expected true or false (supported: {supported})", kind(other))),
        }
    }
    if let Some(f) = config.get("activation_function")
        && !f.as_str().is_some_and(|f| ACTIVATIONS.contains(&f))
    {
        return Err(format!("activation_function {f} is not supported (supported: {ACTIVATIONS:?})"));
    }
    Ok(())
}

/// A JSON value's type, for errors.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
