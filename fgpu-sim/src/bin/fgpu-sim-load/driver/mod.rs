//! The commands' state — the context, the allocations made — and what every command
//! shares: reporting, devices, synchronisation. The commands themselves: `memory`, `data`
//! (patterns written and checked, memsets, copies, VMM remaps), `streamops` (batched copies,
//! stream memory operations), `launch` (kernels and graphs), `steps` (step loops with host
//! time between them).

mod data;
mod launch;
mod memory;
mod steps;
mod streamops;

use std::ffi::{CStr, c_char};
use std::time::Instant;

use crate::api::Api;
use crate::out;

/// One allocation this program made, by whichever API.
pub(crate) struct Alloc {
    pub(crate) api: String,
    pub(crate) ptr: u64,
    pub(crate) size: u64,
    /// vmm: generic allocation handle; array: array handle.
    pub(crate) handle: usize,
    pub(crate) freed: bool,
}

pub(crate) struct Driver {
    pub(crate) api: Api,
    /// The primary context, made current on every thread this tool starts.
    pub(crate) ctx: usize,
    /// The CUDA ordinal of `ctx` (`device N` switches).
    pub(crate) dev: i32,
    pub(crate) allocs: Vec<Alloc>,
    pub(crate) pool: usize,
    pub(crate) failed: bool,
    /// `cuGetErrorName`, with `--error-names`: failures' lines end with ` error=NAME`.
    pub(crate) error_name: Option<unsafe extern "C" fn(i32, *mut *const c_char) -> i32>,
}

impl Driver {
    pub(crate) fn report(&mut self, rc: i32, ok: String, fail: String) {
        if rc == 0 {
            out(ok);
        } else {
            self.failed = true;
            match self.error_name {
                Some(name) => out(format!("{fail} error={}", error_name(name, rc))),
                None => out(fail),
            }
        }
    }

    /// Makes ordinal `n`'s primary context current (allocations and launches go there).
    pub(crate) fn use_device(&mut self, n: i32) {
        let a = &self.api;
        let (mut dev, mut ctx) = (0i32, 0usize);
        // SAFETY: documented signatures, pointers to valid locals.
        let rc = (|| unsafe {
            step!((a.device_get)(&mut dev, n));
            step!((a.ctx_retain)(&mut ctx, dev));
            (a.ctx_set_current)(ctx)
        })();
        let uuid = if rc == 0 {
            self.uuid(dev)
        } else {
            String::new()
        };
        self.report(
            rc,
            format!("device ok ordinal={n} uuid={uuid}"),
            format!("device fail ordinal={n} rc={rc}"),
        );
        if rc == 0 {
            (self.ctx, self.dev, self.pool) = (ctx, dev, 0);
        }
    }

    /// `GPU-...` form of ordinal `dev`'s UUID.
    pub(crate) fn uuid(&self, dev: i32) -> String {
        let mut b = [0u8; 16];
        // SAFETY: documented signature, a 16-byte out-buffer.
        if unsafe { (self.api.device_get_uuid)(&mut b, dev) } != 0 {
            return "?".into();
        }
        let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
        format!(
            "GPU-{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }

    /// One line per visible ordinal: `ordinal N uuid=...`.
    pub(crate) fn devices(&mut self) {
        let mut n = 0i32;
        // SAFETY: documented signature, valid out-pointer.
        let rc = unsafe { (self.api.device_get_count)(&mut n) };
        self.report(
            rc,
            format!("devices count={n}"),
            format!("devices fail rc={rc}"),
        );
        for o in 0..n {
            out(format!("ordinal {o} uuid={}", self.uuid(o)));
        }
    }

    pub(crate) fn sync(&mut self) {
        let t = Instant::now();
        // SAFETY: no arguments.
        let rc = unsafe { (self.api.ctx_synchronize)() };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        self.report(
            rc,
            format!("sync ok elapsed_ms={ms:.1}"),
            format!("sync fail rc={rc}"),
        );
    }
}

/// The driver's name for `rc` (`cuGetErrorName`), or `?` if it has none.
fn error_name(name: unsafe extern "C" fn(i32, *mut *const c_char) -> i32, rc: i32) -> String {
    let mut s: *const c_char = std::ptr::null();
    // SAFETY: documented signature; a valid out-pointer. On success the driver gives a static
    // NUL-terminated string.
    if unsafe { name(rc, &mut s) } != 0 || s.is_null() {
        return "?".into();
    }
    // SAFETY: non-null, NUL-terminated, static (checked above).
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}
