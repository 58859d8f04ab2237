//! A segment of a batched transfer as an engine's request loop sees it: where each block lies, which
//! blocks are back, and how far its checksum has got. Shared by the io_uring and threads engines, so
//! both cut a batch into the same requests and hash the same bytes at the same moments: written
//! bytes at any time, read bytes once every block before them has arrived.

use super::{Direction, Segment};

/// Bytes hashed between two looks at the completions: small enough (about 0.1-0.3 ms) that the queue
/// is refilled long before the requests in flight run out.
const HASH_STEP_BYTES: usize = 1 << 20;

/// One segment's requests and checksum progress. The buffer is held as a raw pointer: the kernel (or
/// a worker thread) and the hashing share it, on disjoint or read-only ranges.
pub(super) struct Stream<'s> {
    pub(super) offset: u64,
    pub(super) base: *mut u8,
    pub(super) buf_len: usize,
    /// Bytes to move; more than the buffer when it is reused from its start ([`Stream::block_at`]).
    total: u64,
    pub(super) blocks: usize,
    /// Blocks completed, and how many from the start are all complete.
    done: Vec<bool>,
    done_prefix: usize,
    /// The segment's checksum, fed its first `hash_bytes`; `hashed_bytes` of them so far.
    hasher: Option<&'s mut crc32fast::Hasher>,
    hashed_bytes: usize,
    hash_bytes: usize,
}

impl<'s> Stream<'s> {
    /// The stream of `segment`, moving `total` bytes through its buffer in requests of `block` bytes.
    pub(super) fn new(segment: &'s mut Segment<'_>, total: u64, block: usize) -> Self {
        let (base, buf_len) = (segment.buf.as_mut_ptr(), segment.buf.len());
        let blocks = total.div_ceil(block as u64) as usize;
        let (hasher, hash_bytes) = match segment.checksum.as_mut() {
            Some((hasher, n)) => (Some(&mut **hasher), (*n).min(buf_len)),
            None => (None, 0),
        };
        Stream {
            offset: segment.offset,
            base,
            buf_len,
            total,
            blocks,
            done: vec![false; blocks],
            done_prefix: 0,
            hasher,
            hashed_bytes: 0,
            hash_bytes,
        }
    }

    /// Where block `i` lies: its file offset, its offset in the buffer (reused from its start when
    /// `total` exceeds it) and its length.
    pub(super) fn block_at(&self, i: usize, block: usize) -> (u64, usize, usize) {
        let start = i as u64 * block as u64;
        let n = (block as u64).min(self.total - start) as usize;
        (self.offset + start, (start % self.buf_len as u64) as usize, n)
    }

    /// Records that block `i` has completed.
    pub(super) fn complete(&mut self, i: usize) {
        self.done[i] = true;
        while self.done_prefix < self.blocks && self.done[self.done_prefix] {
            self.done_prefix += 1;
        }
    }

    /// Bytes from the buffer's start that may be hashed now: all of them for a write; for a read, those
    /// whose blocks have all arrived.
    fn hashable_bytes(&self, dir: Direction, block: usize) -> usize {
        match dir {
            Direction::Write => self.hash_bytes,
            Direction::Read => self.hash_bytes.min(self.done_prefix * block),
        }
    }
}

/// Hashes up to [`HASH_STEP_BYTES`] of the first stream with bytes ready to hash; false if none had any.
pub(super) fn hash_step(dir: Direction, streams: &mut [Stream<'_>], block: usize) -> bool {
    for s in streams.iter_mut() {
        let ready = s.hashable_bytes(dir, block);
        let Some(hasher) = s.hasher.as_mut() else { continue };
        if ready > s.hashed_bytes {
            let n = (ready - s.hashed_bytes).min(HASH_STEP_BYTES);
            // SAFETY: these bytes are not being written by anyone (a write only reads the buffer; a
            // read has completed them) and lie within the buffer.
            hasher.update(unsafe { std::slice::from_raw_parts(s.base.add(s.hashed_bytes), n) });
            s.hashed_bytes += n;
            return true;
        }
    }
    false
}

/// The next request of a batch, in order: stream by stream, block by block.
pub(super) struct Cursor {
    pub(super) stream: usize,
    block: usize,
}

impl Cursor {
    pub(super) fn new() -> Self {
        Cursor { stream: 0, block: 0 }
    }

    /// The (stream, block) to issue next, past streams with no blocks left; None once all are issued.
    pub(super) fn peek(&mut self, streams: &[Stream<'_>]) -> Option<(usize, usize)> {
        while self.stream < streams.len() && streams[self.stream].blocks == self.block {
            (self.stream, self.block) = (self.stream + 1, 0);
        }
        (self.stream < streams.len()).then_some((self.stream, self.block))
    }

    /// Moves past the request [`Cursor::peek`] gave, once it is issued.
    pub(super) fn advance(&mut self) {
        self.block += 1;
    }
}

/// A request's tag: its stream in the high 24 bits, its block in the low 40.
const BLOCK_BITS: u32 = 40;

pub(super) fn tag(stream: usize, block: usize) -> u64 {
    ((stream as u64) << BLOCK_BITS) | block as u64
}

pub(super) fn untag(tag: u64) -> (usize, usize) {
    ((tag >> BLOCK_BITS) as usize, (tag & ((1 << BLOCK_BITS) - 1)) as usize)
}
