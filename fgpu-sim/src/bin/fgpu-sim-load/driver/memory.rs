//! Allocation commands: every allocation API, frees, trims, the memory info, the
//! allocation stress and bench.

use std::time::Instant;

use super::{Alloc, Driver};
use crate::api::{AccessDesc, AllocProp, ArrayDesc, PoolProps};
use crate::out;

const GRAN: u64 = 2 << 20;
const DEVICE: i32 = 1; // CU_MEM_LOCATION_TYPE_DEVICE

impl Driver {
    pub(crate) fn alloc(&mut self, api: &str, size: u64) {
        let a = &self.api;
        let (mut ptr, mut handle, mut charged) = (0u64, 0usize, size);
        let n = size as usize;
        let rc = match api {
            // SAFETY: (all calls below) documented driver signatures, pointers to valid locals.
            "mem_alloc" => unsafe { (a.mem_alloc)(&mut ptr, n) },
            "pitch" => {
                let (mut pitch, rows) = (0usize, size.div_ceil(4096) as usize);
                charged = rows as u64 * 4096;
                // SAFETY: as above.
                unsafe { (a.mem_alloc_pitch)(&mut ptr, &mut pitch, 4096, rows, 4) }
            }
            // SAFETY: as above.
            "managed" => unsafe { (a.mem_alloc_managed)(&mut ptr, n, 1) },
            // SAFETY: as above.
            "async" => unsafe { (a.mem_alloc_async)(&mut ptr, n, 0) },
            "pool" => {
                let mut rc = 0;
                if self.pool == 0 {
                    let props = PoolProps {
                        alloc_type: 1,
                        handle_types: 0,
                        location_type: DEVICE,
                        location_id: self.dev,
                        win32: std::ptr::null_mut(),
                        max_size: 0,
                        usage: 0,
                        reserved: [0; 54],
                    };
                    // SAFETY: as above.
                    rc = unsafe { (a.mem_pool_create)(&mut self.pool, &props) };
                }
                if rc == 0 {
                    // SAFETY: as above.
                    rc = unsafe { (a.mem_alloc_from_pool_async)(&mut ptr, n, self.pool, 0) };
                }
                rc
            }
            "vmm" => {
                charged = size.div_ceil(GRAN) * GRAN;
                self.vmm_alloc(charged as usize, &mut ptr, &mut handle)
            }
            "array" => {
                let desc = ArrayDesc {
                    width: size.div_ceil(4) as usize,
                    height: 1,
                    format: 0x20, // FLOAT
                    channels: 1,
                };
                charged = (size.div_ceil(4) * 4).div_ceil(GRAN) * GRAN;
                // SAFETY: as above.
                let rc = unsafe { (a.array_create)(&mut handle, &desc) };
                ptr = handle as u64;
                rc
            }
            _ => {
                out(format!("error unknown-api={api}"));
                std::process::exit(2);
            }
        };
        let idx = self.allocs.len();
        self.report(
            rc,
            format!("alloc ok ptr={ptr:#x} size={charged} rc=0 api={api} idx={idx}"),
            format!("alloc fail rc={rc} size={charged} api={api}"),
        );
        if rc == 0 {
            self.allocs.push(Alloc {
                api: api.to_string(),
                ptr,
                size: charged,
                handle,
                freed: false,
            });
        }
    }

    /// cuMemCreate + cuMemAddressReserve + cuMemMap + cuMemSetAccess.
    pub(crate) fn vmm_alloc(&self, n: usize, ptr: &mut u64, handle: &mut usize) -> i32 {
        let a = &self.api;
        let prop = AllocProp {
            alloc_type: 1,
            handle_types: 0,
            location_type: DEVICE,
            location_id: self.dev,
            win32: std::ptr::null_mut(),
            flags: [0; 8],
        };
        let access = AccessDesc {
            location_type: DEVICE,
            location_id: self.dev,
            flags: 3,
        };
        // SAFETY: documented signatures, pointers to valid locals (all four calls).
        unsafe {
            step!((a.mem_create)(handle, n, &prop, 0));
            step!((a.mem_address_reserve)(ptr, n, 0, 0, 0));
            step!((a.mem_map)(*ptr, n, 0, *handle, 0));
            (a.mem_set_access)(*ptr, n, &access, 1)
        }
    }

    pub(crate) fn free(&mut self, idx: usize) {
        let Some(al) = self.allocs.get(idx).filter(|al| !al.freed) else {
            self.report(1, String::new(), format!("free fail idx={idx} rc=1"));
            return;
        };
        let a = &self.api;
        let (ptr, size, handle) = (al.ptr, al.size as usize, al.handle);
        let rc = match al.api.as_str() {
            // SAFETY: (all calls) documented signatures with plain values.
            "async" | "pool" => unsafe { (a.mem_free_async)(ptr, 0) },
            // SAFETY: as above.
            "vmm" => (|| unsafe {
                step!((a.mem_unmap)(ptr, size));
                step!((a.mem_release)(handle));
                (a.mem_address_free)(ptr, size)
            })(),
            // SAFETY: as above.
            "array" => unsafe { (a.array_destroy)(handle) },
            // SAFETY: as above.
            _ => unsafe { (a.mem_free)(ptr) },
        };
        if rc == 0 {
            self.allocs[idx].freed = true;
        }
        self.report(
            rc,
            format!("free ok idx={idx} size={size} rc=0"),
            format!("free fail idx={idx} rc={rc}"),
        );
    }

    /// `threads` threads each run `pairs` cuMemAlloc_v2 + cuMemFree_v2 pairs of `size` bytes;
    /// reports failures and the mean time per pair (per thread).
    pub(crate) fn alloc_free_pairs(&mut self, cmd: &str, threads: u64, pairs: u64, size: u64) {
        let (alloc, free, set_ctx, ctx) = (
            self.api.mem_alloc,
            self.api.mem_free,
            self.api.ctx_set_current,
            self.ctx,
        );
        let start = Instant::now();
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut failed = 0u64;
                    // SAFETY: documented driver signatures; `ptr` is a valid local.
                    unsafe {
                        if set_ctx(ctx) != 0 {
                            return pairs;
                        }
                        for _ in 0..pairs {
                            let mut ptr = 0u64;
                            if alloc(&mut ptr, size as usize) != 0 || free(ptr) != 0 {
                                failed += 1;
                            }
                        }
                    }
                    failed
                })
            })
            .collect();
        let failed: u64 = workers.into_iter().map(|w| w.join().unwrap_or(pairs)).sum();
        let elapsed = start.elapsed();
        let ns_per_pair = elapsed.as_nanos() as u64 / pairs.max(1);
        self.report(
            i32::from(failed > 0),
            format!(
                "{cmd} ok threads={threads} pairs={pairs} size={size} failed=0 elapsed_ms={} ns_per_pair={ns_per_pair}",
                elapsed.as_millis()
            ),
            format!("{cmd} fail threads={threads} pairs={pairs} size={size} failed={failed}"),
        );
    }

    pub(crate) fn info(&mut self) {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        let rc = unsafe { (self.api.mem_get_info)(&mut free, &mut total) };
        self.report(
            rc,
            format!("info free={free} total={total}"),
            format!("info fail rc={rc}"),
        );
    }

    pub(crate) fn trim(&mut self) {
        let a = &self.api;
        let mut default = 0usize;
        let pool = self.pool;
        // SAFETY: documented signatures; pointer to a valid local (all calls).
        let rc = (|| unsafe {
            step!((a.default_mem_pool)(&mut default, 0));
            step!((a.mem_pool_trim_to)(default, 0));
            if pool == 0 {
                0
            } else {
                (a.mem_pool_trim_to)(pool, 0)
            }
        })();
        self.report(rc, "trim ok rc=0".into(), format!("trim fail rc={rc}"));
    }
}
