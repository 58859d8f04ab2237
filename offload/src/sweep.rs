//! The pipelined sweep over shards: shard k+1 is read while the caller's computation runs on shard k
//! and shard k-1 is written back. Reads and writes run on their own threads (their own I/O queues);
//! the hand-overs are rendezvous channels (nothing waits in a queue), so at most three shards are in
//! memory at once (the one being read, computed and written), whatever the number of shards: with the
//! optimizer state on NVMe this bounds the host RAM of an update.

use std::sync::mpsc::sync_channel;

/// Runs `compute(k, &mut shard)` over every shard in order, with `load` of the next shard and `store`
/// of the previous one overlapping it. Returns the shards in their original order, or the first error
/// (in which case shards not yet stored are dropped unstored: nothing half-updated is written).
pub fn pipelined_sweep<S, E>(
    shards: Vec<S>,
    load: impl Fn(&mut S) -> Result<(), E> + Sync,
    mut compute: impl FnMut(usize, &mut S) -> Result<(), E>,
    store: impl Fn(&mut S) -> Result<(), E> + Sync,
) -> Result<Vec<S>, E>
where
    S: Send,
    E: Send,
{
    let count = shards.len();
    std::thread::scope(|scope| {
        let (loaded_tx, loaded_rx) = sync_channel::<Result<(usize, S), E>>(0);
        let (computed_tx, computed_rx) = sync_channel::<(usize, S)>(0);
        let load = &load;
        let store = &store;
        std::thread::Builder::new()
            .name("sweep-read".into())
            .spawn_scoped(scope, move || {
                for (k, mut shard) in shards.into_iter().enumerate() {
                    let item = load(&mut shard).map(|()| (k, shard));
                    let failed = item.is_err();
                    if loaded_tx.send(item).is_err() || failed {
                        return;
                    }
                }
            })
            .expect("spawning the sweep's read thread");
        let writer = std::thread::Builder::new()
            .name("sweep-write".into())
            .spawn_scoped(scope, move || -> Result<Vec<(usize, S)>, E> {
                let mut done = Vec::with_capacity(count);
                for (k, mut shard) in computed_rx {
                    store(&mut shard)?;
                    done.push((k, shard));
                }
                Ok(done)
            })
            .expect("spawning the sweep's write thread");
        let mut first_error = None;
        for item in loaded_rx.iter() {
            match item.and_then(|(k, mut shard)| compute(k, &mut shard).map(|()| (k, shard))) {
                Ok(done) => {
                    if computed_tx.send(done).is_err() {
                        break; // the writer failed; its error is reported below
                    }
                }
                Err(e) => {
                    first_error = Some(e);
                    break;
                }
            }
        }
        drop(loaded_rx);
        drop(computed_tx);
        let written = writer.join().expect("the sweep's write thread panicked");
        if let Some(e) = first_error {
            return Err(e);
        }
        let mut written = written?;
        written.sort_by_key(|(k, _)| *k);
        Ok(written.into_iter().map(|(_, s)| s).collect())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shard_is_loaded_computed_and_stored_once_in_order() {
        let shards: Vec<Vec<u32>> = (0..9).map(|k| vec![k; 3]).collect();
        let out = pipelined_sweep(
            shards,
            |s: &mut Vec<u32>| -> Result<(), String> {
                s.push(100);
                Ok(())
            },
            |k, s| {
                assert_eq!(s[0], k as u32);
                s.push(200);
                Ok(())
            },
            |s| {
                s.push(300);
                Ok(())
            },
        )
        .unwrap();
        for (k, s) in out.iter().enumerate() {
            assert_eq!(s, &vec![k as u32, k as u32, k as u32, 100, 200, 300]);
        }
    }

    #[test]
    fn at_most_three_shards_are_resident_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (resident, peak) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let pause = |ms| std::thread::sleep(std::time::Duration::from_millis(ms));
        // A fast reader before a slow computation and a slow writer: the reader runs ahead as far as the
        // hand-overs let it, and the writer holds its shard while the next is computed.
        pipelined_sweep(
            (0..12).collect::<Vec<usize>>(),
            |_| -> Result<(), ()> {
                let now = resident.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                Ok(())
            },
            |_, _| {
                pause(5);
                Ok(())
            },
            |_| {
                pause(5);
                resident.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(peak.load(Ordering::SeqCst), 3, "read ahead one, compute one, write back one");
    }

    #[test]
    fn the_first_error_stops_the_sweep_and_is_returned() {
        let stored = std::sync::Mutex::new(Vec::new());
        let err = pipelined_sweep(
            (0..6).collect::<Vec<usize>>(),
            |_| Ok(()),
            |k, _| if k == 3 { Err(format!("shard {k} failed")) } else { Ok(()) },
            |s| {
                stored.lock().unwrap().push(*s);
                Ok(())
            },
        )
        .unwrap_err();
        assert_eq!(err, "shard 3 failed");
        assert_eq!(*stored.lock().unwrap(), vec![0, 1, 2], "only fully computed shards are stored");
    }
}
