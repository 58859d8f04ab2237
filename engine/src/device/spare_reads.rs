//! Recycled read-back vectors: the trainer hands each downloaded gradient back to its device
//! ([`super::Backend::recycle`]) and the next read of the same length fills it, so a step's reads touch
//! no fresh pages (a new vector's first touch page-faults, hundreds of MB a step for a large model).

use std::collections::HashMap;
use std::sync::Mutex;

/// The most bytes of recycled vectors a device keeps; beyond that a handed-back vector is dropped.
const SPARE_READ_BYTES: usize = 256 << 20;

/// Vectors by length (each step reads the same gradient lengths again, so an exact match is enough).
#[derive(Default)]
pub(super) struct SpareReads {
    inner: Mutex<Pool>,
}

#[derive(Default)]
struct Pool {
    by_len: HashMap<usize, Vec<Vec<f32>>>,
    bytes: usize,
}

impl SpareReads {
    /// A vector of `len` elements to read into: a recycled one (stale values) or a new zeroed one.
    pub(super) fn vector(&self, len: usize) -> Vec<f32> {
        let mut pool = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match pool.by_len.get_mut(&len).and_then(Vec::pop) {
            Some(v) => {
                pool.bytes -= 4 * len;
                v
            }
            None => vec![0.0; len],
        }
    }

    /// Keeps `vectors` for later reads, up to [`SPARE_READ_BYTES`] in all.
    pub(super) fn keep(&self, vectors: Vec<Vec<f32>>) {
        let mut pool = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for v in vectors {
            if !v.is_empty() && pool.bytes + 4 * v.len() <= SPARE_READ_BYTES {
                pool.bytes += 4 * v.len();
                pool.by_len.entry(v.len()).or_default().push(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_by_length_and_stays_bounded() {
        let spares = SpareReads::default();
        let mut v = spares.vector(10);
        v[3] = 7.0;
        let ptr = v.as_ptr();
        spares.keep(vec![v, Vec::new()]);
        assert_eq!(spares.vector(9).len(), 9, "another length gets a fresh vector");
        let again = spares.vector(10);
        assert_eq!((again.as_ptr(), again[3]), (ptr, 7.0), "the same length gets the kept vector back");
        assert!(spares.inner.lock().unwrap().by_len[&10].is_empty(), "a kept vector is handed out once");
        // Past the cap nothing more is kept.
        let big = SPARE_READ_BYTES / 4;
        spares.keep(vec![vec![0.0; big], vec![0.0; 1]]);
        let pool = spares.inner.lock().unwrap();
        assert_eq!(pool.bytes, SPARE_READ_BYTES, "the cap holds");
        assert!(!pool.by_len.contains_key(&1));
    }
}
