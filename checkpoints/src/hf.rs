//! Hugging Face GPT-2 directories: `config.json` plus `model.safetensors`, or shards listed in
//! `model.safetensors.index.json`. Files are memory-mapped; tensors are converted to f32 on request.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

pub use crate::config::Gpt2Config;

/// One tensor's place in a memory-mapped file.
struct Entry {
    file: usize,
}

/// A Hugging Face model directory, memory-mapped.
pub struct HfModel {
    pub dir: PathBuf,
    pub config: Gpt2Config,
    files: Vec<(PathBuf, Mmap)>,
    index: HashMap<String, Entry>,
}

impl HfModel {
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            bail!(
                "model directory {} does not exist (expected a Hugging Face GPT-2 directory with config.json and model.safetensors)",
                dir.display()
            );
        }
        let config = Gpt2Config::from_file(&dir.join("config.json"))?;
        let single = dir.join("model.safetensors");
        let sharded = dir.join("model.safetensors.index.json");
        let shard_names: Vec<String> = if single.exists() {
            vec!["model.safetensors".into()]
        } else if sharded.exists() {
            #[derive(Deserialize)]
            struct Index {
                weight_map: HashMap<String, String>,
            }
            let text = std::fs::read_to_string(&sharded).with_context(|| format!("reading {}", sharded.display()))?;
            let index: Index = serde_json::from_str(&text).with_context(|| format!("parsing {}", sharded.display()))?;
            let mut names: Vec<String> = index.weight_map.into_values().collect();
            names.sort();
            names.dedup();
            names
        } else {
            bail!("{}: neither model.safetensors nor model.safetensors.index.json found", dir.display());
        };
        let mut model = HfModel { dir: dir.to_path_buf(), config, files: Vec::new(), index: HashMap::new() };
        for name in shard_names {
            let path = dir.join(&name);
            let file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
            // SAFETY: the file is opened read-only; zerostream never writes model files it has mapped.
            let mmap = unsafe { Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
            let st = SafeTensors::deserialize(&mmap).with_context(|| format!("{}: not a valid safetensors file", path.display()))?;
            for tensor_name in st.names() {
                model.index.insert(tensor_name.to_string(), Entry { file: model.files.len() });
            }
            model.files.push((path, mmap));
        }
        Ok(model)
    }

    /// The stored name of `name` (`transformer.h.0.ln_1.weight`), also accepting checkpoints saved
    /// without the `transformer.` prefix (as the original `gpt2` upload is).
    fn resolve(&self, name: &str) -> Option<&str> {
        if let Some((k, _)) = self.index.get_key_value(name) {
            return Some(k);
        }
        let bare = name.strip_prefix("transformer.")?;
        self.index.get_key_value(bare).map(|(k, _)| k.as_str())
    }

    /// The tensor `name` as f32 (converted from f16, bf16 or f64), checked against `shape`.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let stored =
            self.resolve(name).with_context(|| format!("{}: tensor {name} not found (expected shape {shape:?})", self.dir.display()))?;
        let (path, mmap) = &self.files[self.index[stored].file];
        let st = SafeTensors::deserialize(mmap)?;
        let view = st.tensor(stored)?;
        if view.shape() != shape {
            bail!("{}: tensor {name} has shape {:?}, expected {shape:?}", path.display(), view.shape());
        }
        to_f32(view.dtype(), view.data()).with_context(|| format!("{}: tensor {name}", path.display()))
    }
}

/// Decodes little-endian tensor bytes to f32.
pub fn to_f32(dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect(),
        Dtype::F64 => bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap()) as f32).collect(),
        Dtype::F16 => bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::BF16 => bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        other => bail!("dtype {other:?} is not a floating-point type zerostream reads"),
    })
}

/// Writes a Hugging Face GPT-2 directory: `config.json` and `model.safetensors` (f32), the tensors
/// given as (name, shape, data). Files are written under temporary names and renamed, so an interrupted
/// save never leaves a half-written model where a good one was.
pub fn save_hf(dir: &Path, config: &Gpt2Config, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let views = tensors
        .iter()
        .map(|(name, shape, data)| {
            let view = safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), bytemuck::cast_slice(data))
                .map_err(|e| anyhow::anyhow!("tensor {name}: {e}"))?;
            Ok((name.clone(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    let weights = dir.join("model.safetensors");
    let tmp = dir.join(".model.safetensors.tmp");
    safetensors::serialize_to_file(views, None, &tmp).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &weights).with_context(|| format!("writing {}", weights.display()))?;
    let config_path = dir.join("config.json");
    let tmp = dir.join(".config.json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&config.to_hf_json())?).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &config_path).with_context(|| format!("writing {}", config_path.display()))?;
    Ok(())
}
