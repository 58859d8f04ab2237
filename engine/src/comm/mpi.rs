//! MPI ranks: one process per rank under `mpirun`, exchanging through the `mpi` crate (OpenMPI).
//!
//! Only byte movement goes through MPI (all-gather, all-to-all, broadcast, barrier); the sums are done
//! in rank order by [`super::Comm`], so MPI's choice of reduction algorithm never changes a result.
//! (One reduction is MPI's own: the start-up minimum of `--params-ram-cache auto`, an integer.)
//! The trainer's collectives are called from its device thread; a layer-wise optimizer (LAMB, LARS)
//! sums its norms from its own thread on a split communicator, so MPI is initialised asking for
//! `MPI_THREAD_MULTIPLE`, and [`Collectives::split`] refuses if the library did not grant it.

use anyhow::Result;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;

use super::Collectives;

/// The MPI environment of this process: initialised once, finalised when dropped.
pub struct MpiWorld {
    _universe: mpi::environment::Universe,
    world: SimpleCommunicator,
}

/// One process's end of an MPI world.
pub struct MpiComm {
    world: SimpleCommunicator,
}

// SAFETY: a communicator handle is a plain value that MPI lets any thread use; the trainer uses each
// one from a single thread at a time, and two threads use two communicators only when MPI granted
// MPI_THREAD_MULTIPLE (`split` checks).
unsafe impl Send for MpiComm {}

impl MpiWorld {
    /// Initialises MPI (None if it was initialised already).
    pub fn init() -> Option<Self> {
        let (universe, _granted) = mpi::initialize_with_threading(mpi::Threading::Multiple)?;
        let world = universe.world();
        Some(MpiWorld { _universe: universe, world })
    }

    pub fn size(&self) -> usize {
        self.world.size() as usize
    }

    pub fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    /// This process's rank among the processes of its node (to pick a GPU adapter).
    pub fn node_local_rank(&self) -> usize {
        self.world.split_shared(self.world.rank()).rank() as usize
    }

    /// How many processes of the job run on this node (to share its cores).
    pub fn node_local_size(&self) -> usize {
        self.world.split_shared(self.world.rank()).size() as usize
    }

    /// The smallest of every process's `mine` (MPI_Allreduce, MPI_MIN).
    pub fn min_u64(&self, mine: u64) -> u64 {
        let mut smallest = 0u64;
        self.world.all_reduce_into(&mine, &mut smallest, mpi::collective::SystemOperation::min());
        smallest
    }

    /// Prints why and stops every process of the job (MPI_Abort).
    pub fn abort(&self, message: &str) -> ! {
        eprintln!("error: {message}; stopping every rank");
        self.world.abort(1)
    }

    /// A handle for the trainer: a duplicate of the world communicator, so that nothing else
    /// this process does with MPI can interleave with the trainer's collectives.
    pub fn comm(&self) -> MpiComm {
        MpiComm { world: self.world.duplicate() }
    }
}

impl MpiComm {
    /// MPI_Allgather of f32, MPI's own algorithm (the reference `bench collectives` compares with).
    pub fn mpi_all_gather(&self, mine: &[f32], out: &mut [f32]) {
        self.world.all_gather_into(mine, out);
    }

    /// MPI_Reduce_scatter_block with MPI_SUM of f32: MPI's own reduction (its order is MPI's choice,
    /// which is why the trainer does not use it).
    pub fn mpi_reduce_scatter_sum(&self, full: &[f32], out: &mut [f32]) {
        self.world.reduce_scatter_block_into(full, out, mpi::collective::SystemOperation::sum());
    }
}

impl Collectives for MpiComm {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }
    fn world_size(&self) -> usize {
        self.world.size() as usize
    }
    fn all_gather_bytes(&self, mine: &[u8], out: &mut [u8]) -> Result<()> {
        self.world.all_gather_into(mine, out);
        Ok(())
    }
    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        self.world.all_to_all_into(send, recv);
        Ok(())
    }
    fn broadcast_bytes(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        self.world.process_at_rank(root as i32).broadcast_into(buf);
        Ok(())
    }
    fn barrier(&self) -> Result<()> {
        self.world.barrier();
        Ok(())
    }
    fn abort(&self, message: &str) {
        eprintln!("error: rank {} failed: {message}; stopping every rank", self.world.rank());
        self.world.abort(1)
    }
    fn describe(&self) -> String {
        format!("MPI, {} processes", self.world.size())
    }
    fn split(&self) -> Result<Box<dyn Collectives>> {
        let granted = mpi::environment::threading_support();
        if granted != mpi::Threading::Multiple {
            anyhow::bail!(
                "this MPI library grants {granted:?} thread support, and a layer-wise optimizer (--optimizer lamb/lars) \
                 needs MPI_THREAD_MULTIPLE: its thread sums norms while the device thread exchanges gradients"
            );
        }
        Ok(Box::new(MpiComm { world: self.world.duplicate() }))
    }
}
