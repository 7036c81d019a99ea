//! Inline hooks on the driver's launch entry points (docs/compute.md, "Every path into a
//! launch").
//!
//! Symbol interposition (`dlsym`, `cuGetProcAddress`) only sees launches whose callers look
//! the entry point up through us. The CUDA runtime reaches the driver's launch functions
//! through the driver's private export tables, and libraries such as cuBLAS resolve with
//! `dlvsym`; both end up *in* libcuda's exported `cuLaunchKernel` & co. So, once libcuda is
//! loaded, the first instruction(s) of each launch entry point are replaced with a `jmp` to
//! a thunk that jumps to our wrapper; the displaced instructions, re-pointed where they are
//! RIP-relative, run in a trampoline that jumps back into the original function. The
//! wrappers then call the trampoline as "the real function", so every path into a launch —
//! however the caller found it — passes the gate exactly once.
//!
//! Thunks and trampolines share one page mapped within ±2 GiB of libcuda (a `jmp rel32`
//! must reach them). The patch is written when the shim first resolves libcuda, before any
//! context (and so any launch) can exist. Any doubt — an instruction the decoder does not
//! know, no page near enough, a text page that cannot be made writable — leaves that entry
//! point unpatched, with one log line; `FGPU_LAUNCH_HOOKS=0` turns the patching off.
//! x86-64 only.

#[cfg(target_arch = "x86_64")]
mod x86;

use crate::real::Raw;

/// Installs the hooks on `entries` (each with the wrapper to divert to) once.
pub fn install(entries: &[(&'static Raw, usize)]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::atomic::{AtomicBool, Ordering::AcqRel};
        static DONE: AtomicBool = AtomicBool::new(false);
        // Entry points this driver does not have are left out (older drivers).
        let present: Vec<_> = entries
            .iter()
            .copied()
            .filter(|(raw, _)| raw.loaded() != 0)
            .collect();
        if !present.is_empty() && !DONE.swap(true, AcqRel) {
            crate::config::get(); // FGPU_LOG
            if std::env::var("FGPU_LAUNCH_HOOKS").is_ok_and(|v| v.trim() == "0") {
                crate::log::info!("FGPU_LAUNCH_HOOKS=0: launch entry points not patched");
                return;
            }
            imp::install(&present);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = entries;
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::x86;
    use crate::log::{debug, info, warning};
    use crate::real::Raw;

    /// Bytes the patch takes at an entry point: `jmp rel32`.
    const PATCH: usize = 5;
    /// Bytes per entry in the near page: trampoline, then thunk at [`THUNK_AT`].
    const SLOT: usize = 96;
    const THUNK_AT: usize = 64;
    const PAGE: usize = 4096;
    /// How far from the library the near page may be (keeps every rel32 in reach).
    const REACH: i64 = 1 << 30;
    /// Bytes read at each entry point for decoding.
    const WINDOW: usize = 48;

    pub fn install(entries: &[(&'static Raw, usize)]) {
        let Some(first) = entries.first().map(|(r, _)| r.loaded()) else {
            return;
        };
        let Some(page) = near_page(first) else {
            warning!(
                "launch hooks: no memory within reach of libcuda; launches reached through the driver's own tables are not gated"
            );
            return;
        };
        let mut planned: Vec<(usize, usize, x86::Displaced, usize)> = Vec::new();
        let mut refused = Vec::new();
        for (i, &(raw, wrapper)) in entries.iter().enumerate() {
            let src = raw.loaded();
            if planned.iter().any(|p| p.0 == src) {
                continue; // an alias of an entry already planned
            }
            // SAFETY: `src` is the address dlsym returned for a function of the loaded
            // driver; its text is mapped readable and at least WINDOW bytes long in practice
            // (a function and what follows it in the same executable mapping).
            let code = unsafe { std::slice::from_raw_parts(src as *const u8, WINDOW) };
            let tramp = page as usize + i * SLOT;
            match x86::displace(code, src as u64, tramp as u64, PATCH) {
                Ok(d) if d.code.len() <= THUNK_AT => planned.push((src, wrapper, d, tramp)),
                Ok(_) => refused.push(format!(
                    "{}: trampoline too long",
                    raw.name.to_string_lossy()
                )),
                Err(e) => refused.push(format!(
                    "{}: {e} (entry bytes {:02x?})",
                    raw.name.to_string_lossy(),
                    &code[..16]
                )),
            }
        }
        // Trampolines and thunks: `jmp [rip+0]; .quad wrapper`.
        for (_, wrapper, d, tramp) in &planned {
            let slot = *tramp;
            let mut thunk = [0u8; 14];
            thunk[..6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
            thunk[6..].copy_from_slice(&(*wrapper as u64).to_le_bytes());
            // SAFETY: the slot lies inside the near page (SLOT × entries ≤ PAGE), mapped
            // read-write by us and not yet executable or shared with anybody.
            unsafe {
                std::ptr::copy_nonoverlapping(d.code.as_ptr(), slot as *mut u8, d.code.len());
                std::ptr::copy_nonoverlapping(thunk.as_ptr(), (slot + THUNK_AT) as *mut u8, 14);
            }
        }
        // SAFETY: our own mapping of one page.
        if unsafe { libc::mprotect(page, PAGE, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
            warning!(
                "launch hooks: cannot make the trampoline page executable; launches reached through the driver's own tables are not gated"
            );
            return;
        }
        // From here on the wrappers call the trampolines as the real functions, so the patch
        // below can never lead a wrapper back into itself.
        for (src, _, _, tramp) in &planned {
            for (raw, _) in entries.iter().filter(|(r, _)| r.loaded() == *src) {
                raw.set_code(*tramp);
            }
        }
        crate::cuda::launch::refresh();
        let mut patched = 0;
        for (src, _, d, tramp) in &planned {
            let thunk = tramp + THUNK_AT;
            if patch(*src, d.len, thunk) {
                patched += 1;
            } else {
                refused.push(format!("{src:#x}: text not writable"));
            }
        }
        for r in &refused {
            warning!(
                "launch hook not installed: {r}; launches through it from the driver's own tables are not gated"
            );
        }
        if patched > 0 {
            info!(
                "launch hooks: {patched} entry points of libcuda patched (trampolines at {page:p})"
            );
        }
        debug!(
            "launch hooks: planned {} refused {}",
            planned.len(),
            refused.len()
        );
    }

    /// One page mapped within [`REACH`] of `addr`, read-write for now.
    fn near_page(addr: usize) -> Option<*mut libc::c_void> {
        const STEP: usize = 1 << 20;
        let base = addr & !(STEP - 1);
        for k in 1..=512usize {
            for hint in [base.checked_sub(k * STEP), base.checked_add(k * STEP)] {
                let Some(hint) = hint else { continue };
                // SAFETY: an anonymous private mapping at a hint; FIXED_NOREPLACE never
                // replaces an existing mapping (older kernels treat it as a plain hint, and
                // the distance is checked below).
                let p = unsafe {
                    libc::mmap(
                        hint as *mut libc::c_void,
                        PAGE,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                        -1,
                        0,
                    )
                };
                if p == libc::MAP_FAILED {
                    continue;
                }
                if (p as i64 - addr as i64).abs() < REACH {
                    return Some(p);
                }
                // SAFETY: the mapping just made, not used.
                unsafe { libc::munmap(p, PAGE) };
            }
        }
        None
    }

    /// Writes `jmp thunk` over the first `len` bytes at `src` (the rest of the displaced
    /// bytes become `int3`). False if the text cannot be made writable.
    fn patch(src: usize, len: usize, thunk: usize) -> bool {
        let start = src & !(PAGE - 1);
        let end = (src + len).next_multiple_of(PAGE);
        let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        // SAFETY: pages of libcuda's executable mapping that contain the entry point; making
        // them writable turns them into private copies of this process (MAP_PRIVATE).
        if unsafe { libc::mprotect(start as *mut libc::c_void, end - start, rwx) } != 0 {
            return false;
        }
        let rel = (thunk as i64 - (src as i64 + PATCH as i64)) as i32;
        let mut bytes = [0xccu8; 32];
        bytes[0] = 0xe9;
        bytes[1..5].copy_from_slice(&rel.to_le_bytes());
        // SAFETY: the pages are writable now; `len` ≤ 32 bytes of whole instructions that
        // the trampoline replaces.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), src as *mut u8, len.min(32)) };
        // SAFETY: restoring the protection of the same pages (text: read + execute).
        unsafe {
            libc::mprotect(
                start as *mut libc::c_void,
                end - start,
                libc::PROT_READ | libc::PROT_EXEC,
            )
        };
        true
    }
}
