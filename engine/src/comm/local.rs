//! In-process ranks: N threads of one process exchanging through shared memory (no sockets).
//!
//! Every collective is one round on a shared table: each rank posts where its send buffer is, waits
//! until all N have, copies what it needs straight out of the others' buffers (no intermediate copy),
//! and leaves; it returns only once every rank has left, so its own buffer outlives every read of it.
//! A rank that fails marks the table, and every rank waiting for others to arrive (now or in a later
//! collective) returns an error naming it.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use anyhow::{Result, anyhow};

use super::{Collectives, PEER_TIMEOUT, PeerFailed};

/// Where a rank's send buffer is for one round (address, length), or None if it sends nothing.
type Deposit = Option<(usize, usize)>;

#[derive(Default)]
struct Round {
    /// True while the current round's deposits are complete and being read.
    full: bool,
    arrived: usize,
    left: usize,
    /// Counts closed rounds: a rank that has left waits for it to change.
    closed: u64,
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
    /// The table of [`Collectives::split`]'s channel, made by the first rank that asks for it.
    split: std::sync::OnceLock<Arc<Table>>,
}

impl Table {
    fn new(world: usize) -> Arc<Table> {
        Arc::new(Table { world, round: Mutex::new(Round::empty(world)), changed: Condvar::new(), split: std::sync::OnceLock::new() })
    }

    /// Marks the table failed by `rank` (the first failure stands), and the split channels too, so
    /// that no thread of any rank waits for the failed one.
    fn fail(&self, rank: usize, why: &str) {
        let mut g = self.round.lock().unwrap_or_else(|e| e.into_inner());
        if g.failed.is_none() {
            g.failed = Some((rank, why.to_string()));
        }
        drop(g);
        self.changed.notify_all();
        if let Some(split) = self.split.get() {
            split.fail(rank, why);
        }
    }
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
        let table = Table::new(world);
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
            // Ready first: once every rank has arrived, every rank reads and leaves, failure or not.
            if ready(&g) {
                return Ok(g);
            }
            if let Some((rank, why)) = &g.failed {
                return Err(PeerFailed { rank: *rank, why: why.clone() }.into());
            }
            let waited = start.elapsed();
            if waited >= PEER_TIMEOUT {
                let missing: Vec<usize> = (0..self.table.world).filter(|&r| !g.came[r]).collect();
                return Err(anyhow!("rank {}: no progress in {what} for {} s; waiting for ranks {missing:?}", self.rank, waited.as_secs()));
            }
            g = self.table.changed.wait_timeout(g, PEER_TIMEOUT - waited).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// One round: post `mine` (None: nothing to send), then `take` reads the others' buffers.
    fn round(&self, what: &str, mine: Option<&[u8]>, take: impl FnOnce(&[Option<&[u8]>])) -> Result<()> {
        let world = self.table.world;
        let g = self.lock();
        // A rank that left the last round early waits here until every rank has left it.
        let mut g = self.wait(g, what, |r| !r.full)?;
        g.deposits[self.rank] = mine.map(|m| (m.as_ptr() as usize, m.len()));
        g.came[self.rank] = true;
        g.arrived += 1;
        if g.arrived == world {
            g.full = true;
            self.table.changed.notify_all();
        }
        let g = self.wait(g, what, |r| r.full)?;
        let (deposits, closed) = (g.deposits.clone(), g.closed);
        drop(g);
        // Leaving is counted even if `take` panics, so the others never wait for a rank that is gone.
        let leave = Leave { comm: self, closed };
        // SAFETY: each posted buffer is a live shared borrow held by a rank that is inside this round, and
        // no rank returns from the round before every rank has left it (`Leave::drop` waits), so the
        // bytes stay valid and unchanged while anyone reads them. Every buffer a rank writes (its
        // receive buffer) is a separate `&mut` borrow, never posted.
        let views: Vec<Option<&[u8]>> =
            deposits.iter().map(|d| d.map(|(ptr, len)| unsafe { std::slice::from_raw_parts(ptr as *const u8, len) })).collect();
        take(&views);
        drop(leave);
        Ok(())
    }
}

/// Leaves a round: the last rank out closes it; every rank waits until it is closed.
struct Leave<'a> {
    comm: &'a LocalComm,
    closed: u64,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let world = self.comm.table.world;
        let mut g = self.comm.lock();
        g.left += 1;
        if g.left == world {
            let (failed, closed) = (g.failed.take(), g.closed + 1);
            *g = Round { failed, closed, ..Round::empty(world) };
            self.comm.table.changed.notify_all();
        }
        while g.closed == self.closed {
            g = self.comm.table.changed.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
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
        self.round("all-gather", Some(mine), |d| {
            for (r, dep) in d.iter().enumerate() {
                out[r * n..(r + 1) * n].copy_from_slice(dep.expect("every rank posts"));
            }
        })
    }
    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let n = send.len() / self.table.world;
        let me = self.rank;
        self.round("all-to-all", Some(send), |d| {
            for (r, dep) in d.iter().enumerate() {
                recv[r * n..(r + 1) * n].copy_from_slice(&dep.expect("every rank posts")[me * n..(me + 1) * n]);
            }
        })
    }
    fn broadcast_bytes(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        let me = self.rank;
        if me == root {
            return self.round("broadcast", Some(buf), |_| {});
        }
        self.round("broadcast", None, |d| buf.copy_from_slice(d[root].expect("the root posts")))
    }
    fn barrier(&self) -> Result<()> {
        self.round("barrier", None, |_| {})
    }
    fn abort(&self, message: &str) {
        self.table.fail(self.rank, message);
    }
    fn describe(&self) -> String {
        format!("in-process, {} ranks", self.table.world)
    }
    fn split(&self) -> Result<Box<dyn Collectives>> {
        let table = self.table.split.get_or_init(|| Table::new(self.table.world)).clone();
        Ok(Box::new(LocalComm { rank: self.rank, table }))
    }
}
