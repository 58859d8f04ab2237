//! A checkpoint's model written again in another `--save-dtype`, from the f32 master weights its
//! optimizer files hold rather than from its model file (which may be 16-bit): what `--save` of a
//! finished run writes when asked for a dtype other than the one the checkpoint saved.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use zerostream_checkpoints::safetensors_stream::{StreamWriter, TensorEntry};

use super::{CONFIG_FILE, Checkpoint, MODEL_FILE, ModelExtras, SaveDtype, write_config};
use crate::train::layout::group_layouts;

impl Checkpoint {
    /// The dtype the checkpoint's model file was saved in, as its config.json's `torch_dtype` says.
    pub fn saved_dtype(&self) -> Result<SaveDtype> {
        let config = self.config_json()?;
        let named = config.get("torch_dtype").and_then(|v| v.as_str()).unwrap_or_default();
        match [SaveDtype::F32, SaveDtype::Bf16, SaveDtype::F16].into_iter().find(|d| d.torch_name() == named) {
            Some(dtype) => Ok(dtype),
            None => {
                bail!("{}: torch_dtype {named:?} is none a checkpoint saves (float32, bfloat16, float16)", self.config_path().display())
            }
        }
    }

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
        let config = self.config_json()?;
        let keys = ModelExtras::CONFIG_KEYS.iter().filter_map(|&k| config.get(k).map(|v| (k.to_string(), v.clone()))).collect();
        write_config(dir, &self.model, dtype, &keys)?;
        Ok(())
    }

    fn config_path(&self) -> std::path::PathBuf {
        self.dir.join(CONFIG_FILE)
    }

    fn config_json(&self) -> Result<serde_json::Value> {
        let path = self.config_path();
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))
    }
}
