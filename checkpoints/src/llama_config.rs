//! Llama's hyper-parameters as Hugging Face's `config.json` names them (`LlamaForCausalLM`, and the
//! Mistral and Qwen2 configs that need nothing beyond it), with both spellings of the RoPE settings:
//! transformers 5's `rope_parameters` object and the older top-level `rope_theta` / `rope_scaling`.
//! Every option the engine does not implement is refused by name.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value};

/// Llama-3's frequency-dependent RoPE scaling (`rope_type: "llama3"`).
#[derive(Clone, Debug, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// The Llama hyper-parameters zerostream uses.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// `llama`, `mistral` or `qwen2`: the config's family (all computed as Llama).
    pub model_type: String,
    /// V
    pub vocab_size: usize,
    /// C: the residual stream's width.
    pub hidden_size: usize,
    /// F: the SwiGLU MLP's width.
    pub intermediate_size: usize,
    /// L
    pub num_hidden_layers: usize,
    /// H: query heads.
    pub num_attention_heads: usize,
    /// KV: key/value heads (H for multi-head attention, 1 for multi-query); H is a multiple of it.
    pub num_key_value_heads: usize,
    /// D: per-head width (C / H unless the config says otherwise).
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// Biases on q, k, v and o (`attention_bias`); Qwen2 has them on q, k, v only.
    pub attention_bias: bool,
    /// Biases on q, k, v alone (Qwen2).
    pub qkv_bias: bool,
    pub mlp_bias: bool,
    pub tie_word_embeddings: bool,
    /// W, sliding-window attention's span (`sliding_window`; Qwen2's only with `use_sliding_window`):
    /// each query sees its last W positions. Computed as full causal attention, which it equals on
    /// sequences of at most W tokens, so the model takes at most W ([`LlamaConfig::context`]).
    pub sliding_window: Option<usize>,
}

/// RoPE's base frequency and scaling: transformers 5 keeps them in `rope_parameters`, older configs
/// at the top level (`rope_theta`, `rope_scaling`), and configs written for both hold both, which
/// must then agree (transformers 4 reads the one, 5 the other).
fn rope_settings(map: &Map<String, Value>) -> Result<(f64, Option<Llama3RopeScaling>)> {
    let mut legacy = map.get("rope_scaling").and_then(Value::as_object).cloned().unwrap_or_default();
    if let Some(theta) = map.get("rope_theta") {
        legacy.insert("rope_theta".into(), theta.clone());
    }
    let Some(Value::Object(parameters)) = map.get("rope_parameters") else { return rope_of(&legacy) };
    let rope = rope_of(parameters)?;
    if !legacy.is_empty() {
        let top = rope_of(&legacy).context("rope_theta / rope_scaling")?;
        if top != rope {
            bail!(
                "rope_parameters ({}) and the top-level rope_theta / rope_scaling ({}) disagree: transformers 5 reads the one and 4 the \
                 other; make them agree or remove one",
                Value::Object(parameters.clone()),
                Value::Object(legacy)
            );
        }
    }
    Ok(rope)
}

/// The base frequency (10000 where not given) and scaling of one spelling of the RoPE settings.
fn rope_of(rope: &Map<String, Value>) -> Result<(f64, Option<Llama3RopeScaling>)> {
    let rope_type = rope.get("rope_type").or_else(|| rope.get("type")).and_then(Value::as_str).unwrap_or("default");
    let scaling = match rope_type {
        "default" => None,
        "llama3" => Some(Llama3RopeScaling {
            factor: f64_of(rope, "factor")?.context("rope llama3: factor is missing")?,
            low_freq_factor: f64_of(rope, "low_freq_factor")?.context("rope llama3: low_freq_factor is missing")?,
            high_freq_factor: f64_of(rope, "high_freq_factor")?.context("rope llama3: high_freq_factor is missing")?,
            original_max_position_embeddings: usize_of(rope, "original_max_position_embeddings")?
                .context("rope llama3: original_max_position_embeddings is missing")?,
        }),
        other => bail!("rope_type {other:?} is not supported (default or llama3)"),
    };
    Ok((f64_of(rope, "rope_theta")?.unwrap_or(10_000.0), scaling))
}

fn usize_of(map: &Map<String, Value>, key: &str) -> Result<Option<usize>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(|x| Some(x as usize)).with_context(|| format!("{key}: expected a whole number, got {v}")),
    }
}

fn f64_of(map: &Map<String, Value>, key: &str) -> Result<Option<f64>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).with_context(|| format!("{key}: expected a number, got {v}")),
    }
}

fn bool_of(map: &Map<String, Value>, key: &str) -> Result<Option<bool>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_bool().map(Some).with_context(|| format!("{key}: expected true or false, got {v}")),
    }
}

/// The settings of a Llama-family config this engine does not implement, each refused by name: an
/// activation other than SiLU, mixture-of-experts, layers of other than full attention, attention
/// dropout, tensor-parallel pretraining slices. (A sliding window is taken as a limit on the context.)
fn refuse_unsupported(map: &Map<String, Value>) -> Result<()> {
    if let Some(act) = map.get("hidden_act")
        && act.as_str() != Some("silu")
    {
        bail!("hidden_act {act} is not supported (expected \"silu\": the SwiGLU MLP)");
    }
    for key in ["num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size"] {
        if map.get(key).is_some_and(|v| !v.is_null() && v.as_u64() != Some(0)) {
            bail!("{key}: mixture-of-experts models are not supported");
        }
    }
    if let Some(types) = map.get("layer_types").and_then(Value::as_array)
        && let Some(other) = types.iter().find(|t| t.as_str() != Some("full_attention"))
    {
        bail!("layer_types: {other} layers are not supported (every layer attends to all earlier tokens: full_attention)");
    }
    for key in ["attention_dropout"] {
        if f64_of(map, key)?.is_some_and(|p| p != 0.0) {
            bail!("{key}: dropout is not implemented (expected 0)");
        }
    }
    if usize_of(map, "pretraining_tp")?.is_some_and(|tp| tp != 1) {
        bail!("pretraining_tp: only 1 is supported");
    }
    Ok(())
}

fn required(map: &Map<String, Value>, key: &str) -> Result<usize> {
    usize_of(map, key)?.with_context(|| format!("{key} is missing"))
}

impl LlamaConfig {
    /// Llama shapes by name: `llama-3.2-1b` (16 x 2048, GQA 32/8, vocabulary 128256, tied head),
    /// `llama-3.2-3b` (28 x 3072, GQA 24/8 of 128, tied head) and `llama-3-8b` (32 x 4096, GQA 32/8,
    /// untied), all with Llama-3's RoPE (theta 500000; 3.2's scaling).
    pub fn preset(name: &str) -> Option<Self> {
        let base = LlamaConfig {
            model_type: "llama".into(),
            vocab_size: 128_256,
            hidden_size: 2048,
            intermediate_size: 8192,
            num_hidden_layers: 16,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: 64,
            max_position_embeddings: 131_072,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: Some(Llama3RopeScaling {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            }),
            attention_bias: false,
            qkv_bias: false,
            mlp_bias: false,
            tie_word_embeddings: true,
            sliding_window: None,
        };
        match name {
            "llama-3.2-1b" => Some(base),
            "llama-3.2-3b" => {
                Some(LlamaConfig { hidden_size: 3072, num_hidden_layers: 28, num_attention_heads: 24, head_dim: 128, ..base })
            }
            "llama-3-8b" => Some(LlamaConfig {
                hidden_size: 4096,
                intermediate_size: 14336,
                num_hidden_layers: 32,
                head_dim: 128,
                max_position_embeddings: 8192,
                rope_scaling: None,
                tie_word_embeddings: false,
                ..base
            }),
            _ => None,
        }
    }

    /// Parses a config.json object (`model_type` llama, mistral or qwen2), refusing by key whatever the
    /// engine does not implement.
    pub fn from_json(map: &Map<String, Value>) -> Result<Self> {
        let model_type = map.get("model_type").and_then(Value::as_str).unwrap_or("llama").to_string();
        if !matches!(model_type.as_str(), "llama" | "mistral" | "qwen2") {
            bail!("model_type {model_type:?} is not a Llama-family config (llama, mistral, qwen2)");
        }
        refuse_unsupported(map)?;
        let hidden_size = required(map, "hidden_size")?;
        let num_attention_heads = required(map, "num_attention_heads")?;
        let num_key_value_heads = usize_of(map, "num_key_value_heads")?.unwrap_or(num_attention_heads);
        let head_dim = usize_of(map, "head_dim")?.unwrap_or(hidden_size.checked_div(num_attention_heads).unwrap_or(0));
        let (rope_theta, rope_scaling) = rope_settings(map)?;
        let qwen = model_type == "qwen2";
        let config = LlamaConfig {
            vocab_size: required(map, "vocab_size")?,
            hidden_size,
            intermediate_size: required(map, "intermediate_size")?,
            num_hidden_layers: required(map, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings: usize_of(map, "max_position_embeddings")?.unwrap_or(2048),
            rms_norm_eps: f64_of(map, "rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            attention_bias: bool_of(map, "attention_bias")?.unwrap_or(false),
            qkv_bias: qwen,
            mlp_bias: bool_of(map, "mlp_bias")?.unwrap_or(false),
            tie_word_embeddings: bool_of(map, "tie_word_embeddings")?.unwrap_or(false),
            sliding_window: match (qwen, bool_of(map, "use_sliding_window")?.unwrap_or(false)) {
                (true, false) => None,
                _ => usize_of(map, "sliding_window")?,
            },
            model_type,
        };
        config.validate()?;
        Ok(config)
    }

    /// The longest sequence the model takes: `max_position_embeddings`, or the sliding window where it
    /// is shorter (past it, sliding-window attention would differ from the full attention computed).
    pub fn context(&self) -> usize {
        self.max_position_embeddings.min(self.sliding_window.unwrap_or(usize::MAX))
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text = crate::io::read_regular_text(path, "config")?;
        let value: Value = serde_json::from_str(&text).with_context(|| format!("parsing {} as JSON", path.display()))?;
        let map = value.as_object().with_context(|| format!("{}: expected a JSON object", path.display()))?;
        Self::from_json(map).with_context(|| format!("{}", path.display()))
    }

    /// config.json as transformers writes it for the family's `...ForCausalLM`, with RoPE's settings
    /// both as transformers 5 spells them (`rope_parameters`) and as 4 does (`rope_theta`,
    /// `rope_scaling`): each reads its own, and would otherwise fall back to its default frequency.
    pub fn to_hf_json(&self) -> Value {
        let mut json = self.hf_json_without_window();
        if let Some(window) = self.sliding_window {
            json["sliding_window"] = window.into();
            if self.model_type == "qwen2" {
                json["use_sliding_window"] = true.into();
            }
        }
        json
    }

    fn hf_json_without_window(&self) -> Value {
        // The scaling as transformers 4 spells it (`rope_scaling`), and with the base frequency as 5
        // does (`rope_parameters`).
        let scaling = self.rope_scaling.as_ref().map(|s| {
            serde_json::json!({
                "rope_type": "llama3",
                "factor": s.factor,
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            })
        });
        let mut rope = scaling.clone().unwrap_or_else(|| serde_json::json!({ "rope_type": "default" }));
        rope["rope_theta"] = self.rope_theta.into();
        serde_json::json!({
            "architectures": [match self.model_type.as_str() {
                "mistral" => "MistralForCausalLM",
                "qwen2" => "Qwen2ForCausalLM",
                _ => "LlamaForCausalLM",
            }],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "rope_theta": self.rope_theta,
            "rope_scaling": scaling,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "hidden_act": "silu",
            "attention_dropout": 0.0,
            "tie_word_embeddings": self.tie_word_embeddings,
        })
    }

    /// Checks what the model code relies on.
    pub fn validate(&self) -> Result<()> {
        let dims = [self.vocab_size, self.hidden_size, self.intermediate_size, self.num_hidden_layers, self.num_attention_heads];
        if dims.contains(&0) || self.num_key_value_heads == 0 || self.head_dim == 0 || self.max_position_embeddings == 0 {
            bail!(
                "vocab_size, hidden_size, intermediate_size, num_hidden_layers, heads, head_dim and max_position_embeddings must be positive"
            );
        }
        if self.sliding_window == Some(0) {
            bail!("sliding_window must be positive (or null: none)");
        }
        if dims.iter().any(|&d| d > 1 << 24) || self.num_hidden_layers > 1 << 16 {
            bail!("a dimension is larger than zerostream accepts (2^24, 2^16 layers)");
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            bail!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            bail!("head_dim {} must be even (RoPE rotates pairs)", self.head_dim);
        }
        if !self.rms_norm_eps.is_finite() || self.rms_norm_eps <= 0.0 || !self.rope_theta.is_finite() || self.rope_theta <= 1.0 {
            bail!("rms_norm_eps must be > 0 and rope_theta > 1");
        }
        Ok(())
    }

    /// RoPE's inverse frequencies (D/2 of them) as transformers computes them in float32, Llama-3's
    /// scaling applied when the config asks for it.
    pub fn inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim;
        let base: Vec<f32> = (0..d / 2).map(|i| 1.0 / (self.rope_theta as f32).powf((2 * i) as f32 / d as f32)).collect();
        let Some(s) = &self.rope_scaling else { return base };
        let old = s.original_max_position_embeddings as f32;
        let (low_wavelen, high_wavelen) = (old / s.low_freq_factor as f32, old / s.high_freq_factor as f32);
        base.into_iter()
            .map(|f| {
                let wavelen = 2.0 * std::f32::consts::PI / f;
                if wavelen > low_wavelen {
                    f / s.factor as f32
                } else if wavelen < high_wavelen {
                    f
                } else {
                    let smooth = (old / wavelen - s.low_freq_factor as f32) / (s.high_freq_factor - s.low_freq_factor) as f32;
                    (1.0 - smooth) * f / s.factor as f32 + smooth * f
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<LlamaConfig> {
        let v: Value = serde_json::from_str(text).unwrap();
        LlamaConfig::from_json(v.as_object().unwrap())
    }

    #[test]
    fn the_golden_llama_config_and_both_rope_spellings_load() {
        let golden = include_str!("../../engine/tests/golden/llama-tiny/model/config.json");
        let c = parse(golden).unwrap();
        assert_eq!((c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim), (48, 4, 2, 12));
        assert_eq!((c.rope_theta, c.tie_word_embeddings, c.intermediate_size), (10000.0, false, 128));
        let old = r#"{"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
            "num_attention_heads":2,"rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,
            "high_freq_factor":4.0,"original_max_position_embeddings":8192},"hidden_act":"silu"}"#;
        let c = parse(old).unwrap();
        assert_eq!((c.rope_theta, c.num_key_value_heads, c.head_dim), (500000.0, 2, 4));
        assert_eq!(c.rope_scaling.as_ref().unwrap().factor, 8.0);
        let new = old
            .replace("\"rope_theta\":500000.0,\"rope_scaling\":", "\"rope_parameters\":")
            .replace("\"rope_type\":\"llama3\"", "\"rope_type\":\"llama3\",\"rope_theta\":500000.0");
        assert_eq!(parse(&new).unwrap(), c);
        // Written with both spellings, read back the same; the two disagreeing are refused by name.
        let both = c.to_hf_json();
        assert_eq!((both["rope_theta"].as_f64(), &both["rope_scaling"]["factor"]), (Some(500000.0), &serde_json::json!(8.0)));
        assert_eq!(LlamaConfig::from_json(both.as_object().unwrap()).unwrap(), c);
        let e = parse(&new.replace("\"hidden_act\"", "\"rope_theta\":10000.0,\"hidden_act\"")).unwrap_err().to_string();
        assert!(e.contains("rope_parameters") && e.contains("disagree") && e.contains("10000"), "{e}");
        let plain = parse(golden).unwrap().to_hf_json();
        assert_eq!((&plain["rope_scaling"], plain["rope_parameters"]["rope_type"].as_str()), (&Value::Null, Some("default")));
    }

    #[test]
    fn what_the_engine_does_not_implement_is_refused_by_name() {
        let base = r#"{"model_type":"mistral","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2"#;
        let err = |extra: &str| parse(&format!("{base}{extra}}}")).unwrap_err().to_string();
        assert!(err(r#","num_local_experts":8"#).contains("num_local_experts"));
        assert!(err(r#","hidden_act":"gelu""#).contains("hidden_act"));
        assert!(err(r#","num_key_value_heads":3"#).contains("multiple of num_key_value_heads"));
        assert!(err(r#","rope_scaling":{"rope_type":"yarn","factor":2.0}"#).contains("rope_type \"yarn\""));
        assert!(parse(&format!("{base},\"sliding_window\":null}}")).is_ok());
        let qwen = parse(r#"{"model_type":"qwen2","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"sliding_window":32768,"use_sliding_window":false}"#).unwrap();
        assert!(qwen.qkv_bias && !qwen.attention_bias && qwen.sliding_window.is_none());
    }

    #[test]
    fn a_sliding_window_limits_the_context_and_is_written_back() {
        let base = r#"{"model_type":"mistral","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"max_position_embeddings":32768"#;
        // Mistral-7B-v0.1's: on up to 4096 tokens its attention is the full causal one.
        let mistral = parse(&format!("{base},\"sliding_window\":4096}}")).unwrap();
        assert_eq!((mistral.sliding_window, mistral.context()), (Some(4096), 4096));
        let json = mistral.to_hf_json();
        assert_eq!(
            (&json["sliding_window"], &json["architectures"][0]),
            (&serde_json::json!(4096), &serde_json::json!("MistralForCausalLM"))
        );
        assert_eq!(LlamaConfig::from_json(json.as_object().unwrap()).unwrap(), mistral);
        // A window at least the embedded positions changes nothing.
        let wide = parse(&format!("{base},\"sliding_window\":65536}}")).unwrap();
        assert_eq!(wide.context(), 32768);
        assert!(parse(&format!("{base},\"sliding_window\":0}}")).unwrap_err().to_string().contains("sliding_window must be positive"));
        let qwen = r#"{"model_type":"qwen2","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"sliding_window":512,"use_sliding_window":true}"#;
        let qwen = parse(qwen).unwrap();
        assert_eq!(qwen.context(), 512);
        assert_eq!(qwen.to_hf_json()["use_sliding_window"], true);
    }

    #[test]
    fn presets_have_the_published_shapes_and_llama3_frequencies_follow_transformers() {
        let one = LlamaConfig::preset("llama-3.2-1b").unwrap();
        let eight = LlamaConfig::preset("llama-3-8b").unwrap();
        assert_eq!((one.hidden_size, one.num_hidden_layers, eight.hidden_size, eight.head_dim), (2048, 16, 4096, 128));
        // Llama-3.2-3B's 3.21B parameters: the tied embedding, 28 blocks of GQA 24/8 x 128 and a 8192 MLP.
        let three = LlamaConfig::preset("llama-3.2-3b").unwrap();
        let (c, kv, f) = (three.hidden_size, three.num_key_value_heads * three.head_dim, three.intermediate_size);
        let block = 2 * c * c + 2 * c * kv + 3 * c * f + 2 * c;
        let params = three.vocab_size * c + three.num_hidden_layers * block + c;
        assert_eq!((params, three.num_attention_heads * three.head_dim), (3_212_749_824, c));
        let f = one.inv_freq();
        assert_eq!(f.len(), 32);
        // High frequencies are kept, the lowest are divided by the factor (transformers' _compute_llama3_parameters).
        assert_eq!(f[0], 1.0);
        let plain = 1.0 / 500000f32.powf(62.0 / 64.0);
        assert!((f[31] - plain / 32.0).abs() <= plain * 1e-6, "{} vs {}", f[31], plain / 32.0);
    }
}
