//! Hugging Face model directories of the families zerostream implements (GPT-2, and Llama, Mistral and
//! Qwen2: [`ArchConfig`] picks by `model_type`): `config.json` plus `model.safetensors`, or shards
//! listed in `model.safetensors.index.json`. Opening reads and checks each file's header; a tensor is
//! read on request with a positioned read (not memory-mapped, so a file truncated under a run is an
//! error, not SIGBUS) and converted to f32, refusing NaN and infinities.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use safetensors::Dtype;
use safetensors::tensor::Metadata;
use serde::Deserialize;

pub use crate::config::Gpt2Config;
use crate::io::{Stamp, open_regular, read_exact_at};
use crate::llama_config::LlamaConfig;

/// Largest safetensors header accepted (the safetensors crate's own limit): a corrupt length field
/// must not make us allocate gigabytes.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One safetensors file of the model, open.
struct Shard {
    path: PathBuf,
    file: File,
    /// The file as opened; a tensor read from a file that changed since is refused.
    stamp: Stamp,
}

/// One tensor's place: which shard, its type and shape, and its bytes' absolute offset and length.
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    offset: u64,
    bytes: usize,
}

/// A Hugging Face model directory, its safetensors headers read.
pub struct HfModel {
    pub dir: PathBuf,
    pub config: ArchConfig,
    shards: Vec<Shard>,
    index: HashMap<String, Entry>,
    /// A sharded model's `weight_map` (tensor -> shard file), to say where a missing tensor was
    /// promised; empty for one model.safetensors.
    weight_map: HashMap<String, String>,
}

impl HfModel {
    pub fn open(dir: &Path) -> Result<Self> {
        if dir.exists() && !dir.is_dir() {
            bail!(
                "model directory {} is not a directory (expected a Hugging Face model directory with config.json and model.safetensors)",
                dir.display()
            );
        }
        if !dir.is_dir() {
            bail!(
                "model directory {} does not exist (expected a Hugging Face model directory with config.json and model.safetensors)",
                dir.display()
            );
        }
        let config = ArchConfig::from_file(&dir.join("config.json"))?;
        let single = dir.join("model.safetensors");
        let sharded = dir.join("model.safetensors.index.json");
        let mut weight_map = HashMap::new();
        let shard_names: Vec<String> = if single.exists() {
            vec!["model.safetensors".into()]
        } else if sharded.exists() {
            #[derive(Deserialize)]
            struct Index {
                weight_map: HashMap<String, String>,
            }
            let (file, _) = open_regular(&sharded, "safetensors index")?;
            let index: Index = serde_json::from_reader(std::io::BufReader::new(file))
                .with_context(|| format!("safetensors index {}: expected a JSON object with a weight_map", sharded.display()))?;
            weight_map = index.weight_map;
            let mut names: Vec<String> = weight_map.values().cloned().collect();
            names.sort();
            names.dedup();
            names
        } else {
            bail!("{}: neither model.safetensors nor model.safetensors.index.json found", dir.display());
        };
        let mut model = HfModel { dir: dir.to_path_buf(), config, shards: Vec::new(), index: HashMap::new(), weight_map };
        for name in shard_names {
            let path = dir.join(&name);
            let (file, meta) = open_regular(&path, "safetensors file")?;
            let stamp = Stamp::of(&meta);
            let (data_start, metadata) =
                read_header(&file, stamp.len).map_err(|e| anyhow::anyhow!("safetensors file {}: {e}", path.display()))?;
            for (tensor_name, info) in metadata.tensors() {
                let (begin, end) = info.data_offsets;
                let entry = Entry {
                    shard: model.shards.len(),
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    offset: data_start + begin as u64,
                    bytes: end - begin,
                };
                model.index.insert(tensor_name, entry);
            }
            model.shards.push(Shard { path, file, stamp });
        }
        model.check_layer_count()?;
        Ok(model)
    }

    /// Refuses weights holding a block past the layers config.json declares (`h.N.` for GPT-2,
    /// `layers.N.` for Llama): the model would be built without it and run silently wrong. Too few
    /// blocks are refused where the missing tensor is read.
    fn check_layer_count(&self) -> Result<()> {
        let (layers, key, marker) = match &self.config {
            ArchConfig::Gpt2(c) => (c.n_layer, "n_layer", "h"),
            ArchConfig::Llama(c) => (c.num_hidden_layers, "num_hidden_layers", "layers"),
        };
        let layer_of = |name: &str| {
            let parts: Vec<&str> = name.split('.').collect();
            parts.windows(2).find(|w| w[0] == marker).and_then(|w| w[1].parse::<usize>().ok())
        };
        let beyond = self
            .index
            .iter()
            .filter_map(|(name, entry)| layer_of(name).filter(|&l| l >= layers).map(|l| (l, name, entry)))
            .max_by_key(|(l, name, _)| (*l, *name));
        if let Some((layer, name, entry)) = beyond {
            bail!(
                "{}: holds block {layer} ({name}), but {} says {key} {layers}: the config does not describe these weights",
                self.shards[entry.shard].path.display(),
                self.dir.join("config.json").display()
            );
        }
        Ok(())
    }

    /// Every tensor name the model's files store.
    pub fn stored_names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// The stored name of `name` (`transformer.h.0.ln_1.weight`, `model.layers.0.mlp.up_proj.weight`),
    /// also accepting checkpoints saved without the base model's prefix (as the original `gpt2` upload
    /// is, and as a `LlamaModel` saves its weights).
    pub fn resolve(&self, name: &str) -> Option<&str> {
        if let Some((k, _)) = self.index.get_key_value(name) {
            return Some(k);
        }
        let bare = name.strip_prefix("transformer.").or_else(|| name.strip_prefix("model."))?;
        self.index.get_key_value(bare).map(|(k, _)| k.as_str())
    }

    /// The shape tensor `name` is stored with (resolved as [`Self::resolve`] does), from the headers
    /// alone; an error saying why where it is not stored.
    pub fn stored_shape(&self, name: &str) -> Result<&[usize]> {
        let stored = self.resolve(name).with_context(|| self.not_found(name, &[]))?;
        Ok(&self.index[stored].shape)
    }

    /// Why `name` is not there, naming the shard the index promised it in, if any.
    fn not_found(&self, name: &str, shape: &[usize]) -> String {
        let expected = |shape: &[usize]| if shape.is_empty() { String::new() } else { format!(" (expected shape {shape:?})") };
        let promised = [name, name.strip_prefix("transformer.").unwrap_or(name), name.strip_prefix("model.").unwrap_or(name)]
            .into_iter()
            .find_map(|n| self.weight_map.get(n));
        match promised {
            Some(shard) => format!(
                "{}: model.safetensors.index.json names tensor {name} in {shard}, which does not hold it{}",
                self.dir.display(),
                expected(shape)
            ),
            None => format!("{}: tensor {name} not found{}", self.dir.display(), expected(shape)),
        }
    }

    /// The tensor `name` as f32 (converted from f16, bf16 or f64), checked against `shape`. NaN and
    /// infinities (also f64 values too large for f32) are refused: training from them would only
    /// skip every step.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.tensor_rows(name, shape, 0..shape.first().copied().unwrap_or(1))
    }

    /// Rows `rows` of the tensor `name` (along its first dimension; a scalar is one row), read alone
    /// and converted as [`Self::tensor`] converts the whole: a (V, C) vocabulary matrix streamed a
    /// chunk of rows at a time never sits whole in host memory.
    pub fn tensor_rows(&self, name: &str, shape: &[usize], rows: std::ops::Range<usize>) -> Result<Vec<f32>> {
        let stored = self.resolve(name).with_context(|| self.not_found(name, shape))?;
        let entry = &self.index[stored];
        let shard = &self.shards[entry.shard];
        let path = shard.path.display();
        if entry.shape != shape {
            bail!("{path}: tensor {name} has shape {:?}, expected {shape:?}", entry.shape);
        }
        if !matches!(entry.dtype, Dtype::F32 | Dtype::F64 | Dtype::F16 | Dtype::BF16) {
            bail!("{path}: tensor {name}: dtype {:?} is not a floating-point type zerostream reads (F32, F64, F16, BF16)", entry.dtype);
        }
        let n_rows = shape.first().copied().unwrap_or(1);
        if rows.start > rows.end || rows.end > n_rows {
            bail!("{path}: tensor {name}: rows {rows:?} asked of its {n_rows}");
        }
        if let Some(change) = shard.stamp.change(&shard.file).with_context(|| format!("safetensors file {path}"))? {
            bail!("safetensors file {path} changed after it was opened: {change}");
        }
        // The header check made `bytes` the shape's element count times the dtype's size.
        let row_bytes = entry.bytes.checked_div(n_rows).unwrap_or(0);
        let offset = entry.offset + (rows.start * row_bytes) as u64;
        let mut bytes = vec![0u8; rows.len() * row_bytes];
        read_exact_at(&shard.file, &mut bytes, offset)
            .with_context(|| format!("safetensors file {path}: reading tensor {name} (bytes {offset}..{})", offset + bytes.len() as u64))?;
        let values = to_f32(entry.dtype, &bytes).with_context(|| format!("{path}: tensor {name}"))?;
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            let row_len = if rows.is_empty() { 1 } else { values.len() / rows.len() };
            bail!(
                "{path}: tensor {name} holds a non-finite value ({} as f32) at element {} of {}; the weights must be finite numbers",
                values[i],
                rows.start * row_len + i,
                n_rows * row_len
            );
        }
        Ok(values)
    }
}

/// Reads and checks the header of a safetensors file of `size` bytes: (byte offset of the tensor
/// data, the tensors). The header must describe exactly the bytes that follow it.
fn read_header(file: &File, size: u64) -> std::result::Result<(u64, Metadata), String> {
    if size < 8 {
        return Err(format!("{size} bytes, shorter than the 8-byte header length (truncated?)"));
    }
    let mut word = [0u8; 8];
    read_exact_at(file, &mut word, 0).map_err(|e| format!("reading the header length: {e}"))?;
    let n = u64::from_le_bytes(word);
    if n > MAX_HEADER_BYTES {
        return Err(format!("header length {n} is above the {MAX_HEADER_BYTES} bytes safetensors allows (not a safetensors file?)"));
    }
    if 8 + n > size {
        return Err(format!("header length {n} runs past the end of the file ({size} bytes; truncated?)"));
    }
    let mut header = vec![0u8; n as usize];
    read_exact_at(file, &mut header, 8).map_err(|e| format!("reading the {n}-byte header: {e}"))?;
    let text = std::str::from_utf8(&header).map_err(|e| format!("header is not UTF-8 ({e})"))?;
    let metadata: Metadata = serde_json::from_str(text).map_err(|e| match header_fault(text) {
        Some(fault) => format!("invalid header: {fault}"),
        None => format!("invalid header: {e}"),
    })?;
    let data = size - 8 - n;
    if metadata.data_len() as u64 != data {
        let why = if (metadata.data_len() as u64) > data { "truncated?" } else { "trailing bytes" };
        return Err(format!("header describes {} bytes of tensor data but {data} follow it ({why})", metadata.data_len()));
    }
    Ok((8 + n, metadata))
}

/// Which tensor of a header safetensors refused is wrong, and how (the crate's error names none): an
/// unknown dtype, a shape or offsets that are not numbers, a byte range that is not the shape's size,
/// or ranges that leave a gap or overlap. None where the fault is elsewhere.
fn header_fault(text: &str) -> Option<String> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text).ok()?;
    let mut ranges = Vec::new();
    for (name, info) in map.iter().filter(|(name, _)| *name != "__metadata__") {
        let dtype = info["dtype"].as_str().unwrap_or("(none)");
        let Ok(kind) = serde_json::from_value::<Dtype>(info["dtype"].clone()) else {
            return Some(format!("tensor {name}: dtype {dtype:?} is not one safetensors names (F32, F16, BF16, F64, ...)"));
        };
        let numbers = |key: &str| info[key].as_array().and_then(|a| a.iter().map(|v| v.as_u64()).collect::<Option<Vec<u64>>>());
        let Some(shape) = numbers("shape") else { return Some(format!("tensor {name}: shape {} is not a list of sizes", info["shape"])) };
        let Some(&[begin, end]) = numbers("data_offsets").as_deref() else {
            return Some(format!("tensor {name}: data_offsets {} is not [begin, end]", info["data_offsets"]));
        };
        // Sub-byte types (F4, F6) pack their elements: whole bytes only.
        let bits = shape.iter().try_fold(kind.bitsize() as u64, |n, &d| n.checked_mul(d));
        let want = bits.filter(|b| b % 8 == 0).map(|b| b / 8);
        if end < begin || want != Some(end - begin) {
            let size = match (bits, want) {
                (_, Some(bytes)) => format!("{bytes} bytes"),
                (Some(bits), None) => format!("{bits} bits, not whole bytes"),
                (None, _) => "more than 2^64 bits".to_string(),
            };
            return Some(format!(
                "tensor {name}: data_offsets [{begin}, {end}] hold {} bytes, but shape {shape:?} of {dtype} is {size}",
                end.saturating_sub(begin)
            ));
        }
        ranges.push((begin, end, name));
    }
    ranges.sort();
    let mut next = 0;
    for (begin, end, name) in ranges {
        if begin != next {
            let what = match next {
                0 => "leave a gap before it: the first tensor's data starts at 0".to_string(),
                _ if begin < next => format!("overlap the tensor before it, which ends at {next}"),
                _ => format!("leave a gap after the tensor before it, which ends at {next}"),
            };
            return Some(format!("tensor {name}: data_offsets [{begin}, {end}] {what}"));
        }
        next = end;
    }
    None
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

/// A config.json of one of the families zerostream implements, chosen by its `model_type`.
#[derive(Clone, Debug, PartialEq)]
pub enum ArchConfig {
    Gpt2(Gpt2Config),
    Llama(LlamaConfig),
}

impl ArchConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = crate::io::read_regular_text(path, "config")?;
        let value: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {} as JSON", path.display()))?;
        match value.get("model_type").and_then(|v| v.as_str()) {
            Some("llama" | "mistral" | "qwen2") => Ok(ArchConfig::Llama(LlamaConfig::from_file(path)?)),
            _ => Ok(ArchConfig::Gpt2(Gpt2Config::from_file(path)?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows read alone are the whole tensor's rows, converted the same way (bf16 here), and rows past
    /// the end are refused with the tensor's name.
    #[test]
    fn tensor_rows_are_rows_of_the_whole() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"model_type": "gpt2", "n_embd": 4, "n_layer": 1, "n_head": 1, "vocab_size": 5, "n_positions": 8}"#,
        )
        .unwrap();
        let values: Vec<u8> = (0..5 * 3).flat_map(|i| half::bf16::from_f32(i as f32 * 0.5 - 3.0).to_le_bytes()).collect();
        let view = safetensors::tensor::TensorView::new(Dtype::BF16, vec![5, 3], &values).unwrap();
        safetensors::serialize_to_file([("wte", view)], None, &dir.path().join("model.safetensors")).unwrap();
        let model = HfModel::open(dir.path()).unwrap();
        let whole = model.tensor("wte", &[5, 3]).unwrap();
        // Stored without the base model's prefix, as the original gpt2 upload and a LlamaModel save.
        assert_eq!(model.resolve("transformer.wte"), Some("wte"));
        assert_eq!(model.resolve("model.wte"), Some("wte"));
        assert_eq!(model.resolve("lm_head.wte"), None);
        assert_eq!(model.tensor_rows("wte", &[5, 3], 1..4).unwrap(), whole[3..12]);
        assert_eq!(model.tensor_rows("wte", &[5, 3], 4..4).unwrap(), Vec::<f32>::new());
        let err = model.tensor_rows("wte", &[5, 3], 2..6).unwrap_err().to_string();
        assert!(err.contains("wte") && err.contains("2..6") && err.contains('5'), "{err}");
        // A block past config.json's layers is refused by name, not dropped.
        let values = [0u8; 8];
        let view = |shape| safetensors::tensor::TensorView::new(Dtype::F32, shape, &values).unwrap();
        let tensors = [("transformer.h.0.ln_1.weight", view(vec![2])), ("transformer.h.1.ln_1.weight", view(vec![2]))];
        safetensors::serialize_to_file(tensors, None, &dir.path().join("model.safetensors")).unwrap();
        let err = HfModel::open(dir.path()).err().unwrap().to_string();
        assert!(
            err.contains("model.safetensors: holds block 1 (transformer.h.1.ln_1.weight), but ")
                && err.contains("config.json says n_layer 1"),
            "{err}"
        );
    }
}
