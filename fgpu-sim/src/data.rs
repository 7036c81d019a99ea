//! The bytes of simulated device memory, stored sparsely.
//!
//! Every backing object (a linear allocation, a VMM physical handle) owns one [`Bytes`]: a
//! map of 64 KiB chunks, each allocated the first time a non-zero byte is written into it.
//! Bytes never written read as zero, so a multi-GiB simulated allocation costs nothing until
//! data is copied into it, and writing zeros over a whole chunk gives the chunk back.
//! Bounds are the owner's business: a `Bytes` has no size of its own.

use std::collections::BTreeMap;

/// Chunk size: the unit in which written data takes host memory.
pub const CHUNK: u64 = 64 << 10;

#[derive(Default)]
pub struct Bytes {
    /// Chunk index (offset / CHUNK) → its CHUNK bytes.
    chunks: BTreeMap<u64, Box<[u8]>>,
}

/// The pieces of `[off, off + len)` that fall into single chunks: (chunk index, offset in
/// the chunk, position in the range, length).
fn pieces(off: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize, usize)> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        if pos >= len {
            return None;
        }
        let at = off + pos as u64;
        let (idx, inner) = (at / CHUNK, (at % CHUNK) as usize);
        let n = (CHUNK as usize - inner).min(len - pos);
        let piece = (idx, inner, pos, n);
        pos += n;
        Some(piece)
    })
}

impl Bytes {
    /// Copies `[off, off + len)` to `dst` (zeros where nothing was written).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes and must not overlap this store.
    pub unsafe fn read_raw(&self, off: u64, dst: *mut u8, len: usize) {
        for (idx, inner, pos, n) in pieces(off, len) {
            // SAFETY: `pos + n <= len`: inside the caller's buffer (contract above); a chunk
            // holds CHUNK bytes and `inner + n <= CHUNK`.
            unsafe {
                match self.chunks.get(&idx) {
                    Some(c) => {
                        std::ptr::copy_nonoverlapping(c.as_ptr().add(inner), dst.add(pos), n)
                    }
                    None => std::ptr::write_bytes(dst.add(pos), 0, n),
                }
            }
        }
    }

    /// Copies `out.len()` bytes from `off` into `out`.
    #[cfg(test)]
    pub fn read(&self, off: u64, out: &mut [u8]) {
        // SAFETY: `out` is a valid, exclusively borrowed buffer of that length.
        unsafe { self.read_raw(off, out.as_mut_ptr(), out.len()) }
    }

    /// Writes `src` at `off`. All-zero pieces allocate no chunk, and a chunk overwritten
    /// with zeros as a whole is dropped.
    pub fn write(&mut self, off: u64, src: &[u8]) {
        for (idx, inner, pos, n) in pieces(off, src.len()) {
            let piece = &src[pos..pos + n];
            let zero = piece.iter().all(|&b| b == 0);
            if zero && (n == CHUNK as usize || !self.chunks.contains_key(&idx)) {
                self.chunks.remove(&idx);
                continue;
            }
            let c = self
                .chunks
                .entry(idx)
                .or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            c[inner..inner + n].copy_from_slice(piece);
        }
    }

    /// Host memory the stored chunks take.
    #[cfg(test)]
    pub fn stored(&self) -> u64 {
        self.chunks.len() as u64 * CHUNK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
            .collect()
    }

    #[test]
    fn unwritten_bytes_read_as_zero_and_cost_nothing() {
        let b = Bytes::default();
        let mut out = vec![0xAAu8; 3 * CHUNK as usize + 17];
        b.read(5 << 30, &mut out);
        assert!(out.iter().all(|&x| x == 0));
        assert_eq!(b.stored(), 0);
    }

    #[test]
    fn a_write_across_a_chunk_edge_lands_in_both_chunks() {
        let mut b = Bytes::default();
        let data = pattern(100, 7);
        let at = CHUNK - 40;
        b.write(at, &data);
        assert_eq!(b.stored(), 2 * CHUNK);
        let mut out = vec![0u8; 100];
        b.read(at, &mut out);
        assert_eq!(out, data);
        // Around it: zeros on both sides, data in the middle.
        let mut wide = vec![0xFFu8; 300];
        b.read(at - 100, &mut wide);
        assert!(wide[..100].iter().all(|&x| x == 0));
        assert_eq!(&wide[100..200], &data[..]);
        assert!(wide[200..].iter().all(|&x| x == 0));
    }

    #[test]
    fn exact_chunk_boundaries_and_multi_chunk_spans() {
        let mut b = Bytes::default();
        let c = CHUNK as usize;
        let data = pattern(2 * c, 3);
        b.write(CHUNK, &data);
        assert_eq!(b.stored(), 2 * CHUNK, "chunks 1 and 2 only");
        let mut out = vec![0u8; 4 * c];
        b.read(0, &mut out);
        assert!(out[..c].iter().all(|&x| x == 0));
        assert_eq!(&out[c..3 * c], &data[..]);
        assert!(out[3 * c..].iter().all(|&x| x == 0));
        // The last byte of one chunk and the first of the next.
        let mut two = [0u8; 2];
        b.read(2 * CHUNK - 1, &mut two);
        assert_eq!(two, [data[c - 1], data[c]]);
    }

    #[test]
    fn partial_overwrite_keeps_the_rest_of_the_chunk() {
        let mut b = Bytes::default();
        b.write(0, &pattern(1000, 1));
        b.write(10, &[0u8; 5]);
        let mut out = vec![0u8; 1000];
        b.read(0, &mut out);
        let mut want = pattern(1000, 1);
        want[10..15].fill(0);
        assert_eq!(out, want);
        assert_eq!(b.stored(), CHUNK);
    }

    #[test]
    fn zero_writes_allocate_nothing_and_whole_zero_chunks_are_dropped() {
        let mut b = Bytes::default();
        b.write(0, &vec![0u8; 3 * CHUNK as usize]);
        assert_eq!(b.stored(), 0);
        b.write(CHUNK / 2, &pattern(CHUNK as usize, 9));
        assert_eq!(b.stored(), 2 * CHUNK);
        b.write(0, &vec![0u8; CHUNK as usize]);
        assert_eq!(b.stored(), CHUNK, "chunk 0 zeroed as a whole");
        let mut out = vec![0xFFu8; 2 * CHUNK as usize];
        b.read(0, &mut out);
        let half = CHUNK as usize / 2;
        assert!(out[..CHUNK as usize].iter().all(|&x| x == 0));
        assert_eq!(
            &out[CHUNK as usize..CHUNK as usize + half],
            &pattern(CHUNK as usize, 9)[half..]
        );
    }
}
