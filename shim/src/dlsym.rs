//! `dlsym` interposition.
//!
//! The CUDA runtime and nvidia-smi reach the driver through `dlopen` + `dlsym`, so exporting
//! `cuMemAlloc_v2` alone is not enough. Our exported `dlsym`:
//! - `RTLD_NEXT`: glibc resolves it from the *caller's* address, so we must not call the real
//!   `dlsym` from here: a naked stub asks [`rtld_next_lookup`] whether the name is one we wrap
//!   (then it returns our wrapper) and otherwise tail-jumps to the real `dlsym` with the
//!   caller's return address still on the stack.
//! - anything else: calls the real `dlsym`; if the result is the real driver function for a
//!   name we wrap, returns our wrapper instead; if it is one of our own exports while no driver
//!   is loaded, returns NULL (the shim is inert without a driver); otherwise the result as is.
//!
//! The real `dlsym` comes from `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`, falling back to
//! `GLIBC_2.2.5`. Nothing in this crate may call `libc::dlsym`: in this library that name is
//! our own hook.

use crate::real;
use crate::real::dl::{REAL_DLSYM, ensure_real, real_dlsym};
use std::ffi::{CStr, c_char, c_void};

/// `cuGetProcAddress` and `_v2`: always ours, because the CUDA runtime takes every other entry
/// point, the launch ones included, from them. Without a memory limit they substitute only
/// the launch entry points.
fn is_gpa(name: &[u8]) -> bool {
    name == b"cuGetProcAddress" || name == b"cuGetProcAddress_v2"
}

/// Whether `name` can be one of ours at all (cheap filter before comparing names).
fn candidate(name: &[u8]) -> bool {
    name.starts_with(b"cu")
        || name.starts_with(b"nvml")
        || name.starts_with(b"hip")
        || name.starts_with(b"rsmi")
        || name.starts_with(b"amdsmi")
}

/// `dlsym(RTLD_NEXT, name)`: our wrapper if `name` is wrapped and the driver is loaded, else
/// 0 (the stub then tail-jumps to the real dlsym). Also makes sure the real dlsym is known.
extern "C" fn rtld_next_lookup(name: *const c_char) -> *mut c_void {
    ensure_real();
    if name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: dlsym's contract: a NUL-terminated symbol name.
    let n = unsafe { CStr::from_ptr(name) }.to_bytes();
    if !candidate(n) {
        return std::ptr::null_mut();
    }
    if let Some((wrapper, raw)) =
        crate::cuda::launch::wrapper_by_name(n).or_else(|| crate::hip::launch::wrapper_by_name(n))
    {
        // Launch entry points: always ours (one atomic load while nothing is gated).
        return if raw.addr() != 0 {
            wrapper as *mut c_void
        } else {
            std::ptr::null_mut()
        };
    }
    if !crate::ledger::active() && !is_gpa(n) {
        return std::ptr::null_mut();
    }
    match crate::cuda::gpa::wrapper_by_name(n)
        .or_else(|| crate::cuda::copies::wrapper_by_name(n))
        .or_else(|| crate::hip::wrapper_by_name(n))
    {
        Some((wrapper, raw)) if raw.addr() != 0 => wrapper as *mut c_void,
        _ => std::ptr::null_mut(),
    }
}

/// `dlsym(handle, name)` for every handle but RTLD_NEXT.
extern "C" fn dlsym_hook(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let p = real_dlsym(handle, name);
    if p.is_null() || name.is_null() {
        return p;
    }
    // SAFETY: dlsym's contract: a NUL-terminated symbol name.
    let n = unsafe { CStr::from_ptr(name) }.to_bytes();
    if !candidate(n) {
        return p;
    }
    // Launch entry points are wrapped with or without a limit (see crate::cuda::launch), and so
    // is cuGetProcAddress, through which the CUDA runtime reaches them.
    let launch =
        crate::cuda::launch::wrapper_by_name(n).or_else(|| crate::hip::launch::wrapper_by_name(n));
    let (wrapper, raw, always) = match launch {
        Some((w, r)) => (w, r, true),
        None => match crate::cuda::gpa::wrapper_by_name(n) {
            Some((w, r)) => (w, r, is_gpa(n)),
            None if let Some((w, r)) = crate::cuda::copies::wrapper_by_name(n) => (w, r, false),
            None => match crate::hip::wrapper_by_name(n) {
                Some((w, r)) => (w, r, false),
                None => return p,
            },
        },
    };
    let enforce = || always || crate::ledger::active();
    let pu = p as usize;
    if pu == wrapper {
        // Our own export (RTLD_DEFAULT or a handle of the main program): only meaningful
        // while the driver is loaded.
        if raw.addr() == 0 {
            return std::ptr::null_mut();
        }
        return if enforce() {
            p
        } else {
            raw.addr() as *mut c_void
        };
    }
    if raw.addr() == 0 && handle != libc::RTLD_DEFAULT {
        // The driver was loaded under a name RTLD_NOLOAD does not know: use this handle.
        real::adopt(raw.lib, handle as usize);
    }
    if raw.addr() == pu && enforce() {
        return wrapper as *mut c_void;
    }
    p
}

#[cfg(target_arch = "x86_64")]
#[unsafe(no_mangle)]
#[unsafe(naked)]
/// # Safety
/// The C `dlsym` contract.
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // RTLD_NEXT is (void *)-1. The stack at entry is 8 mod 16; two pushes and 8 bytes keep the
    // call to rtld_next_lookup 16-byte aligned.
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "je 2f",
        "jmp {hook}",
        "2:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "mov rdi, rsi",
        "call {next}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 3f",
        "ret",
        "3:",
        "jmp qword ptr [rip + {real}]",
        hook = sym dlsym_hook,
        next = sym rtld_next_lookup,
        real = sym REAL_DLSYM,
    )
}

#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
/// # Safety
/// The C `dlsym` contract. (On this architecture RTLD_NEXT is resolved from the shim's
/// address, not the caller's.)
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    if handle == libc::RTLD_NEXT {
        let w = rtld_next_lookup(symbol);
        if !w.is_null() {
            return w;
        }
        return real_dlsym(handle, symbol);
    }
    dlsym_hook(handle, symbol)
}
