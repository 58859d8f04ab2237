//! Collectives between ranks: the few operations ZeRO needs, behind one small trait with two
//! implementations — [`local`] (ranks as threads of one process, exchanging through shared memory) and
//! `mpi` (processes under `mpirun`, through the `mpi` crate; cargo feature `mpi`).
//!
//! The trait moves bytes only. Every reduction is done here, on top of it, in one fixed order: a
//! reduce-scatter is an all-to-all exchange of slices followed by a local sum in rank order
//! (rank 0's slice + rank 1's + ...), and a scalar all-reduce gathers every rank's value and sums them
//! the same way. So the numbers never depend on the transport or on MPI's choice of algorithm:
//! in-process and MPI runs of the same world size are bit-identical.

pub mod codec;
pub mod compress;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
mod reduce;

pub use reduce::Onto;

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use zerostream_offload::square_sums::SquareSums;

/// Moves bytes between the ranks of one world. Every rank calls the same collectives in the same
/// order; a rank that fails calls [`Collectives::abort`] so that the others stop instead of waiting.
pub trait Collectives: Send {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// `out[r*n..(r+1)*n]` = rank r's `mine` (n = `mine.len()`, the same on every rank).
    fn all_gather_bytes(&self, mine: &[u8], out: &mut [u8]) -> Result<()>;
    /// Personalised exchange: `send` is world_size chunks of n bytes, chunk s for rank s;
    /// `recv[r*n..(r+1)*n]` receives what rank r sent to this rank.
    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<()>;
    /// `buf` = root's `buf`, on every rank.
    fn broadcast_bytes(&self, root: usize, buf: &mut [u8]) -> Result<()>;
    fn barrier(&self) -> Result<()>;
    /// Tells every other rank that this one failed, with why, so that none of them hangs in a
    /// collective (in-process: they return an error naming this rank; MPI: the job is aborted).
    fn abort(&self, message: &str);
    /// One line naming the transport ("in-process, 2 ranks", "MPI, 4 processes").
    fn describe(&self) -> String;
    /// A second, independent channel over the same ranks, for another thread of each rank: its
    /// collectives never match this one's. Collective: every rank calls it at the same point.
    fn split(&self) -> Result<Box<dyn Collectives>>;
}

/// The error a rank gets in a collective when another rank has failed: names that rank and its error.
#[derive(Debug)]
pub struct PeerFailed {
    pub rank: usize,
    pub why: String,
}

impl std::fmt::Display for PeerFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} failed: {}", self.rank, self.why)
    }
}

impl std::error::Error for PeerFailed {}

/// Bytes and seconds spent in collectives, counted by [`Comm`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommStats {
    /// Bytes this rank sent to other ranks (its own slice, which stays, is not counted).
    pub sent_bytes: u64,
    /// Of `sent_bytes`, the gradients' (reduce-scatters, compressed where they are).
    pub grad_sent_bytes: u64,
    /// Of `sent_bytes`, the working copy's (all-gathers of parameters).
    pub param_sent_bytes: u64,
    pub seconds: f64,
    /// Of `seconds`, the part spent while the device still had work in flight (so hidden behind it).
    pub overlapped_seconds: f64,
    /// Seconds spent encoding and decoding compressed exchanges (not in `seconds`, which is the
    /// transport's).
    pub codec_seconds: f64,
}

impl std::ops::Sub for CommStats {
    type Output = CommStats;
    fn sub(self, o: CommStats) -> CommStats {
        CommStats {
            sent_bytes: self.sent_bytes - o.sent_bytes,
            grad_sent_bytes: self.grad_sent_bytes - o.grad_sent_bytes,
            param_sent_bytes: self.param_sent_bytes - o.param_sent_bytes,
            seconds: self.seconds - o.seconds,
            overlapped_seconds: self.overlapped_seconds - o.overlapped_seconds,
            codec_seconds: self.codec_seconds - o.codec_seconds,
        }
    }
}

/// Largest chunk one transport call moves per rank: MPI counts are 32-bit, and bounded chunks keep the
/// in-process exchange's temporary copies small.
const MAX_CHUNK_BYTES: usize = 256 << 20;

/// A rank's handle on its world: the typed collectives the trainer uses, built on a [`Collectives`]
/// transport, with the deterministic reductions and the traffic counters.
pub struct Comm {
    transport: Box<dyn Collectives>,
    stats: Cell<CommStats>,
    /// The reduce-scatter's receive buffer, kept between calls (it runs once per block per micro-batch).
    received: RefCell<Vec<f32>>,
    /// The all-reduce's slice of sums, kept the same way.
    reduced: RefCell<Vec<f32>>,
    /// The compressed reduce-scatter's send and receive bytes, kept the same way (the compressed
    /// all-reduce and working-copy gather, `all_gather_encoded`, use them too).
    wire: RefCell<(Vec<u8>, Vec<u8>)>,
}

/// What a counted collective moved, for the split of [`CommStats::sent_bytes`].
#[derive(Clone, Copy, PartialEq)]
enum Traffic {
    Grads,
    Params,
    Other,
}

impl Comm {
    pub fn new(transport: Box<dyn Collectives>) -> Self {
        Comm {
            transport,
            stats: Cell::new(CommStats::default()),
            received: RefCell::default(),
            reduced: RefCell::default(),
            wire: RefCell::default(),
        }
    }

    /// A world of one: every collective is a copy.
    pub fn single() -> Self {
        Comm::new(Box::new(local::LocalWorld::new(1).pop().expect("one rank")))
    }

    pub fn rank(&self) -> usize {
        self.transport.rank()
    }
    pub fn world_size(&self) -> usize {
        self.transport.world_size()
    }
    pub fn describe(&self) -> String {
        self.transport.describe()
    }
    pub fn stats(&self) -> CommStats {
        self.stats.get()
    }
    pub fn abort(&self, message: &str) {
        self.transport.abort(message)
    }
    pub fn barrier(&self) -> Result<()> {
        self.transport.barrier()
    }

    /// Runs `f`, a codec's encoding or decoding, counting its time in [`CommStats::codec_seconds`].
    pub fn time_codec<R>(&self, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = f();
        let mut stats = self.stats.get();
        stats.codec_seconds += start.elapsed().as_secs_f64();
        self.stats.set(stats);
        r
    }

    fn count<R>(&self, sent_bytes: usize, traffic: Traffic, device_busy: bool, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let start = Instant::now();
        let r = f();
        let s = start.elapsed().as_secs_f64();
        let mut stats = self.stats.get();
        stats.sent_bytes += sent_bytes as u64;
        match traffic {
            Traffic::Grads => stats.grad_sent_bytes += sent_bytes as u64,
            Traffic::Params => stats.param_sent_bytes += sent_bytes as u64,
            Traffic::Other => {}
        }
        stats.seconds += s;
        if device_busy {
            stats.overlapped_seconds += s;
        }
        self.stats.set(stats);
        r
    }

    /// `out[r*n..(r+1)*n]` = rank r's `mine`, for plain-old-data elements.
    pub fn all_gather<T: bytemuck::Pod>(&self, mine: &[T], out: &mut [T], device_busy: bool) -> Result<()> {
        self.all_gather_counted(mine, out, Traffic::Other, device_busy)
    }

    /// [`Comm::all_gather`] of the working copy (counted in [`CommStats::param_sent_bytes`]).
    pub fn all_gather_params<T: bytemuck::Pod>(&self, mine: &[T], out: &mut [T], device_busy: bool) -> Result<()> {
        self.all_gather_counted(mine, out, Traffic::Params, device_busy)
    }

    /// [`Comm::all_gather_params`] of encoded bytes, `encoded_bytes` from every rank: `encode` writes
    /// this rank's into the send buffer, then `decode(bytes)` reads every rank's, one call each in rank order,
    /// both timed as codec work ([`CommStats::codec_seconds`]). The buffers are the compressed
    /// reduce-scatter's, kept between calls.
    pub fn all_gather_encoded(
        &self,
        encoded_bytes: usize,
        encode: impl FnOnce(&mut [u8]),
        decode: impl FnMut(&[u8]),
        device_busy: bool,
    ) -> Result<()> {
        let mut wire = self.wire.borrow_mut();
        let (send, recv) = &mut *wire;
        send.resize(encoded_bytes, 0);
        recv.resize(self.world_size() * encoded_bytes, 0);
        self.time_codec(|| encode(send));
        self.all_gather_params(send.as_slice(), recv, device_busy)?;
        self.time_codec(|| recv.chunks_exact(encoded_bytes.max(1)).for_each(decode));
        Ok(())
    }

    fn all_gather_counted<T: bytemuck::Pod>(&self, mine: &[T], out: &mut [T], traffic: Traffic, device_busy: bool) -> Result<()> {
        let world = self.world_size();
        if out.len() != world * mine.len() {
            bail!("all-gather: {} elements out for {} ranks of {}", out.len(), world, mine.len());
        }
        let (mine, out): (&[u8], &mut [u8]) = (bytemuck::cast_slice(mine), bytemuck::cast_slice_mut(out));
        let n = mine.len();
        self.count((world - 1) * n, traffic, device_busy, || {
            if n <= MAX_CHUNK_BYTES {
                return self.transport.all_gather_bytes(mine, out);
            }
            let mut tmp = vec![0u8; world * MAX_CHUNK_BYTES];
            for start in (0..n).step_by(MAX_CHUNK_BYTES) {
                let c = MAX_CHUNK_BYTES.min(n - start);
                self.transport.all_gather_bytes(&mine[start..start + c], &mut tmp[..world * c])?;
                for r in 0..world {
                    out[r * n + start..r * n + start + c].copy_from_slice(&tmp[r * c..(r + 1) * c]);
                }
            }
            Ok(())
        })
    }

    /// The ranks whose `x` differs from rank 0's (every rank gets the same answer): with
    /// [`fingerprint`], which ranks were given something else.
    pub fn ranks_differing(&self, x: u64) -> Result<Vec<usize>> {
        Ok(self.ranks_differing_each(&[x])?.pop().unwrap_or_default())
    }

    /// [`Comm::ranks_differing`] for each of `xs` (as many on every rank), in one collective.
    pub fn ranks_differing_each(&self, xs: &[u64]) -> Result<Vec<Vec<usize>>> {
        let mut all = vec![0u64; xs.len() * self.world_size()];
        self.all_gather(xs, &mut all, false)?;
        let rank = |r: usize| &all[r * xs.len()..(r + 1) * xs.len()];
        Ok((0..xs.len()).map(|i| (0..self.world_size()).filter(|&r| rank(r)[i] != rank(0)[i]).collect()).collect())
    }

    /// Every rank's value of `x`, in rank order.
    pub fn gather_scalars<T: bytemuck::Pod + Default>(&self, x: T) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.world_size()];
        self.all_gather(&[x], &mut out, false)?;
        Ok(out)
    }

    /// The sum over ranks of `x`, added in rank order (the same bits on every rank and transport).
    pub fn sum_f64(&self, x: f64) -> Result<f64> {
        Ok(self.gather_scalars(x)?.into_iter().fold(0.0, |a, b| a + b))
    }

    /// The element-wise sum over ranks of `xs` (the same length on every rank), in rank order.
    pub fn sum_f64s(&self, xs: &[f64]) -> Result<Vec<f64>> {
        let n = xs.len();
        let mut all = vec![0.0f64; n * self.world_size()];
        self.all_gather(xs, &mut all, false)?;
        let mut sum = vec![0.0f64; n];
        for rank in all.chunks_exact(n.max(1)) {
            sum.iter_mut().zip(rank).for_each(|(s, x)| *s += x);
        }
        Ok(sum)
    }

    /// The element-wise sum over ranks of `sums` (as many on every rank): exact, so the same bits on
    /// every rank and transport, and at every world size however the ranks' slices cut the values.
    pub fn sum_square_sums(&self, sums: &[SquareSums]) -> Result<Vec<SquareSums>> {
        if self.world_size() == 1 {
            return Ok(sums.to_vec());
        }
        let mine: Vec<u64> = sums.iter().flat_map(|s| s.to_words()).collect();
        let mut all = vec![0u64; mine.len() * self.world_size()];
        self.all_gather(&mine, &mut all, false)?;
        let mut total = vec![SquareSums::default(); sums.len()];
        for rank in all.chunks_exact(mine.len().max(1)) {
            for (t, words) in total.iter_mut().zip(rank.chunks_exact(SquareSums::WORDS)) {
                t.add(&SquareSums::from_words(words));
            }
        }
        Ok(total)
    }

    /// A second [`Comm`] over the same ranks, independent of this one, for another thread (the
    /// optimizer's): collective, every rank calls it at the same point.
    pub fn split(&self) -> Result<Comm> {
        Ok(Comm::new(self.transport.split()?))
    }

    /// Whether `flag` is set on any rank.
    pub fn any(&self, flag: bool) -> Result<bool> {
        Ok(self.gather_scalars(flag as u8)?.contains(&1))
    }

    /// `buf` = root's `buf` on every rank.
    pub fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        let sent = if self.rank() == root { (self.world_size() - 1) * buf.len() } else { 0 };
        self.count(sent, Traffic::Other, false, || {
            for chunk in buf.chunks_mut(MAX_CHUNK_BYTES) {
                self.transport.broadcast_bytes(root, chunk)?;
            }
            Ok(())
        })
    }
}

/// How long a rank waits in a collective for the others before it names the ones that never came.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(600);

/// `--all-reduce-phases`: how stage 0's compressed all-reduce runs ([`Comm::all_reduce_sum_compressed`]).
/// Two phases send `2 (world - 1) / world` encodings of the whole per rank where one sends
/// `world - 1`, but compress the other ranks' parts twice: on 4 ranks the small models' loss gap to
/// `none` doubled (benches/results/2026-11-28-frozen-variance.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum AllReducePhases {
    /// Two phases from 3 ranks on (fewer bytes), one at 2 (as many bytes, one compression).
    #[default]
    Auto,
    /// One phase at every world size.
    #[value(name = "1")]
    One,
    /// Two phases at every world size.
    #[value(name = "2")]
    Two,
}

impl AllReducePhases {
    /// Whether the all-reduce takes two phases at `world` ranks.
    pub fn two_at(self, world: usize) -> bool {
        match self {
            AllReducePhases::Auto => world > 2,
            AllReducePhases::One => false,
            AllReducePhases::Two => world > 1,
        }
    }
}

/// The world size an MPI launcher gave this process, read from the variables the launchers
/// set (OpenMPI, MPICH), so that a binary built without MPI can still tell it was started by `mpirun`.
pub fn launcher_world_size() -> Option<usize> {
    env_count(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
}

/// This process's rank under an MPI launcher (OpenMPI or MPICH/PMI), from the same environment; 0
/// outside one.
pub fn launcher_rank() -> usize {
    env_count(&["OMPI_COMM_WORLD_RANK", "PMI_RANK"]).unwrap_or(0)
}

/// This process's rank among the job's processes on this machine (0 outside a launcher).
pub fn launcher_local_rank() -> usize {
    env_count(&["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"]).unwrap_or(0)
}

/// The processes of this job on this machine, from the launcher's environment (None: not launched).
pub fn launcher_local_size() -> Option<usize> {
    env_count(&["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"])
}

fn env_count(vars: &[&str]) -> Option<usize> {
    vars.iter().find_map(|v| std::env::var(v).ok()).and_then(|s| s.trim().parse().ok())
}

/// FNV-1a of `bytes`: the same on every process of any build, so ranks compare what they were given
/// ([`Comm::ranks_differing`]) without sending it.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}
