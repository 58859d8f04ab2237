//! One sequence on a device with a KV cache, its blocks streamed under the device's byte budget.
//!
//! [`DecodePlan`] decides, once, where the device bytes go: the head group, one key/value cache per
//! layer (`capacity` positions), as many blocks as fit kept resident (all of them when they fit, so a
//! small model is uploaded once), one slot the other blocks are streamed through on every step, and
//! the activations of a step (a prompt is fed in chunks of as many rows as fit). [`Session::feed`] then
//! runs new tokens through the model at the next positions and returns the next-token logits.

use anyhow::{Result, bail};

use crate::device::Backend;
use crate::model::Model;
use crate::model::decode::{Decoder, StepActs};

/// Gives group g's values in table order: g = 0 the head group, g = 1 + l block l (the trainer's
/// layout). Called for the head and the resident blocks once, and for a streamed block on every step.
pub type GroupLoader<'a> = dyn FnMut(usize) -> Result<Vec<Vec<f32>>> + 'a;

/// Where the device bytes of a generation go.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodePlan {
    /// Positions each layer's cache holds.
    pub capacity: usize,
    /// Blocks 0..resident_blocks stay on the device; the rest pass through one slot on every step.
    pub resident_blocks: usize,
    pub n_layer: usize,
    /// Rows of a prompt fed at once.
    pub prefill_rows: usize,
    pub head_bytes: u64,
    pub block_bytes: u64,
    pub kv_cache_bytes: u64,
    /// Activations of one step of `prefill_rows` rows.
    pub step_bytes: u64,
}

fn group_bytes(specs: &[crate::model::TensorSpec]) -> u64 {
    4 * specs.iter().map(|t| t.len() as u64).sum::<u64>()
}

impl DecodePlan {
    /// Device bytes of a step of `rows` rows: the family's scratch, two residual buffers and the ids.
    fn step_bytes(model: &Model, rows: usize) -> u64 {
        model.step_acts_bytes(rows) + 8 * (rows * model.width()) as u64 + 32 * (rows as u64 + 1)
    }

    /// The plan for a cache of `capacity` positions and a first feed of `prompt_rows` rows within
    /// `available` device bytes; refused, with the numbers, when one token's needs do not fit.
    pub fn new(model: &Model, capacity: usize, prompt_rows: usize, available: u64) -> Result<Self> {
        let n_layer = model.n_layer();
        let head_bytes = group_bytes(&model.head_specs());
        let block_bytes = (0..n_layer).map(|l| group_bytes(&model.block_specs(l))).max().unwrap_or(0);
        let kv_cache_bytes = 4 * n_layer as u64 * model.kv_cache_len(capacity) as u64;
        let fixed = head_bytes + kv_cache_bytes;
        let one_token = fixed + block_bytes + Self::step_bytes(model, 1);
        if one_token > available {
            bail!(
                "the device budget leaves {} for generation; one token needs {} (the head {} + one block {} + the key/value cache {} for {capacity} positions + activations {}): \
                 raise --gpu-mem-budget or shorten the prompt and --max-new-tokens",
                crate::words::size(available),
                crate::words::size(one_token),
                crate::words::size(head_bytes),
                crate::words::size(block_bytes),
                crate::words::size(kv_cache_bytes),
                crate::words::size(Self::step_bytes(model, 1))
            );
        }
        let all = fixed + n_layer as u64 * block_bytes + Self::step_bytes(model, 1);
        let resident_blocks = if all <= available {
            n_layer
        } else {
            // Keep a streaming slot; fill the rest with resident blocks.
            (((available - one_token) / block_bytes.max(1)) as usize).min(n_layer - 1)
        };
        let slots = resident_blocks + usize::from(resident_blocks < n_layer);
        let left = available - fixed - slots as u64 * block_bytes;
        let mut prefill_rows = prompt_rows.max(1);
        while prefill_rows > 1 && Self::step_bytes(model, prefill_rows) > left {
            prefill_rows = prefill_rows.div_ceil(2);
        }
        let step_bytes = Self::step_bytes(model, prefill_rows);
        Ok(DecodePlan { capacity, resident_blocks, n_layer, prefill_rows, head_bytes, block_bytes, kv_cache_bytes, step_bytes })
    }

    /// The fewest device bytes a generation with a cache of `capacity` positions needs.
    pub fn min_bytes(model: &Model, capacity: usize) -> u64 {
        let head = group_bytes(&model.head_specs());
        let block = (0..model.n_layer()).map(|l| group_bytes(&model.block_specs(l))).max().unwrap_or(0);
        head + block + 4 * model.n_layer() as u64 * model.kv_cache_len(capacity) as u64 + Self::step_bytes(model, 1)
    }

    /// Whether some blocks are uploaded again on every step.
    pub fn streams(&self) -> bool {
        self.resident_blocks < self.n_layer
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        format!(
            "{} of {} blocks resident{}; head {}, blocks {} each, key/value cache {} ({} positions), prompt fed {} at a time",
            self.resident_blocks,
            self.n_layer,
            if self.streams() { ", the rest streamed each token" } else { "" },
            crate::words::size(self.head_bytes),
            crate::words::size(self.block_bytes),
            crate::words::size(self.kv_cache_bytes),
            self.capacity,
            crate::words::counted(self.prefill_rows as u64, "row")
        )
    }
}

/// A step's scratch for a number of rows, and the two residual buffers.
struct Scratch<T> {
    rows: usize,
    acts: StepActs<T>,
    x: [T; 2],
}

/// One sequence being generated: the head, the resident blocks, the streaming slot and the caches on
/// the device, and how many positions the caches hold.
pub struct Session<'a, 'l, D: Backend> {
    dev: &'a D,
    model: &'a Model,
    load: &'a mut GroupLoader<'l>,
    plan: DecodePlan,
    decoder: Decoder<D::Tensor>,
    resident: Vec<Vec<D::Tensor>>,
    slot: Option<Vec<D::Tensor>>,
    caches: Vec<D::Tensor>,
    scratch: Option<Scratch<D::Tensor>>,
    past: usize,
}

impl<'a, 'l, D: Backend> Session<'a, 'l, D> {
    /// Plans within what is left of the device's budget, then uploads the head and the resident blocks
    /// and allocates the caches.
    pub fn new(dev: &'a D, model: &'a Model, load: &'a mut GroupLoader<'l>, capacity: usize, prompt_rows: usize) -> Result<Self> {
        if capacity == 0 || capacity > model.max_seq_len() {
            bail!("a key/value cache of {capacity} positions: the model takes 1 to {}", model.max_seq_len());
        }
        dev.check_attention_decode(model.decode_dims(0, 1, 0, capacity))?;
        let stats = dev.alloc_stats();
        let plan = DecodePlan::new(model, capacity, prompt_rows, stats.budget_bytes.saturating_sub(stats.live_bytes))?;
        let decoder = model.decoder(dev, load(0)?)?;
        let mut resident = Vec::with_capacity(plan.resident_blocks);
        for l in 0..plan.resident_blocks {
            resident.push(upload_block(dev, model, l, load(1 + l)?, None)?);
        }
        let slot = match plan.streams() {
            true => Some(alloc_block(dev, model, plan.resident_blocks)?),
            false => None,
        };
        let caches = (0..model.n_layer())
            .map(|l| {
                let cache = dev.alloc(model.kv_cache_len(capacity), &format!("key/value cache {l}"))?;
                Ok(cache)
            })
            .collect::<Result<_>>()?;
        Ok(Session { dev, model, load, plan, decoder, resident, slot, caches, scratch: None, past: 0 })
    }

    pub fn plan(&self) -> &DecodePlan {
        &self.plan
    }
    /// Positions the caches hold.
    pub fn past(&self) -> usize {
        self.past
    }
    /// Forgets the cached positions: the next feed starts at position 0.
    pub fn reset(&mut self) {
        self.past = 0;
    }

    /// Runs `ids` through the model at positions past .. past + ids.len() (in chunks of the plan's
    /// prefill rows) and returns the logits (V) that follow the last of them.
    pub fn feed(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        if ids.is_empty() {
            bail!("nothing to feed");
        }
        if self.past + ids.len() > self.plan.capacity {
            bail!("{} cached + {} new positions exceed the cache's {}", self.past, ids.len(), self.plan.capacity);
        }
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.model.vocab_size()) {
            bail!("token {bad} is not below the model's vocab_size {}", self.model.vocab_size());
        }
        let mut logits = Vec::new();
        let chunks: Vec<&[u32]> = ids.chunks(self.plan.prefill_rows).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let rows = chunk.len();
            self.step(chunk)?;
            if i + 1 == chunks.len() {
                let s = self.scratch.as_ref().expect("a step's scratch");
                logits = self.decoder.logits(self.dev, &s.acts, &s.x[self.model.n_layer() % 2], rows);
            }
            self.past += rows;
        }
        Ok(logits)
    }

    /// One chunk through every block, its keys and values into the caches (`past` not yet advanced).
    fn step(&mut self, ids: &[u32]) -> Result<()> {
        let (dev, model, rows) = (self.dev, self.model, ids.len());
        if self.scratch.as_ref().is_none_or(|s| s.rows != rows) {
            self.scratch = None; // free before allocating
            let width = model.width();
            let x = [dev.alloc(rows * width, "decode x A")?, dev.alloc(rows * width, "decode x B")?];
            self.scratch = Some(Scratch { rows, acts: model.step_acts(dev, rows)?, x });
        }
        let s = self.scratch.as_ref().expect("allocated above");
        let tokens = dev.tokens(ids)?;
        self.decoder.embed(dev, &s.acts, &s.x[0], &tokens, rows, self.past);
        for l in 0..model.n_layer() {
            let block = match self.resident.get(l) {
                Some(b) => b,
                None => {
                    let slot = self.slot.as_ref().expect("a streaming slot");
                    upload_block(dev, model, l, (self.load)(1 + l)?, Some(slot))?;
                    slot
                }
            };
            let dims = model.decode_dims(l, rows, self.past, self.plan.capacity);
            self.decoder.block(dev, l, block, &s.acts, &self.caches[l], &s.x[l % 2], &s.x[(l + 1) % 2], dims);
        }
        Ok(())
    }
}

/// New device tensors for block l's group.
fn alloc_block<D: Backend>(dev: &D, model: &Model, l: usize) -> Result<Vec<D::Tensor>> {
    model.block_specs(l).iter().map(|t| dev.alloc(t.len(), &format!("slot {}", t.name))).collect()
}

/// Block l's values into `into` (a slot), or into new tensors; values of the wrong size are refused.
fn upload_block<D: Backend>(
    dev: &D,
    model: &Model,
    l: usize,
    values: Vec<Vec<f32>>,
    into: Option<&Vec<D::Tensor>>,
) -> Result<Vec<D::Tensor>> {
    let specs = model.block_specs(l);
    if values.len() != specs.len() {
        bail!("block {l}: {} tensors given, {} expected", values.len(), specs.len());
    }
    let made = match into {
        Some(_) => Vec::new(),
        None => alloc_block(dev, model, l)?,
    };
    let targets: &Vec<D::Tensor> = into.unwrap_or(&made);
    for ((spec, v), t) in specs.iter().zip(&values).zip(targets) {
        if v.len() != spec.len() {
            bail!("{}: {} values given for shape {:?}", spec.name, v.len(), spec.shape);
        }
        dev.write(t, v);
    }
    Ok(made)
}
