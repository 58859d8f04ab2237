//! The trainer's side of the vocabulary ([`crate::model::vocab`]): the embedding's rows gathered on the
//! host from the step's copy of the head group's vocabulary matrices, the output projection and loss a
//! vocabulary chunk at a time (the projection resident whole, or each chunk uploaded into one slot, as
//! the plan says), and the vocabulary matrices' gradients made on the host for each micro-batch — chunk
//! by chunk from the projection's backward, row by row from the embedding's — and added into the
//! accumulator as the blocks' are, so the device never holds a (V, C) gradient and, when streamed, no
//! (V, C) matrix at all. Where the projection lives never changes a
//! bit: the same per-chunk products and sums run either way (`tests/train.rs`).

use anyhow::{Result, bail};
use zerostream_offload::AlignedBuf;

use super::{Clock, Trainer, timed};
use crate::device::{Backend, HalfFormat};
use crate::model::vocab::{self, Rows};
use crate::ops::dropout::DropoutKeys;
use crate::ops::elementwise;

/// A vocabulary matrix's working-copy words, kept on the host for the step: f32, or 16-bit words of
/// `format`. In the device's pinned memory where it offers it (`Backend::alloc_pinned`), so a streamed
/// projection's chunks are uploaded straight from here.
pub(super) struct HostWords {
    buf: AlignedBuf,
    format: Option<HalfFormat>,
}

impl HostWords {
    /// A copy of `words` (f32, or 16-bit words of `format`) kept for the step, on rayon's threads, in
    /// `reuse`'s buffer where it has the same length: the last step's copy of the same matrix, whose
    /// pages are already faulted in (a fresh 1 GiB vector copied on one thread took 0.8 s of every
    /// Llama-3.2-1B step on an H200 host); else in a buffer `pinned` makes, else on the heap.
    pub(super) fn copy_of(
        words: &[u8],
        format: Option<HalfFormat>,
        reuse: Option<HostWords>,
        pinned: impl FnOnce(usize) -> Option<AlignedBuf>,
    ) -> HostWords {
        let reused = reuse.map(|w| w.buf).filter(|b| b.len_bytes() == words.len());
        let mut buf = reused.or_else(|| pinned(words.len())).unwrap_or_else(|| AlignedBuf::zeroed(words.len()));
        // By 32-bit words where they are (rayon's tasks are sized in elements).
        match bytemuck::try_cast_slice::<u8, u32>(words) {
            Ok(words32) => elementwise::copy(buf.as_mut_slice::<u32>(), words32),
            Err(_) => elementwise::copy(buf.bytes_mut(), words),
        }
        HostWords { buf, format }
    }

    /// Rows `ids` (each `width` wide) widened to f32, one after another.
    fn gather(&self, ids: &[u32], width: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(ids.len() * width);
        for &id in ids {
            let row = id as usize * width..(id as usize + 1) * width;
            match self.format {
                None => out.extend_from_slice(&self.buf.as_slice::<f32>()[row]),
                Some(format) => out.extend(self.buf.as_slice::<u16>()[row].iter().map(|&bits| format.to_f32(bits))),
            }
        }
        out
    }

    /// Writes elements `range` into device tensor `t` (f32; 16-bit words are widened on arrival).
    fn upload<D: Backend>(&self, dev: &D, t: &D::Tensor, range: std::ops::Range<usize>) -> Result<()> {
        match self.format {
            None => dev.write(t, &self.buf.as_slice::<f32>()[range]),
            Some(format) => dev.write_16bit(t, &self.buf.as_slice::<u16>()[range], format)?,
        }
        Ok(())
    }
}

/// The head group's vocabulary matrices on the host during a step.
#[derive(Default)]
pub(super) struct VocabHost {
    /// The distinct vocabulary matrices' table indices: the embedding, then the projection if untied
    /// (so the last one is always the projection).
    pub(super) tensors: Vec<usize>,
    /// The working copies of those the device does not hold whole (as uploaded at the start of the
    /// step), by table index: a tied embedding resident as the projection is gathered on the device.
    words: Vec<(usize, HostWords)>,
    /// Their gradients of the current micro-batch (V x C each, allocated on first use).
    pub(super) grads: Vec<Vec<f32>>,
    /// The rows an untied embedding's gradient was given by the last micro-batch (None: any row may
    /// hold a value), the only ones to zero for the next.
    embedding_rows: Option<Vec<u32>>,
}

impl VocabHost {
    /// The output projection's table index, and its place in `tensors` (and `grads`).
    fn projection(&self) -> (usize, usize) {
        let at = self.tensors.len() - 1;
        (self.tensors[at], at)
    }

    fn words_of(&self, tensor: usize) -> Option<&HostWords> {
        self.words.iter().find(|(i, _)| *i == tensor).map(|(_, w)| w)
    }
}

impl<D: Backend> Trainer<'_, D> {
    /// The head group onto the device (its tensors besides the vocabulary matrices, and the output
    /// projection when resident), its vocabulary matrices' words kept on the host for the step.
    pub(super) fn fetch_head(&mut self, clock: &mut Clock) -> Result<()> {
        let (embedding, projection) = self.model.vocab_tensors();
        let vocab_tensors: Vec<usize> = if embedding == projection { vec![embedding] } else { vec![embedding, projection] };
        let resident = self.placement.vocab_resident;
        let on_device = |i: usize| resident && i == projection;
        let keep: Vec<usize> = vocab_tensors.iter().copied().filter(|&i| !on_device(i)).collect();
        let d = &self.device;
        let tensors: Vec<Option<&D::Tensor>> =
            (0..d.head.len()).map(|i| if vocab_tensors.contains(&i) && !on_device(i) { None } else { Some(&d.head[i]) }).collect();
        // The last step's copies are overwritten with the new ones, never held beside them.
        let spares = std::mem::take(&mut self.vocab.words);
        let words = self.upload_group_keeping(0, &tensors, &keep, spares, clock)?;
        self.vocab.words = keep.into_iter().zip(words).collect();
        self.vocab.tensors = vocab_tensors;
        Ok(())
    }

    /// x = the embedding of the micro-batch's tokens (`ids` on the host, `tokens` on the device) into
    /// `residual[0]`: their rows gathered on the host and uploaded, the rest
    /// ([`crate::model::Model::embed_rows_forward`]) on the device — or all on the device when the
    /// embedding is resident there (tied to a resident projection): the same sums either way.
    pub(super) fn embed(&self, ids: &[u32], tokens: &D::Tokens, dropout: Option<&DropoutKeys>, clock: &mut Clock) -> Result<()> {
        let (dev, d, width, seq_len) = (self.dev, &self.device, self.model.width(), self.train.seq_len);
        if let Some((i, id)) = ids.iter().enumerate().find(|&(_, &id)| id as usize >= self.model.vocab_size()) {
            bail!("token id {id} (position {i} of the micro-batch) is outside the model's vocabulary of {} ids", self.model.vocab_size());
        }
        let Some(words) = self.vocab.words_of(self.vocab.tensors[0]) else {
            timed(&mut clock.compute, || self.model.embed_forward(dev, &d.residual[0], &d.head, &d.head_acts, tokens, seq_len, dropout));
            return Ok(());
        };
        let rows = timed(&mut clock.upload, || words.gather(ids, width));
        timed(&mut clock.upload, || dev.write(&d.embed_rows, &rows));
        clock.upload_bytes += 4 * rows.len() as u64;
        timed(&mut clock.compute, || {
            self.model.embed_rows_forward(dev, &d.residual[0], &d.embed_rows, &d.head, &d.head_acts, &d.positions, seq_len, dropout)
        });
        Ok(())
    }

    /// Chunk j's rows of the output projection on the device: the resident matrix, or chunk j uploaded
    /// into the slot.
    fn projection_rows(&self, j: usize, upload: bool, clock: &mut Clock) -> Result<Rows<'_, D::Tensor>> {
        let d = &self.device;
        let (projection, _) = self.vocab.projection();
        match &d.vocab_slot {
            None => Ok(Rows::Whole(&d.head[projection])),
            Some(slot) => {
                if upload {
                    let words = self.vocab.words_of(projection).expect("a streamed projection is kept on the host");
                    let width = self.model.width();
                    let ids = self.model.vocab_chunks(self.train.vocab_chunk_rows).range(j);
                    timed(&mut clock.upload, || words.upload(self.dev, slot, ids.start * width..ids.end * width))?;
                    clock.upload_bytes += (ids.len() * width * self.train.precision.working_bytes_per_param()) as u64;
                }
                Ok(Rows::Chunk(slot))
            }
        }
    }

    /// The final norm, the output projection and the mean loss of the last block's output against
    /// `targets`, chunk by chunk. With `loss_grad_scale`, also their backward: each chunk's projection
    /// gradient stored into the host's micro-batch gradient, and d(last block's output) left in the
    /// head's residual gradient.
    pub(super) fn head_loss(&mut self, targets: &D::Tokens, loss_grad_scale: Option<f32>, clock: &mut Clock) -> Result<f32> {
        let (dev, model, width) = (self.dev, &self.model, self.model.width());
        let n_layer = model.n_layer();
        let d = &self.device;
        let acts = &d.head_acts;
        let (loss_acts, h) = (model.loss_acts(acts), model.final_hidden(acts));
        let n_chunks = loss_acts.chunks.count();
        timed(&mut clock.compute, || model.final_norm_forward(dev, &d.head, acts, &d.residual[n_layer]));
        for j in 0..n_chunks {
            let w = self.projection_rows(j, true, clock)?;
            timed(&mut clock.compute, || vocab::forward_chunk(dev, loss_acts, h, w, targets, j, width));
        }
        let loss = timed(&mut clock.compute, || vocab::finish_loss(dev, loss_acts));
        let Some(scale) = loss_grad_scale else { return Ok(loss) };
        // Backward in reverse chunk order: the last chunk uploaded is still in the slot. Each chunk's
        // projection gradient is read back while the next chunk computes: its read begins (its kernels
        // and the copy submitted, so the next chunk's may reuse the buffer), then the chunk before's is
        // stored into the host's gradient while the device runs this one.
        let (_, staged) = self.vocab.projection();
        let mut in_flight: Option<(D::PendingRead, std::ops::Range<usize>)> = None;
        for (i, j) in (0..n_chunks).rev().enumerate() {
            let w = self.projection_rows(j, i > 0, clock)?;
            let d = &self.device;
            timed(&mut clock.compute, || {
                if !loss_acts.keep_logits && i > 0 {
                    vocab::logits_chunk(dev, loss_acts, h, w, j, width);
                }
                vocab::grad_chunk(dev, loss_acts, targets, j, scale);
                vocab::backward_chunk(
                    dev,
                    loss_acts,
                    h,
                    model.final_hidden_grad(acts),
                    w,
                    Rows::Chunk(&d.vocab_grad),
                    false,
                    j,
                    i == 0,
                    width,
                );
            });
            let pending = timed(&mut clock.download, || dev.begin_read(&[&d.vocab_grad]));
            let ids = loss_acts.chunks.range(j);
            clock.download_bytes += 4 * (ids.len() * width) as u64;
            if let Some((before, ids)) = in_flight.replace((pending, ids)) {
                let rows = &mut self.vocab.grads[staged][ids.start * width..ids.end * width];
                timed(&mut clock.download, || store_chunk_grad(dev, rows, before));
            }
        }
        if let Some((last, ids)) = in_flight {
            let rows = &mut self.vocab.grads[staged][ids.start * width..ids.end * width];
            timed(&mut clock.download, || store_chunk_grad(dev, rows, last));
        }
        let d = &self.device;
        timed(&mut clock.compute, || model.final_norm_backward(dev, &d.head, &d.head_grads, acts, &d.residual[n_layer]));
        Ok(loss)
    }

    /// Backward of [`Self::embed`]: the embedding's row gradients downloaded and added into the host's
    /// micro-batch gradient at the tokens' rows, in token order.
    pub(super) fn embed_backward(&mut self, ids: &[u32], dropout: Option<&DropoutKeys>, clock: &mut Clock) -> Result<()> {
        let (dev, d, width) = (self.dev, &self.device, self.model.width());
        let d_rows = timed(&mut clock.compute, || self.model.embed_rows_backward(dev, &d.head_grads, &d.head_acts, &d.positions, dropout));
        let pending = timed(&mut clock.download, || dev.begin_read(&[d_rows]));
        let d_rows = timed(&mut clock.download, || dev.finish_read(pending)).pop().expect("one tensor read");
        clock.download_bytes += 4 * d_rows.len() as u64;
        let sum = &mut self.vocab.grads[0];
        for (&id, g) in ids.iter().zip(d_rows.chunks_exact(width)) {
            sum[id as usize * width..][..width].iter_mut().zip(g).for_each(|(s, g)| *s += g);
        }
        if self.vocab.tensors.len() == 2 {
            self.vocab.embedding_rows = Some(ids.to_vec());
        }
        dev.recycle(vec![d_rows]);
        Ok(())
    }

    /// The host's vocabulary gradients at the start of a micro-batch: an untied embedding's zeroed (its
    /// rows are scattered into); the projection's is stored whole by the head's backward.
    pub(super) fn clear_vocab_grads(&mut self) {
        let (len, width) = (self.model.vocab_size() * self.model.width(), self.model.width());
        let untied = self.vocab.tensors.len() == 2;
        self.vocab.grads.resize_with(self.vocab.tensors.len(), Vec::new);
        let rows = self.vocab.embedding_rows.take();
        for (k, g) in self.vocab.grads.iter_mut().enumerate() {
            if untied && k == 0 && g.len() == len {
                match &rows {
                    // Only the last micro-batch's tokens' rows hold values: a (V, C) fill for every
                    // micro-batch would cost more than the scatter it clears.
                    Some(ids) => ids.iter().for_each(|&id| g[id as usize * width..][..width].fill(0.0)),
                    None => g.fill(0.0),
                }
            }
            g.resize(len, 0.0);
        }
    }

    /// The head group's gradient of the micro-batch into the accumulator (`first`, `last`: of the
    /// step, as [`Self::accumulate`] takes them): its device tensors downloaded, the vocabulary
    /// matrices' from the host's. Each micro-batch's is added on its own, as the blocks' are, so the
    /// sum runs in the micro-batches' global order at every world size.
    pub(super) fn download_head(&mut self, first: bool, last: bool, clock: &mut Clock) -> Result<bool> {
        let d = &self.device;
        let pending = timed(&mut clock.download, || dev_read_all(self.dev, &d.head_grads));
        let mut grads = timed(&mut clock.download, || self.dev.finish_read(pending));
        for (k, &i) in self.vocab.tensors.iter().enumerate() {
            grads[i] = std::mem::take(&mut self.vocab.grads[k]);
        }
        let overflow = self.add_grads(0, &grads, first, last, clock)?;
        for (k, &i) in self.vocab.tensors.clone().iter().enumerate() {
            self.vocab.grads[k] = std::mem::take(&mut grads[i]);
        }
        self.dev.recycle(grads);
        Ok(overflow)
    }
}

/// A chunk's projection gradient, read back by `pending`, stored into its rows of the host's
/// micro-batch gradient (it is dense: every row gets a value, nothing needs zeroing), straight out of
/// the read-back memory (see `Trainer::accumulate`).
fn store_chunk_grad<D: Backend>(dev: &D, rows: &mut [f32], pending: D::PendingRead) {
    dev.finish_read_with(pending, |chunk_grad| elementwise::copy(rows, &chunk_grad[0][..rows.len()]))
}

fn dev_read_all<D: Backend>(dev: &D, tensors: &[D::Tensor]) -> D::PendingRead {
    let refs: Vec<&D::Tensor> = tensors.iter().collect();
    dev.begin_read(&refs)
}

#[cfg(test)]
mod tests {
    use super::HostWords;
    use crate::device::HalfFormat;
    use zerostream_offload::AlignedBuf;

    /// The step's copy lands in the last step's buffer where it has the length (no new pages), else in
    /// one the pinning closure makes, else in a new one; the words are the source's either way.
    #[test]
    fn host_copies_reuse_the_last_steps_buffer() {
        let words: Vec<f32> = (0..100_003).map(|i| i as f32 * 0.5).collect();
        let bytes: &[u8] = bytemuck::cast_slice(&words);
        let unpinned = |_| None;
        let last = HostWords::copy_of(&vec![7u8; bytes.len()], None, None, unpinned);
        let at = last.buf.bytes().as_ptr();
        let copy = HostWords::copy_of(bytes, None, Some(last), |_| panic!("reused, not made"));
        assert_eq!((copy.buf.bytes().as_ptr(), copy.buf.as_slice::<f32>()), (at, &words[..]));
        let made = std::cell::Cell::new(0);
        let copy = HostWords::copy_of(&bytes[4..], None, Some(copy), |n| {
            made.set(n);
            Some(AlignedBuf::zeroed(n))
        });
        assert_eq!((made.get(), copy.buf.as_slice::<f32>()), (bytes.len() - 4, &words[1..]));
        let halves: Vec<u16> = (0..5000).collect();
        let copy = HostWords::copy_of(bytemuck::cast_slice(&halves), Some(HalfFormat::Bf16), Some(copy), unpinned);
        assert_eq!(copy.buf.as_slice::<u16>(), &halves[..]);
        assert_eq!(copy.gather(&[2], 3), [6u16, 7, 8].map(|h| HalfFormat::Bf16.to_f32(h)));
    }
}
