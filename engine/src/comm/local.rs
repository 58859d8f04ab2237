//! In-process ranks: N threads of one process exchanging through shared memory (no sockets).
//!
//! Every collective is one round on a shared table: each rank deposits its buffer, waits until all N
//! have, takes what it needs from the others' deposits, and leaves; the round closes when the last
//! rank leaves, and a rank arriving early for the next round waits for that. A rank that fails marks
//! the table, and every rank waiting in (or later entering) a collective returns an error naming it.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use anyhow::{Result, anyhow};

use super::{Collectives, PEER_TIMEOUT, PeerFailed};

/// What ranks deposit for one round: the bytes they send (and, for broadcast, only the root's).
type Deposit = Option<Arc<Vec<u8>>>;

#[derive(Default)]
struct Round {
    /// True while the current round's deposits are complete and being read.
    full: bool,
    arrived: usize,
    left: usize,
    deposits: Vec<Deposit>,
    /// Which ranks have arrived in this round.
    came: Vec<bool>,
    /// The first rank that failed, and why.
    failed: Option<(usize, String)>,
}

impl Round {
    fn empty(world: usize) -> Self {
        Round { deposits: vec![None; world], came: vec![false; world], ..Round::default() }
    }
}

struct Table {
    world: usize,
    round: Mutex<Round>,
    changed: Condvar,
}

/// One rank's end of an in-process world (a clone is another handle on the same end, for aborting).
#[derive(Clone)]
pub struct LocalComm {
    rank: usize,
    table: Arc<Table>,
}

/// Creates the ranks of an in-process world; hand one to each rank's thread.
pub struct LocalWorld;

impl LocalWorld {
    #[allow(clippy::new_ret_no_self)]
    pub fn new(world: usize) -> Vec<LocalComm> {
        let table = Arc::new(Table { world, round: Mutex::new(Round::empty(world)), changed: Condvar::new() });
        (0..world).map(|rank| LocalComm { rank, table: table.clone() }).collect()
    }
}

impl LocalComm {
    fn lock(&self) -> MutexGuard<'_, Round> {
        self.table.round.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits on the table until `ready` holds, failing if a rank failed or none came for too long.
    fn wait<'a>(&self, mut g: MutexGuard<'a, Round>, what: &str, ready: impl Fn(&Round) -> bool) -> Result<MutexGuard<'a, Round>> {
        let start = Instant::now();
        loop {
            if let Some((rank, why)) = &g.failed {
                return Err(PeerFailed { rank: *rank, why: why.clone() }.into());
            }
            if ready(&g) {
                return Ok(g);
            }
            let waited = start.elapsed();
            if waited >= PEER_TIMEOUT {
                let missing: Vec<usize> = (0..self.table.world).filter(|&r| !g.came[r]).collect();
                return Err(anyhow!("rank {}: no progress in {what} for {} s; waiting for ranks {missing:?}", self.rank, waited.as_secs()));
            }
            g = self.table.changed.wait_timeout(g, PEER_TIMEOUT - waited).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// One round: deposit `mine` (None: nothing to send), then `take` reads the full table.
    fn round(&self, what: &str, mine: Deposit, take: impl FnOnce(&[Deposit])) -> Result<()> {
        let world = self.table.world;
        let g = self.lock();
        // A rank that finished the last round early waits here until every rank has left it.
        let mut g = self.wait(g, what, |r| !r.full)?;
        g.deposits[self.rank] = mine;
        g.came[self.rank] = true;
        g.arrived += 1;
        if g.arrived == world {
            g.full = true;
            self.table.changed.notify_all();
        }
        let mut g = self.wait(g, what, |r| r.full)?;
        let deposits = g.deposits.clone(); // Arcs: the bytes are copied outside the lock
        g.left += 1;
        if g.left == world {
            let failed = g.failed.take();
            *g = Round { failed, ..Round::empty(world) };
            self.table.changed.notify_all();
        }
        drop(g);
        take(&deposits);
        Ok(())
    }
}

fn deposit(bytes: &[u8]) -> Deposit {
    Some(Arc::new(bytes.to_vec()))
}

impl Collectives for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.table.world
    }
    fn all_gather_bytes(&self, mine: &[u8], out: &mut [u8]) -> Result<()> {
        let n = mine.len();
        self.round("all-gather", deposit(mine), |d| {
            for (r, dep) in d.iter().enumerate() {
                out[r * n..(r + 1) * n].copy_from_slice(dep.as_ref().expect("every rank deposits"));
            }
        })
    }
    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let n = send.len() / self.table.world;
        let me = self.rank;
        self.round("all-to-all", deposit(send), |d| {
            for (r, dep) in d.iter().enumerate() {
                recv[r * n..(r + 1) * n].copy_from_slice(&dep.as_ref().expect("every rank deposits")[me * n..(me + 1) * n]);
            }
        })
    }
    fn broadcast_bytes(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        let mine = if self.rank == root { deposit(buf) } else { None };
        let me = self.rank;
        self.round("broadcast", mine, |d| {
            if me != root {
                buf.copy_from_slice(d[root].as_ref().expect("the root deposits"));
            }
        })
    }
    fn barrier(&self) -> Result<()> {
        self.round("barrier", None, |_| {})
    }
    fn abort(&self, message: &str) {
        let mut g = self.lock();
        if g.failed.is_none() {
            g.failed = Some((self.rank, message.to_string()));
        }
        self.table.changed.notify_all();
    }
    fn describe(&self) -> String {
        format!("in-process, {} ranks", self.table.world)
    }
}
