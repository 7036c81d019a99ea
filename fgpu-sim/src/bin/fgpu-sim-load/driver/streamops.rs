//! Commands that have the GPU touch device memory outside plain copies and kernels: the
//! batched copies and the stream memory operations (what a parked tenant's shim must hold
//! at its door as it holds copies).
//!
//! Lines (IDX: the allocation's index; SEED: the pattern `fill` wrote):
//!   batch-check IDX SEED   → as `check`, reading with cuMemcpyBatchAsync_v2 (four copies
//!                            per batch of at most 64 MiB, on a stream of its own):
//!                            `batch-check IDX ok` | `... mismatch at OFFSET` | `... fail rc=RC`
//!   batch12-check IDX SEED → the same with CUDA 12.8's cuMemcpyBatchAsync (failIdx)
//!   write-value IDX SEED   → cuStreamWriteValue32_v2 of the pattern's first word at the
//!                            allocation's start (what `fill` put there), then the stream
//!                            synchronised: `write-value IDX ok` | `... fail rc=RC`
//!   wait-value IDX SEED    → cuStreamWaitValue32_v2 (EQ) for that word, then the stream
//!                            synchronised: `wait-value IDX ok` | `... fail rc=RC`
//!   mem-ops IDX SEED       → cuStreamBatchMemOp_v2 of three operations: a write of that word
//!                            at the allocation's start, a wait (EQ) for it, a barrier; then
//!                            the stream synchronised: `mem-ops IDX ok` | `... fail rc=RC`
//! A driver without the entry point answers `CMD IDX fail missing=NAME`.

use super::Driver;
use super::data::pattern;
use crate::api::{MemOp, MemcpyAttributes};

/// Copies per batch.
const PIECES: usize = 4;
const CU_MEMCPY_SRC_ACCESS_ORDER_STREAM: u32 = 1;
const CU_STREAM_WAIT_VALUE_EQ: u32 = 1;
/// `CU_STREAM_MEM_OP_WAIT_VALUE_32`, `_WRITE_VALUE_32`, `_BARRIER`.
const OP_WAIT_32: u32 = 1;
const OP_WRITE_32: u32 = 2;
const OP_BARRIER: u32 = 6;

impl Driver {
    /// A new stream of the current context, or reports `{cmd} {idx} fail rc=RC`.
    fn own_stream(&mut self, cmd: &str, idx: usize) -> Option<usize> {
        let mut s = 0usize;
        // SAFETY: documented signature, a valid out-pointer.
        let rc = unsafe { (self.api.stream_create)(&mut s, 0) };
        if rc != 0 {
            self.report(rc, String::new(), format!("{cmd} {idx} fail rc={rc}"));
            return None;
        }
        Some(s)
    }

    fn missing(&mut self, cmd: &str, idx: usize, name: &str) {
        self.report(1, String::new(), format!("{cmd} {idx} fail missing={name}"));
    }

    /// `batch-check` (`v2`) and `batch12-check`.
    pub(crate) fn batch_check(&mut self, idx: usize, seed: u64, v2: bool) {
        let cmd = if v2 { "batch-check" } else { "batch12-check" };
        let (one, two) = (self.api.memcpy_batch, self.api.memcpy_batch_v2);
        if (v2 && two.is_none()) || (!v2 && one.is_none()) {
            let name = if v2 {
                "cuMemcpyBatchAsync_v2"
            } else {
                "cuMemcpyBatchAsync"
            };
            return self.missing(cmd, idx, name);
        }
        let Some(stream) = self.own_stream(cmd, idx) else {
            return;
        };
        let sync = self.api.stream_synchronize;
        let attrs = MemcpyAttributes {
            src_access_order: CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            src_loc_hint: [0; 2],
            dst_loc_hint: [0; 2],
            flags: 0,
        };
        let read = |dst: *mut u8, src: u64, n: usize| {
            let piece = n.div_ceil(PIECES);
            let (mut dsts, mut srcs, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
            for k in (0..n).step_by(piece.max(1)) {
                dsts.push(dst as u64 + k as u64);
                srcs.push(src + k as u64);
                sizes.push(piece.min(n - k));
            }
            let (count, first) = (dsts.len(), [0usize]);
            let mut fail = 0usize;
            // SAFETY: documented signatures; the arrays hold `count` entries, the host
            // destinations lie in the caller's buffer of `n` bytes, one attribute applies
            // from copy 0.
            unsafe {
                let (d, s, z, a, f) =
                    (dsts.as_ptr(), srcs.as_ptr(), sizes.as_ptr(), &attrs, &first);
                let rc = match (one, two) {
                    (_, Some(b)) if v2 => b(d, s, z, count, a, f.as_ptr(), 1, stream),
                    (Some(b), _) => b(d, s, z, count, a, f.as_ptr(), 1, &mut fail, stream),
                    _ => 1,
                };
                if rc != 0 { rc } else { sync(stream) }
            }
        };
        self.compare_with(cmd, idx, read, |off, buf| pattern(seed, off, buf));
    }

    /// The allocation's address, a stream of its own, and the pattern's first word: what a
    /// stream memory operation works on; None once the failure is reported.
    fn word_target(&mut self, cmd: &str, idx: usize, seed: u64) -> Option<(u64, usize, u32)> {
        let (ptr, _) = self.live(cmd, idx)?;
        let stream = self.own_stream(cmd, idx)?;
        let mut word = [0u8; 4];
        pattern(seed, 0, &mut word);
        Some((ptr, stream, u32::from_le_bytes(word)))
    }

    /// `write-value` and `wait-value`.
    pub(crate) fn stream_value(&mut self, idx: usize, seed: u64, write: bool) {
        let cmd = if write { "write-value" } else { "wait-value" };
        let f = if write {
            self.api.write_value32
        } else {
            self.api.wait_value32
        };
        let Some(f) = f else {
            let name = if write {
                "cuStreamWriteValue32_v2"
            } else {
                "cuStreamWaitValue32_v2"
            };
            return self.missing(cmd, idx, name);
        };
        let Some((ptr, stream, value)) = self.word_target(cmd, idx, seed) else {
            return;
        };
        let flags = if write { 0 } else { CU_STREAM_WAIT_VALUE_EQ };
        // SAFETY: documented signature, plain values.
        let rc = unsafe { f(stream, ptr, value, flags) };
        self.synced(cmd, idx, stream, rc);
    }

    /// `mem-ops`.
    pub(crate) fn mem_ops(&mut self, idx: usize, seed: u64) {
        let cmd = "mem-ops";
        let Some(f) = self.api.batch_mem_op else {
            return self.missing(cmd, idx, "cuStreamBatchMemOp_v2");
        };
        let Some((ptr, stream, word)) = self.word_target(cmd, idx, seed) else {
            return;
        };
        let value = u64::from(word);
        let op = |operation, flags| MemOp {
            operation,
            address: ptr,
            value,
            flags,
            ..MemOp::default()
        };
        let ops = [
            op(OP_WRITE_32, 0),
            op(OP_WAIT_32, CU_STREAM_WAIT_VALUE_EQ),
            MemOp {
                operation: OP_BARRIER,
                ..MemOp::default()
            },
        ];
        // SAFETY: documented signature; `ops` holds the three operations passed.
        let rc = unsafe { f(stream, ops.len() as u32, ops.as_ptr(), 0) };
        self.synced(cmd, idx, stream, rc);
    }

    /// After an operation queued on `stream` answered `rc`: the stream synchronised (if it
    /// succeeded), and the line `{cmd} {idx} ok` or `... fail rc=RC`.
    fn synced(&mut self, cmd: &str, idx: usize, stream: usize, rc: i32) {
        let rc = match rc {
            // SAFETY: documented signature, a stream of ours.
            0 => unsafe { (self.api.stream_synchronize)(stream) },
            rc => rc,
        };
        self.report(
            rc,
            format!("{cmd} {idx} ok"),
            format!("{cmd} {idx} fail rc={rc}"),
        );
    }
}
