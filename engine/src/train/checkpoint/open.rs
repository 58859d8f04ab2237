//! Opening a checkpoint to resume from: its state and manifest verified, each rank's optimizer file
//! mapped with the group slices its metadata declares, and reads of any range of a group's master
//! weights, moments or residuals across those files (so another world size can re-split them).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use zerostream_checkpoints::checkpoint::{STATE_FILE, verify_files};
use zerostream_checkpoints::hf::to_f32;
use zerostream_offload::Stored;

use super::{FORMAT, FORMAT_VERSION, TrainerState, optimizer_file};
use crate::model::Model;
use crate::train::config::AdamState;

/// One rank's optimizer file of a checkpoint: its mapping and the group slices it holds.
struct RankFile {
    path: PathBuf,
    mmap: Mmap,
    /// Group name -> (owned range in the group's flat coordinates, the group's unpadded length).
    owned: BTreeMap<String, (Range<usize>, usize)>,
}

/// A checkpoint opened for resuming: its state, verified files and optimizer slices.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub state: TrainerState,
    pub model: Model,
    ranks: Vec<RankFile>,
}

impl Checkpoint {
    /// Opens the checkpoint `dir` (a `step-NNNNNNNN` directory) and checks every file against its
    /// manifest; a truncated, corrupt or missing file is refused by name.
    pub fn open(dir: &Path) -> Result<Self> {
        let state_path = dir.join(STATE_FILE);
        let text = std::fs::read_to_string(&state_path).with_context(|| format!("reading {}", state_path.display()))?;
        let state: TrainerState =
            serde_json::from_str(&text).with_context(|| format!("{}: not a zerostream trainer state (corrupt?)", state_path.display()))?;
        state.check_counts(&state_path, dir)?;
        if state.format != FORMAT || state.format_version != FORMAT_VERSION {
            bail!(
                "{}: format {} version {}, expected {FORMAT} version {FORMAT_VERSION}",
                state_path.display(),
                state.format,
                state.format_version
            );
        }
        verify_files(dir, &state.files)?;
        let model = Model::from_hf_json(&state.model).with_context(|| format!("{}", state_path.display()))?;
        let mut ranks = Vec::new();
        for r in 0..state.world_size {
            let path = dir.join(optimizer_file(r));
            let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
            // SAFETY: read-only mapping of a checkpoint file; checkpoints are never modified once committed.
            let mmap = unsafe { Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
            let owned = read_layout(&path, &mmap)?;
            ranks.push(RankFile { path, mmap, owned });
        }
        Ok(Checkpoint { dir: dir.to_path_buf(), state, model, ranks })
    }

    /// Elements `range` (group coordinates) of `group`'s `kind` (master, adam_m, adam_v), gathered from
    /// whichever ranks' slices hold them; elements past the group's tensors (padding) are zero.
    pub fn read_range(&self, group: &str, kind: &str, range: Range<usize>, out: &mut [f32]) -> Result<()> {
        if out.len() != range.len() {
            bail!("reading {group}.{kind} {range:?} from {}: {} elements asked for into {}", self.dir.display(), range.len(), out.len());
        }
        out.fill(0.0);
        // Stage 0's state is in rank 0's file alone (the other ranks' hold residuals).
        let holders = if self.state.zero_stage == 0 { &self.ranks[..1] } else { &self.ranks[..] };
        for rf in holders {
            let Some((owned, len)) = rf.owned.get(group) else {
                bail!("{}: no group {group} (the checkpoint is of another model)", rf.path.display());
            };
            let wanted = range.start.min(*len)..range.end.min(*len);
            let Some(r) = crate::train::shard::intersect(wanted, owned) else { continue };
            let st = SafeTensors::deserialize(&rf.mmap).with_context(|| format!("{}: not a valid safetensors file", rf.path.display()))?;
            let name = format!("{group}.{kind}");
            let view = st.tensor(&name).with_context(|| format!("{}: tensor {name}", rf.path.display()))?;
            // fp32, or bf16 (moments under --adam-state bf16: widened exactly).
            let elem_bytes = match view.dtype() {
                Dtype::F32 => 4,
                Dtype::BF16 => 2,
                other => bail!("{}: tensor {name} is {other:?}; expected F32 or BF16", rf.path.display()),
            };
            let Some(bytes) = view.data().get(elem_bytes * (r.start - owned.start)..elem_bytes * (r.end - owned.start)) else {
                bail!("{}: tensor {name} holds {} bytes, fewer than its slice {owned:?} needs", rf.path.display(), view.data().len());
            };
            out[r.start - range.start..r.end - range.start].copy_from_slice(&to_f32(view.dtype(), bytes)?);
        }
        Ok(())
    }
}

impl Checkpoint {
    /// Rank `rank`'s optimizer file's metadata value `key` (None: the file has no such key, or no file).
    pub(in crate::train) fn rank_metadata(&self, rank: usize, key: &str) -> Option<String> {
        let rf = self.ranks.get(rank)?;
        let (_, meta) = SafeTensors::read_metadata(&rf.mmap).ok()?;
        meta.metadata().as_ref()?.get(key).cloned()
    }

    /// The whole tensor `name` of rank `rank`'s optimizer file as f32 (None: the file has no such tensor).
    pub(in crate::train) fn rank_tensor(&self, rank: usize, name: &str) -> Result<Option<Vec<f32>>> {
        let Some(rf) = self.ranks.get(rank) else { bail!("{}: no optimizer file of rank {rank}", self.dir.display()) };
        let st = SafeTensors::deserialize(&rf.mmap).with_context(|| format!("{}: not a valid safetensors file", rf.path.display()))?;
        match st.tensor(name) {
            Ok(view) if view.dtype() == Dtype::F32 => Ok(Some(to_f32(view.dtype(), view.data())?)),
            Ok(view) => bail!("{}: tensor {name} is {:?}; expected F32", rf.path.display(), view.dtype()),
            Err(_) => Ok(None),
        }
    }

    /// A moment's elements `range` of `group` into `out` (paged in), in the run's format `state`: a
    /// resume keeps the checkpoint's `--adam-state`, so bf16 moments come back bit for bit.
    pub(in crate::train) fn read_moment(
        &self,
        group: &str,
        kind: &str,
        range: Range<usize>,
        state: AdamState,
        out: &mut Stored,
    ) -> Result<()> {
        match state {
            AdamState::Fp32 => self.read_range(group, kind, range, out.data_mut().as_mut_slice()),
            AdamState::Bf16 => {
                let mut values = vec![0.0f32; range.len()];
                self.read_range(group, kind, range, &mut values)?;
                for (o, x) in out.data_mut().as_mut_slice::<u16>().iter_mut().zip(values) {
                    *o = half::bf16::from_f32(x).to_bits();
                }
                Ok(())
            }
        }
    }
}

/// The group slices an optimizer file's metadata declares.
fn read_layout(path: &Path, mmap: &[u8]) -> Result<BTreeMap<String, (Range<usize>, usize)>> {
    let (_, meta) = SafeTensors::read_metadata(mmap).with_context(|| format!("{}: not a valid safetensors file", path.display()))?;
    let groups =
        meta.metadata().as_ref().and_then(|m| m.get("groups")).with_context(|| format!("{}: no layout in the metadata", path.display()))?;
    let groups: Vec<serde_json::Value> =
        serde_json::from_str(groups).with_context(|| format!("{}: the layout metadata", path.display()))?;
    let mut out = BTreeMap::new();
    for g in groups {
        let (Some(name), Some(len), Some([s, e])) = (
            g["group"].as_str(),
            g["len"].as_u64(),
            g["owned"].as_array().map(|a| [a.first().and_then(|x| x.as_u64()), a.get(1).and_then(|x| x.as_u64())]),
        ) else {
            bail!("{}: malformed group in the layout metadata: {g}", path.display());
        };
        let (Some(s), Some(e)) = (s, e) else { bail!("{}: malformed owned range: {g}", path.display()) };
        out.insert(name.to_string(), (s as usize..e as usize, len as usize));
    }
    Ok(out)
}
