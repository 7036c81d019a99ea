//! Data commands: write a pattern over an allocation and check it back, memset, device to
//! device copies, and moving a VMM allocation's physical memory between addresses (what a
//! parked tenant's memory goes through).
//!
//! Lines (IDX: the allocation's index, as `free IDX` counts; failures end with
//! ` error=NAME` under `--error-names`):
//!   fill IDX SEED       → `fill IDX ok bytes=N` | `fill IDX fail rc=RC`
//!   check IDX SEED      → `check IDX ok` | `check IDX mismatch at OFFSET` | `check IDX fail rc=RC`
//!   check-byte IDX BYTE → `check-byte IDX ok` | `... mismatch at OFFSET` | `... fail rc=RC`
//!   memset IDX BYTE     → `memset IDX ok` | `memset IDX fail rc=RC`
//!   copy DST SRC        → `copy DST SRC ok bytes=N` | `copy DST SRC fail rc=RC`
//!   unmap IDX           → `unmap IDX ok` | `unmap IDX fail rc=RC`
//!   map IDX             → `map IDX ok ptr=0x..` | `map IDX fail rc=RC`
//!   remap IDX           → `remap IDX ok ptr=0x..` | `remap IDX fail rc=RC`
//! A mismatch counts as a failure (`--strict`).

use super::Driver;
use crate::api::AccessDesc;
use crate::out;

/// The most a single cuMemcpyHtoD_v2 / cuMemcpyDtoH_v2 of `fill` and `check` moves.
const MAX_COPY: u64 = 64 << 20;
const DEVICE: i32 = 1; // CU_MEM_LOCATION_TYPE_DEVICE

/// The pattern's 8 bytes at offset `word * 8`: a splitmix64 of the seed and the offset, so
/// that any window of it can be generated on its own.
fn pattern_word(seed: u64, word: u64) -> [u8; 8] {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(word.wrapping_mul(0xD1B5_4A32_D192_ED03))
        .wrapping_add(0x632B_E59B_D9B4_E019);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).to_le_bytes()
}

/// Fills `buf` with the pattern of `seed` as it lies at offset `off` (a multiple of 8).
pub(super) fn pattern(seed: u64, off: u64, buf: &mut [u8]) {
    for (i, w) in buf.chunks_mut(8).enumerate() {
        let word = pattern_word(seed, off / 8 + i as u64);
        w.copy_from_slice(&word[..w.len()]);
    }
}

impl Driver {
    /// The live allocation `idx` as (ptr, size), or reports `{cmd} {idx} fail rc=1`.
    pub(super) fn live(&mut self, cmd: &str, idx: usize) -> Option<(u64, u64)> {
        match self.allocs.get(idx).filter(|a| !a.freed) {
            Some(a) => Some((a.ptr, a.size)),
            None => {
                self.report(1, String::new(), format!("{cmd} {idx} fail rc=1"));
                None
            }
        }
    }

    /// `fill IDX SEED`: the pattern of SEED over the whole allocation, at most 64 MiB per
    /// cuMemcpyHtoD_v2.
    pub(crate) fn fill(&mut self, idx: usize, seed: u64) {
        let Some((ptr, size)) = self.live("fill", idx) else {
            return;
        };
        let mut buf = vec![0u8; size.min(MAX_COPY) as usize];
        let mut off = 0;
        let mut rc = 0;
        while off < size && rc == 0 {
            let n = (size - off).min(MAX_COPY) as usize;
            pattern(seed, off, &mut buf[..n]);
            // SAFETY: documented signature; `buf` holds `n` bytes.
            rc = unsafe { (self.api.memcpy_htod)(ptr + off, buf.as_ptr(), n) };
            off += n as u64;
        }
        self.report(
            rc,
            format!("fill {idx} ok bytes={size}"),
            format!("fill {idx} fail rc={rc}"),
        );
    }

    /// Reads allocation `idx` back (at most 64 MiB per cuMemcpyDtoH_v2) and compares it
    /// with what `expect(offset, buf)` writes; one line, `cmd` first.
    fn compare(&mut self, cmd: &str, idx: usize, expect: impl Fn(u64, &mut [u8])) {
        let dtoh = self.api.memcpy_dtoh;
        // SAFETY: documented signature; `compare_with` passes a buffer of `n` bytes.
        self.compare_with(cmd, idx, |dst, src, n| unsafe { dtoh(dst, src, n) }, expect);
    }

    /// As [`Self::compare`], reading with `read(dst, device address, n)` (`dst` holds `n`
    /// bytes, at most 64 MiB), which returns a CUresult.
    pub(super) fn compare_with(
        &mut self,
        cmd: &str,
        idx: usize,
        mut read: impl FnMut(*mut u8, u64, usize) -> i32,
        expect: impl Fn(u64, &mut [u8]),
    ) {
        let Some((ptr, size)) = self.live(cmd, idx) else {
            return;
        };
        let cap = size.min(MAX_COPY) as usize;
        let (mut got, mut want) = (vec![0u8; cap], vec![0u8; cap]);
        let mut off = 0;
        while off < size {
            let n = (size - off).min(MAX_COPY) as usize;
            let rc = read(got.as_mut_ptr(), ptr + off, n);
            if rc != 0 {
                self.report(rc, String::new(), format!("{cmd} {idx} fail rc={rc}"));
                return;
            }
            expect(off, &mut want[..n]);
            if let Some(i) = (0..n).find(|&i| got[i] != want[i]) {
                self.failed = true;
                out(format!("{cmd} {idx} mismatch at {}", off + i as u64));
                return;
            }
            off += n as u64;
        }
        out(format!("{cmd} {idx} ok"));
    }

    /// `check IDX SEED`: the allocation holds the pattern of SEED.
    pub(crate) fn check(&mut self, idx: usize, seed: u64) {
        self.compare("check", idx, |off, buf| pattern(seed, off, buf));
    }

    /// `check-byte IDX BYTE`: every byte of the allocation is BYTE.
    pub(crate) fn check_byte(&mut self, idx: usize, byte: u8) {
        self.compare("check-byte", idx, |_, buf| buf.fill(byte));
    }

    /// `memset IDX BYTE`: cuMemsetD8_v2 over the whole allocation.
    pub(crate) fn memset(&mut self, idx: usize, byte: u8) {
        let Some((ptr, size)) = self.live("memset", idx) else {
            return;
        };
        // SAFETY: documented signature, plain values.
        let rc = unsafe { (self.api.memset_d8)(ptr, byte, size as usize) };
        self.report(
            rc,
            format!("memset {idx} ok"),
            format!("memset {idx} fail rc={rc}"),
        );
    }

    /// `copy DST SRC`: cuMemcpyDtoD_v2 of the smaller of the two sizes.
    pub(crate) fn copy(&mut self, dst: usize, src: usize) {
        let cmd = format!("copy {dst} {src}");
        let (Some((to, a)), Some((from, b))) = (self.live(&cmd, dst), self.live(&cmd, src)) else {
            return;
        };
        let n = a.min(b);
        // SAFETY: documented signature, plain values.
        let rc = unsafe { (self.api.memcpy_dtod)(to, from, n as usize) };
        self.report(
            rc,
            format!("{cmd} ok bytes={n}"),
            format!("{cmd} fail rc={rc}"),
        );
    }

    /// `unmap IDX`: cuMemUnmap of a VMM allocation's range; the reservation and the
    /// physical handle stay (as a parked allocation's do).
    pub(crate) fn unmap(&mut self, idx: usize) {
        let Some((ptr, size)) = self.live_vmm("unmap", idx) else {
            return;
        };
        // SAFETY: documented signature, plain values.
        let rc = unsafe { (self.api.mem_unmap)(ptr, size as usize) };
        self.report(
            rc,
            format!("unmap {idx} ok"),
            format!("unmap {idx} fail rc={rc}"),
        );
    }

    /// `map IDX` (the allocation's own address again) or `remap IDX` (a fresh reservation,
    /// which becomes the allocation's address): cuMemMap of its physical handle there, then
    /// cuMemSetAccess.
    pub(crate) fn map(&mut self, idx: usize, fresh: bool) {
        let cmd = if fresh { "remap" } else { "map" };
        let Some((mut ptr, size)) = self.live_vmm(cmd, idx) else {
            return;
        };
        let (a, n, handle) = (&self.api, size as usize, self.allocs[idx].handle);
        let access = AccessDesc {
            location_type: DEVICE,
            location_id: self.dev,
            flags: 3,
        };
        // SAFETY: documented signatures, pointers to valid locals.
        let rc = (|| unsafe {
            if fresh {
                step!((a.mem_address_reserve)(&mut ptr, n, 0, 0, 0));
            }
            step!((a.mem_map)(ptr, n, 0, handle, 0));
            (a.mem_set_access)(ptr, n, &access, 1)
        })();
        if rc == 0 {
            self.allocs[idx].ptr = ptr;
        }
        self.report(
            rc,
            format!("{cmd} {idx} ok ptr={ptr:#x}"),
            format!("{cmd} {idx} fail rc={rc}"),
        );
    }

    /// `access IDX ORD FLAGS`: cuMemSetAccess of a VMM allocation's range for ordinal ORD
    /// (FLAGS 0 none, 1 read, 3 read and write).
    pub(crate) fn access(&mut self, idx: usize, ord: i32, flags: i32) {
        let Some((ptr, size)) = self.live_vmm("access", idx) else {
            return;
        };
        let d = AccessDesc {
            location_type: DEVICE,
            location_id: ord,
            flags,
        };
        // SAFETY: documented signature, a pointer to a valid local.
        let rc = unsafe { (self.api.mem_set_access)(ptr, size as usize, &d, 1) };
        self.report(
            rc,
            format!("access {idx} ok ordinal={ord} flags={flags}"),
            format!("access {idx} fail rc={rc}"),
        );
    }

    fn live_vmm(&mut self, cmd: &str, idx: usize) -> Option<(u64, u64)> {
        if self.allocs.get(idx).is_some_and(|a| a.api != "vmm") {
            self.report(1, String::new(), format!("{cmd} {idx} fail rc=1"));
            return None;
        }
        self.live(cmd, idx)
    }
}
