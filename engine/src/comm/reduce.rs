//! The sums over ranks, each in one fixed order on top of the byte-moving collectives: the
//! reduce-scatter (an all-to-all exchange of slices, then a local sum in rank order), the all-reduce,
//! and their compressed forms (each rank's contribution encoded with its error feedback, gathered,
//! decoded and summed in rank order). See the parent module for why the order is fixed here.

use anyhow::{Result, bail};

use super::compress::{Codec, GradCompression};
use super::{Comm, MAX_CHUNK_BYTES, Traffic};

/// What [`Comm::sum_exchanged`] does with what its output holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Onto {
    /// The sum replaces it.
    Replace,
    /// The slices are added onto it, one rank at a time.
    Add,
}

impl Comm {
    /// Reduce-scatter of f32: `full` is world_size slices of n = `out.len()` elements; `out` becomes the
    /// sum over ranks of their slice `rank`, added in rank order: ((s_0 + s_1) + s_2) + ...
    pub fn reduce_scatter_sum(&self, full: &[f32], out: &mut [f32], device_busy: bool) -> Result<()> {
        self.exchange_slices(full, out.len(), device_busy)?;
        self.sum_exchanged(out, Onto::Replace)
    }

    /// The first half of a reduce-scatter: rank r's slice of `full` (n elements each) sent to rank r,
    /// and this rank's slice of every rank's received, kept until [`Comm::sum_exchanged`]. Apart, so
    /// the sum can go where a lock or a page-in is held only for it, and the exchange overlap what
    /// the caller waits for before.
    pub fn exchange_slices(&self, full: &[f32], n: usize, device_busy: bool) -> Result<()> {
        let world = self.world_size();
        if full.len() != world * n {
            bail!("reduce-scatter: {} elements in for {} ranks of {}", full.len(), world, n);
        }
        let mut received = self.received.borrow_mut();
        received.clear();
        if world == 1 {
            received.extend_from_slice(full);
            return Ok(());
        }
        received.resize(world * n, 0.0);
        let chunk = (MAX_CHUNK_BYTES / 4).max(1);
        self.count((world - 1) * n * 4, Traffic::Grads, device_busy, || {
            for start in (0..n).step_by(chunk) {
                let c = chunk.min(n - start);
                let send: Vec<f32>;
                let send_slice: &[f32] = if c == n {
                    full
                } else {
                    send = (0..world).flat_map(|s| full[s * n + start..s * n + start + c].iter().copied()).collect();
                    &send
                };
                let recv = &mut received[world * start..world * (start + c)];
                self.transport.all_to_all_bytes(bytemuck::cast_slice(send_slice), bytemuck::cast_slice_mut(recv))?;
            }
            Ok(())
        })
    }

    /// The second half: `out` = the received slices summed in rank order, ((s_0 + s_1) + s_2) + ...,
    /// or with [`Onto::Add`] added onto what `out` holds one rank at a time, ((out + s_0) + s_1) + ...
    /// The latter sums a step's micro-batches, exchanged one accumulation index at a time, in the
    /// order of their global index at every world size, as one rank adds them (the training contract
    /// gives micro-batch j to rank j % world at accumulation index j / world).
    pub fn sum_exchanged(&self, out: &mut [f32], onto: Onto) -> Result<()> {
        let (world, n) = (self.world_size(), out.len());
        let received = self.received.borrow();
        if received.len() != world * n {
            bail!("internal: {} elements received for {world} ranks' slices of {n}", received.len());
        }
        // `received` holds, chunk by chunk, each rank's part of this rank's slice.
        let chunk = (MAX_CHUNK_BYTES / 4).max(1);
        for start in (0..n).step_by(chunk) {
            let c = chunk.min(n - start);
            let parts = &received[world * start..world * (start + c)];
            let o = &mut out[start..start + c];
            // Replacing, rank 0's part is stored and the others added; adding, every rank's is added.
            let first_added = match onto {
                Onto::Replace => {
                    o.copy_from_slice(&parts[..c]);
                    1
                }
                Onto::Add => 0,
            };
            for r in first_added..world {
                o.iter_mut().zip(&parts[r * c..(r + 1) * c]).for_each(|(a, b)| *a += b);
            }
        }
        Ok(())
    }

    /// [`Comm::reduce_scatter_sum`] with the slices bound for other ranks encoded by `codec`, with error
    /// feedback: `residual` holds what earlier encodings of each slice sent dropped (world - 1 slices:
    /// those of the other ranks in rank order, this rank's skipped); it is added in before encoding and
    /// replaced by what this encoding drops. This rank's own slice crosses no wire and is summed
    /// exactly. Every rank decodes the same bytes, so the rank-order sum is the same on every
    /// transport. `none` is [`Comm::reduce_scatter_sum`] itself (`residual` untouched).
    pub fn reduce_scatter_sum_compressed(
        &self,
        full: &[f32],
        out: &mut [f32],
        codec: &Codec,
        residual: &mut [f32],
        device_busy: bool,
    ) -> Result<()> {
        let (world, n, me) = (self.world_size(), out.len(), self.rank());
        if codec.mode == GradCompression::None || world == 1 {
            return self.reduce_scatter_sum(full, out, device_busy);
        }
        if full.len() != world * n || residual.len() != (world - 1) * n {
            bail!("reduce-scatter: {} elements in and {} of residual for {} ranks of {}", full.len(), residual.len(), world, n);
        }
        let mut wire = self.wire.borrow_mut();
        let (send, recv) = &mut *wire;
        // Pieces of a fixed element count, whatever the transport: a piece is what topk chooses among.
        let piece = MAX_CHUNK_BYTES / 4;
        for start in (0..n).step_by(piece) {
            let c = piece.min(n - start);
            let eb = codec.encoded_bytes(c);
            send.resize(world * eb, 0);
            recv.resize(world * eb, 0);
            self.time_codec(|| {
                for s in (0..world).filter(|&s| s != me) {
                    let slot = if s < me { s } else { s - 1 };
                    let (slice, kept) = (s * n + start..s * n + start + c, slot * n + start..slot * n + start + c);
                    codec.encode_with_feedback(&full[slice], &mut residual[kept], &mut send[s * eb..(s + 1) * eb]);
                }
            });
            self.count((world - 1) * eb, Traffic::Grads, device_busy, || self.transport.all_to_all_bytes(&send[..], &mut recv[..]))?;
            // The rank-order sum, each part decoded straight onto it.
            let o = &mut out[start..start + c];
            let own = &full[me * n + start..me * n + start + c];
            self.time_codec(|| {
                for r in 0..world {
                    match (r == me, r == 0) {
                        (true, true) => o.copy_from_slice(own),
                        (true, false) => o.iter_mut().zip(own).for_each(|(a, b)| *a += b),
                        (false, true) => codec.decode(&recv[..eb], o),
                        (false, false) => codec.decode_add(&recv[r * eb..(r + 1) * eb], o),
                    }
                }
            });
        }
        Ok(())
    }

    /// All-reduce of f32: `out` (as long as `full`) becomes the sum over ranks of their `full`, added in
    /// rank order: a [`Comm::reduce_scatter_sum`] into this rank's slice (`full.len()` must be a
    /// multiple of the world size), then the slices gathered. Every element is summed exactly as the
    /// reduce-scatter sums it, so every rank holds the same bits.
    pub fn all_reduce_sum(&self, full: &[f32], out: &mut [f32], device_busy: bool) -> Result<()> {
        let world = self.world_size();
        if out.len() != full.len() || !full.len().is_multiple_of(world) {
            bail!("all-reduce: {} elements in, {} out, for {world} ranks", full.len(), out.len());
        }
        // Taken out of its cell for the two calls, which borrow the others.
        let mut mine = std::mem::take(&mut *self.reduced.borrow_mut());
        mine.resize(full.len() / world, 0.0);
        let r = self.reduce_scatter_sum(full, &mut mine, device_busy);
        let r = r.and_then(|_| self.all_gather_counted(&mine, out, Traffic::Grads, device_busy));
        *self.reduced.borrow_mut() = mine;
        r
    }

    /// [`Comm::all_reduce_sum`] with the gradient encoded by `codec`, with error feedback: `out` = the
    /// same bits on every rank and transport, near the sum over ranks of their `full`. `residual` (as
    /// long as `full`) holds what earlier encodings dropped, added in before encoding and replaced by
    /// what this one drops. Two ways (`two_phases`, from [`AllReducePhases`]):
    /// - **one phase**: each rank's whole `full` encoded and the encodings gathered; every
    ///   rank decodes all of them, its own too, and sums in rank order. `(world - 1)` encodings of the
    ///   whole sent per rank;
    /// - **two phases** (as 1-bit Adam's compressed all-reduce): the compressed
    ///   reduce-scatter ([`Comm::reduce_scatter_sum_compressed`], `residual`'s first `world - 1`
    ///   slices its worker residual), then each rank's summed slice encoded again (the last slice of
    ///   `residual` its server residual) and the encodings gathered, every rank decoding every slice,
    ///   its own too. `2 (world - 1) / world` encodings of the whole sent per rank.
    ///
    /// `none` is [`Comm::all_reduce_sum`] (`residual` untouched).
    pub fn all_reduce_sum_compressed(
        &self,
        full: &[f32],
        out: &mut [f32],
        codec: &Codec,
        residual: &mut [f32],
        two_phases: bool,
        device_busy: bool,
    ) -> Result<()> {
        let (world, n) = (self.world_size(), full.len());
        if codec.mode == GradCompression::None || world == 1 {
            return self.all_reduce_sum(full, out, device_busy);
        }
        if out.len() != n || residual.len() != n || !n.is_multiple_of(world) {
            bail!("all-reduce: {n} elements in, {} out and {} of residual, for {world} ranks", out.len(), residual.len());
        }
        if !two_phases {
            return self.gather_encoded_and_sum(full, out, codec, residual, device_busy);
        }
        let slice = n / world;
        let (worker, server) = residual.split_at_mut((world - 1) * slice);
        // Taken out of its cell for the calls, which borrow the others.
        let mut mine = std::mem::take(&mut *self.reduced.borrow_mut());
        mine.resize(slice, 0.0);
        let r = self.reduce_scatter_sum_compressed(full, &mut mine, codec, worker, device_busy);
        let r = r.and_then(|_| self.gather_encoded_slices(&mine, out, codec, server, device_busy));
        *self.reduced.borrow_mut() = mine;
        r
    }

    /// The one-phase compressed all-reduce: `full` encoded whole (feedback into `residual`), the
    /// encodings gathered, and every rank's decoded and summed in rank order into `out`.
    fn gather_encoded_and_sum(&self, full: &[f32], out: &mut [f32], codec: &Codec, residual: &mut [f32], device_busy: bool) -> Result<()> {
        self.gather_encoded(full, codec, residual, device_busy, |range, encodings, eb| {
            let o = &mut out[range];
            codec.decode(&encodings[..eb], o);
            encodings[eb..].chunks_exact(eb).for_each(|e| codec.decode_add(e, o));
        })
    }

    /// The two-phase all-reduce's second phase: this rank's summed slice `mine` encoded (feedback into
    /// `residual`, as long as it), the encodings gathered, and rank r's decoded into `out`'s slice r.
    fn gather_encoded_slices(&self, mine: &[f32], out: &mut [f32], codec: &Codec, residual: &mut [f32], device_busy: bool) -> Result<()> {
        let slice = mine.len();
        self.gather_encoded(mine, codec, residual, device_busy, |range, encodings, eb| {
            for (r, e) in encodings.chunks_exact(eb).enumerate() {
                codec.decode(e, &mut out[r * slice + range.start..r * slice + range.end]);
            }
        })
    }

    /// `x` encoded piece by piece with error feedback (`residual`, as long as `x`) and each piece's
    /// encodings gathered from every rank; `decode(piece's range in x, the encodings in rank order,
    /// bytes of one)` takes them. Pieces have a fixed element count, as in the reduce-scatter: a piece
    /// is what topk chooses among.
    fn gather_encoded(
        &self,
        x: &[f32],
        codec: &Codec,
        residual: &mut [f32],
        device_busy: bool,
        mut decode: impl FnMut(std::ops::Range<usize>, &[u8], usize),
    ) -> Result<()> {
        let (world, n) = (self.world_size(), x.len());
        let mut wire = self.wire.borrow_mut();
        let (send, recv) = &mut *wire;
        let piece = MAX_CHUNK_BYTES / 4;
        for start in (0..n).step_by(piece) {
            let c = piece.min(n - start);
            let eb = codec.encoded_bytes(c);
            send.resize(eb, 0);
            recv.resize(world * eb, 0);
            let range = start..start + c;
            self.time_codec(|| codec.encode_with_feedback(&x[range.clone()], &mut residual[range.clone()], send));
            self.count((world - 1) * eb, Traffic::Grads, device_busy, || self.transport.all_gather_bytes(send, recv))?;
            self.time_codec(|| decode(range, recv, eb));
        }
        Ok(())
    }
}
