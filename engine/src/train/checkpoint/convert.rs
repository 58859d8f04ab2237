//! A checkpoint's model written again in another `--save-dtype`, from the f32 master weights its
//! optimizer files hold rather than from its model file (which may be 16-bit): what `--save` of a
//! finished run writes when asked for a dtype other than the one the checkpoint saved.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use zerostream_checkpoints::safetensors_stream::{StreamWriter, TensorEntry};

use super::{CONFIG_FILE, Checkpoint, MODEL_FILE, ModelExtras, SaveDtype, write_config};
use crate::train::layout::group_layouts;

/// The dtype the model file of the checkpoint `dir` was saved in, as its config.json's `torch_dtype`
/// says (read without opening the checkpoint's other files).
pub fn saved_dtype(dir: &Path) -> Result<SaveDtype> {
    let path = dir.join(CONFIG_FILE);
    let named = config_json(&path)?.get("torch_dtype").and_then(|v| v.as_str()).map(str::to_string).unwrap_or_default();
    match [SaveDtype::F32, SaveDtype::Bf16, SaveDtype::F16].into_iter().find(|d| d.torch_name() == named) {
        Some(dtype) => Ok(dtype),
        None => bail!("{}: torch_dtype {named:?} is none a checkpoint saves (float32, bfloat16, float16)", path.display()),
    }
}

fn config_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))
}

impl Checkpoint {
    /// Writes config.json and model.safetensors into the existing directory `dir`, the weights in
    /// `dtype` from the master weights (one group in memory at a time), config.json keeping the
    /// checkpoint's special-token ids. Its other files (the tokenizer's) are the caller's to copy.
    pub fn write_model(&self, dir: &Path, dtype: SaveDtype) -> Result<()> {
        let layouts = group_layouts(&self.model);
        let entries = layouts.iter().flat_map(|g| g.tensors.iter().map(|t| TensorEntry::new(&t.name, dtype.dtype(), t.shape.clone())));
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let mut model = StreamWriter::create(&dir.join(MODEL_FILE), entries.collect(), &meta)?;
        for g in &layouts {
            let mut master = vec![0f32; g.len];
            self.read_range(&g.name, "master", 0..g.len, &mut master)?;
            for t in &g.tensors {
                model.write_f32(&t.name, &master[t.range()])?;
            }
        }
        model.finish()?;
        let config = config_json(&self.dir.join(CONFIG_FILE))?;
        let keys = ModelExtras::CONFIG_KEYS.iter().filter_map(|&k| config.get(k).map(|v| (k.to_string(), v.clone()))).collect();
        write_config(dir, &self.model, dtype, &keys)?;
        Ok(())
    }
}
