//! The real `dlsym` (`dlvsym(RTLD_NEXT, "dlsym", ...)`), which resolves the real entry
//! points; crate::dlsym's naked stub tail-jumps to it. Nothing in this crate may call
//! `libc::dlsym`: in this library that name is our own hook (crate::dlsym).

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Acquire, Ordering::Release};

/// The real `dlsym`; read by the naked stub (never 0 once [`ensure_real`] ran: it falls back
/// to [`no_dlsym`]).
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Stands in for `dlsym` if the real one cannot be found (never seen on glibc).
extern "C" fn no_dlsym(_h: *mut c_void, _n: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// Resolves the real `dlsym` once; returns it.
pub fn ensure_real() -> DlsymFn {
    let mut p = REAL_DLSYM.load(Acquire);
    if p == 0 {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: valid C strings; dlvsym with RTLD_NEXT looks up the next definition
            // after this library, which is libc's dlsym.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) }
                as usize;
            if p != 0 {
                break;
            }
        }
        if p == 0 {
            p = no_dlsym as *const () as usize;
        }
        REAL_DLSYM.store(p, Release);
    }
    // SAFETY: p is libc's dlsym (or `no_dlsym`), both with dlsym's C signature.
    unsafe { std::mem::transmute::<usize, DlsymFn>(p) }
}

/// Calls the real `dlsym` (from our own code: never with RTLD_NEXT).
pub fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: forwarding a handle and a C string to libc's dlsym.
    unsafe { ensure_real()(handle, name) }
}
