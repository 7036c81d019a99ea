//! The copy and set entry points of the driver API, each with its `_ptds` / `_ptsz` variant:
//! while the process is parkable they pass the door ([`super::enter`]), so that none touches
//! device memory that is parked, and a copy into a parked process (a request arriving) brings
//! its memory back first. Otherwise one relaxed load, then the real function.
//!
//! Also behind the door: the batched copies (CUDA 12.8's `cuMemcpyBatchAsync` and
//! `cuMemcpy3DBatchAsync` with `failIdx`, CUDA 13.0's `_v2` without), the 3D peer copies,
//! and the stream memory operations (`cuStreamWaitValue*`, `cuStreamWriteValue*`,
//! `cuStreamBatchMemOp`, each in its first and `_v2` form), through which the GPU reads or
//! writes device memory at an address the program gives.
//!
//! Not covered (docs/parking.md, "Limits"): array copies (`cuMemcpyAtoD` and kin: arrays
//! pin a process anyway), `cuMemPrefetchAsync` (managed memory pins it too).

#![allow(non_snake_case, clippy::too_many_arguments)]

use crate::real::{self, CUdeviceptr, CUresult, Handle, Raw, real_or_3};
use std::ffi::{c_uint, c_ulonglong, c_void};

macro_rules! doors {
    ($($real:ident => $name:ident ($($a:ident : $t:ty),*);)*) => {
        $(
            /// # Safety
            /// The CUDA driver API contract of the entry point of the same name.
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
                let f = real_or_3!(real::$real);
                let _door = crate::park::enter();
                // SAFETY: forwarding the caller's arguments unchanged.
                unsafe { f($($a),*) }
            }
        )*

        /// (our wrapper, the real entry) for an exported name we wrap.
        pub fn wrapper_by_name(name: &[u8]) -> Option<(usize, &'static Raw)> {
            $(
                if name == real::$real.raw.name.to_bytes() {
                    return Some(($name as *const () as usize, &real::$real.raw));
                }
            )*
            None
        }

        /// Our wrapper for a real entry point's address.
        pub fn wrapper_by_real(p: usize) -> Option<usize> {
            $(
                if p == real::$real.raw.loaded() {
                    return Some($name as *const () as usize);
                }
            )*
            None
        }
    };
}

doors! {
    CU_MEMCPY => cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    CU_MEMCPY_PTDS => cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    CU_MEMCPY_ASYNC => cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: Handle);
    CU_MEMCPY_ASYNC_PTSZ =>
        cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: Handle);
    CU_MEMCPY_HTOD => cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize);
    CU_MEMCPY_HTOD_PTDS => cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize);
    CU_MEMCPY_HTOD_ASYNC =>
        cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: Handle);
    CU_MEMCPY_HTOD_ASYNC_PTSZ =>
        cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, s: Handle);
    CU_MEMCPY_DTOH => cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize);
    CU_MEMCPY_DTOH_PTDS => cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize);
    CU_MEMCPY_DTOH_ASYNC =>
        cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: Handle);
    CU_MEMCPY_DTOH_ASYNC_PTSZ =>
        cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, s: Handle);
    CU_MEMCPY_DTOD => cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    CU_MEMCPY_DTOD_PTDS => cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    CU_MEMCPY_DTOD_ASYNC =>
        cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: Handle);
    CU_MEMCPY_DTOD_ASYNC_PTSZ =>
        cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: Handle);
    CU_MEMCPY_2D => cuMemcpy2D_v2(p: *const c_void);
    CU_MEMCPY_2D_PTDS => cuMemcpy2D_v2_ptds(p: *const c_void);
    CU_MEMCPY_2D_UNALIGNED => cuMemcpy2DUnaligned_v2(p: *const c_void);
    CU_MEMCPY_2D_UNALIGNED_PTDS => cuMemcpy2DUnaligned_v2_ptds(p: *const c_void);
    CU_MEMCPY_2D_ASYNC => cuMemcpy2DAsync_v2(p: *const c_void, s: Handle);
    CU_MEMCPY_2D_ASYNC_PTSZ => cuMemcpy2DAsync_v2_ptsz(p: *const c_void, s: Handle);
    CU_MEMCPY_3D => cuMemcpy3D_v2(p: *const c_void);
    CU_MEMCPY_3D_PTDS => cuMemcpy3D_v2_ptds(p: *const c_void);
    CU_MEMCPY_3D_ASYNC => cuMemcpy3DAsync_v2(p: *const c_void, s: Handle);
    CU_MEMCPY_3D_ASYNC_PTSZ => cuMemcpy3DAsync_v2_ptsz(p: *const c_void, s: Handle);
    CU_MEMCPY_PEER =>
        cuMemcpyPeer(dst: CUdeviceptr, dc: Handle, src: CUdeviceptr, sc: Handle, n: usize);
    CU_MEMCPY_PEER_PTDS =>
        cuMemcpyPeer_ptds(dst: CUdeviceptr, dc: Handle, src: CUdeviceptr, sc: Handle, n: usize);
    CU_MEMCPY_PEER_ASYNC => cuMemcpyPeerAsync(
        dst: CUdeviceptr, dc: Handle, src: CUdeviceptr, sc: Handle, n: usize, s: Handle);
    CU_MEMCPY_PEER_ASYNC_PTSZ => cuMemcpyPeerAsync_ptsz(
        dst: CUdeviceptr, dc: Handle, src: CUdeviceptr, sc: Handle, n: usize, s: Handle);
    CU_MEMSET_D8 => cuMemsetD8_v2(d: CUdeviceptr, v: u8, n: usize);
    CU_MEMSET_D8_PTDS => cuMemsetD8_v2_ptds(d: CUdeviceptr, v: u8, n: usize);
    CU_MEMSET_D16 => cuMemsetD16_v2(d: CUdeviceptr, v: u16, n: usize);
    CU_MEMSET_D16_PTDS => cuMemsetD16_v2_ptds(d: CUdeviceptr, v: u16, n: usize);
    CU_MEMSET_D32 => cuMemsetD32_v2(d: CUdeviceptr, v: c_uint, n: usize);
    CU_MEMSET_D32_PTDS => cuMemsetD32_v2_ptds(d: CUdeviceptr, v: c_uint, n: usize);
    CU_MEMSET_D8_ASYNC => cuMemsetD8Async(d: CUdeviceptr, v: u8, n: usize, s: Handle);
    CU_MEMSET_D8_ASYNC_PTSZ => cuMemsetD8Async_ptsz(d: CUdeviceptr, v: u8, n: usize, s: Handle);
    CU_MEMSET_D16_ASYNC => cuMemsetD16Async(d: CUdeviceptr, v: u16, n: usize, s: Handle);
    CU_MEMSET_D16_ASYNC_PTSZ =>
        cuMemsetD16Async_ptsz(d: CUdeviceptr, v: u16, n: usize, s: Handle);
    CU_MEMSET_D32_ASYNC => cuMemsetD32Async(d: CUdeviceptr, v: c_uint, n: usize, s: Handle);
    CU_MEMSET_D32_ASYNC_PTSZ =>
        cuMemsetD32Async_ptsz(d: CUdeviceptr, v: c_uint, n: usize, s: Handle);
    CU_MEMSET_D2D8 => cuMemsetD2D8_v2(d: CUdeviceptr, p: usize, v: u8, w: usize, h: usize);
    CU_MEMSET_D2D8_PTDS =>
        cuMemsetD2D8_v2_ptds(d: CUdeviceptr, p: usize, v: u8, w: usize, h: usize);
    CU_MEMSET_D2D16 => cuMemsetD2D16_v2(d: CUdeviceptr, p: usize, v: u16, w: usize, h: usize);
    CU_MEMSET_D2D16_PTDS =>
        cuMemsetD2D16_v2_ptds(d: CUdeviceptr, p: usize, v: u16, w: usize, h: usize);
    CU_MEMSET_D2D32 =>
        cuMemsetD2D32_v2(d: CUdeviceptr, p: usize, v: c_uint, w: usize, h: usize);
    CU_MEMSET_D2D32_PTDS =>
        cuMemsetD2D32_v2_ptds(d: CUdeviceptr, p: usize, v: c_uint, w: usize, h: usize);
    CU_MEMSET_D2D8_ASYNC => cuMemsetD2D8Async(
        d: CUdeviceptr, p: usize, v: u8, w: usize, h: usize, s: Handle);
    CU_MEMSET_D2D8_ASYNC_PTSZ => cuMemsetD2D8Async_ptsz(
        d: CUdeviceptr, p: usize, v: u8, w: usize, h: usize, s: Handle);
    CU_MEMSET_D2D16_ASYNC => cuMemsetD2D16Async(
        d: CUdeviceptr, p: usize, v: u16, w: usize, h: usize, s: Handle);
    CU_MEMSET_D2D16_ASYNC_PTSZ => cuMemsetD2D16Async_ptsz(
        d: CUdeviceptr, p: usize, v: u16, w: usize, h: usize, s: Handle);
    CU_MEMSET_D2D32_ASYNC => cuMemsetD2D32Async(
        d: CUdeviceptr, p: usize, v: c_uint, w: usize, h: usize, s: Handle);
    CU_MEMSET_D2D32_ASYNC_PTSZ => cuMemsetD2D32Async_ptsz(
        d: CUdeviceptr, p: usize, v: c_uint, w: usize, h: usize, s: Handle);
    CU_MEMCPY_3D_PEER => cuMemcpy3DPeer(p: *const c_void);
    CU_MEMCPY_3D_PEER_PTDS => cuMemcpy3DPeer_ptds(p: *const c_void);
    CU_MEMCPY_3D_PEER_ASYNC => cuMemcpy3DPeerAsync(p: *const c_void, s: Handle);
    CU_MEMCPY_3D_PEER_ASYNC_PTSZ => cuMemcpy3DPeerAsync_ptsz(p: *const c_void, s: Handle);
    CU_MEMCPY_BATCH_ASYNC => cuMemcpyBatchAsync(
        dsts: *const CUdeviceptr, srcs: *const CUdeviceptr, sizes: *const usize, n: usize,
        attrs: *const c_void, idxs: *const usize, na: usize, fail: *mut usize, s: Handle);
    CU_MEMCPY_BATCH_ASYNC_PTSZ => cuMemcpyBatchAsync_ptsz(
        dsts: *const CUdeviceptr, srcs: *const CUdeviceptr, sizes: *const usize, n: usize,
        attrs: *const c_void, idxs: *const usize, na: usize, fail: *mut usize, s: Handle);
    CU_MEMCPY_BATCH_ASYNC_V2 => cuMemcpyBatchAsync_v2(
        dsts: *const CUdeviceptr, srcs: *const CUdeviceptr, sizes: *const usize, n: usize,
        attrs: *const c_void, idxs: *const usize, na: usize, s: Handle);
    CU_MEMCPY_BATCH_ASYNC_V2_PTSZ => cuMemcpyBatchAsync_v2_ptsz(
        dsts: *const CUdeviceptr, srcs: *const CUdeviceptr, sizes: *const usize, n: usize,
        attrs: *const c_void, idxs: *const usize, na: usize, s: Handle);
    CU_MEMCPY_3D_BATCH_ASYNC => cuMemcpy3DBatchAsync(
        n: usize, ops: *const c_void, fail: *mut usize, flags: c_ulonglong, s: Handle);
    CU_MEMCPY_3D_BATCH_ASYNC_PTSZ => cuMemcpy3DBatchAsync_ptsz(
        n: usize, ops: *const c_void, fail: *mut usize, flags: c_ulonglong, s: Handle);
    CU_MEMCPY_3D_BATCH_ASYNC_V2 =>
        cuMemcpy3DBatchAsync_v2(n: usize, ops: *const c_void, flags: c_ulonglong, s: Handle);
    CU_MEMCPY_3D_BATCH_ASYNC_V2_PTSZ => cuMemcpy3DBatchAsync_v2_ptsz(
        n: usize, ops: *const c_void, flags: c_ulonglong, s: Handle);
    CU_STREAM_WAIT_VALUE32 =>
        cuStreamWaitValue32(s: Handle, a: CUdeviceptr, v: u32, f: c_uint);
    CU_STREAM_WAIT_VALUE32_PTSZ =>
        cuStreamWaitValue32_ptsz(s: Handle, a: CUdeviceptr, v: u32, f: c_uint);
    CU_STREAM_WAIT_VALUE32_V2 =>
        cuStreamWaitValue32_v2(s: Handle, a: CUdeviceptr, v: u32, f: c_uint);
    CU_STREAM_WAIT_VALUE32_V2_PTSZ =>
        cuStreamWaitValue32_v2_ptsz(s: Handle, a: CUdeviceptr, v: u32, f: c_uint);
    CU_STREAM_WAIT_VALUE64 =>
        cuStreamWaitValue64(s: Handle, a: CUdeviceptr, v: u64, f: c_uint);
    CU_STREAM_WAIT_VALUE64_PTSZ =>
        cuStreamWaitValue64_ptsz(s: Handle, a: CUdeviceptr, v: u64, f: c_uint);
    CU_STREAM_WAIT_VALUE64_V2 =>
        cuStreamWaitValue64_v2(s: Handle, a: CUdeviceptr, v: u64, f: c_uint);
    CU_STREAM_WAIT_VALUE64_V2_PTSZ =>
        cuStreamWaitValue64_v2_ptsz(s: Handle, a: CUdeviceptr, v: u64, f: c_uint);
    CU_STREAM_WRITE_VALUE32 =>
        cuStreamWriteValue32(s: Handle, a: CUdeviceptr, v: u32, f: c_uint);
    CU_STREAM_WRITE_VALUE32_PTSZ =>
        cuStreamWriteValue32_ptsz(s: Handle, a: CUdeviceptr, v: u32, f: c_uint);
    CU_STREAM_WRITE_VALUE32_V2 =>
        cuStreamWriteValue32_v2(s: Handle, a: CUdeviceptr, v: u32, f: c_uint);
    CU_STREAM_WRITE_VALUE32_V2_PTSZ =>
        cuStreamWriteValue32_v2_ptsz(s: Handle, a: CUdeviceptr, v: u32, f: c_uint);
    CU_STREAM_WRITE_VALUE64 =>
        cuStreamWriteValue64(s: Handle, a: CUdeviceptr, v: u64, f: c_uint);
    CU_STREAM_WRITE_VALUE64_PTSZ =>
        cuStreamWriteValue64_ptsz(s: Handle, a: CUdeviceptr, v: u64, f: c_uint);
    CU_STREAM_WRITE_VALUE64_V2 =>
        cuStreamWriteValue64_v2(s: Handle, a: CUdeviceptr, v: u64, f: c_uint);
    CU_STREAM_WRITE_VALUE64_V2_PTSZ =>
        cuStreamWriteValue64_v2_ptsz(s: Handle, a: CUdeviceptr, v: u64, f: c_uint);
    CU_STREAM_BATCH_MEM_OP =>
        cuStreamBatchMemOp(s: Handle, n: c_uint, ops: *const c_void, f: c_uint);
    CU_STREAM_BATCH_MEM_OP_PTSZ =>
        cuStreamBatchMemOp_ptsz(s: Handle, n: c_uint, ops: *const c_void, f: c_uint);
    CU_STREAM_BATCH_MEM_OP_V2 =>
        cuStreamBatchMemOp_v2(s: Handle, n: c_uint, ops: *const c_void, f: c_uint);
    CU_STREAM_BATCH_MEM_OP_V2_PTSZ =>
        cuStreamBatchMemOp_v2_ptsz(s: Handle, n: c_uint, ops: *const c_void, f: c_uint);
}
