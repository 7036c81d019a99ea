//! `nvml`: what NVML reports (devices, memory, utilisation, processes), read the way a
//! monitoring tool reads it.

use std::ffi::{CStr, c_char};

use crate::api::{Lib, Ptr};
use crate::out;

pub(crate) fn nvml(path: &str) -> bool {
    let lib = match Lib::open(path) {
        Ok(l) => l,
        Err(e) => {
            out(format!("nvml fail dlopen={e}"));
            return false;
        }
    };
    macro_rules! sym {
        ($name:literal, $ty:ty) => {{
            let p = lib.dlsym($name);
            if p.is_null() {
                out(format!("nvml fail missing={}", $name));
                return false;
            }
            // SAFETY: NVML documents this symbol with exactly this C signature.
            unsafe { std::mem::transmute::<Ptr, $ty>(p) }
        }};
    }
    type Info = unsafe extern "C" fn(Ptr, *mut [u64; 3]) -> i32;
    type Procs = unsafe extern "C" fn(Ptr, *mut u32, *mut [u32; 6]) -> i32;
    type Util = unsafe extern "C" fn(Ptr, *mut [u32; 2]) -> i32;
    type Text = unsafe extern "C" fn(Ptr, *mut c_char, u32) -> i32;
    let init = sym!("nvmlInit_v2", unsafe extern "C" fn() -> i32);
    let count = sym!(
        "nvmlDeviceGetCount_v2",
        unsafe extern "C" fn(*mut u32) -> i32
    );
    let by_index = sym!(
        "nvmlDeviceGetHandleByIndex_v2",
        unsafe extern "C" fn(u32, *mut Ptr) -> i32
    );
    let info = sym!("nvmlDeviceGetMemoryInfo", Info);
    let procs = sym!("nvmlDeviceGetComputeRunningProcesses_v3", Procs);
    let util = sym!("nvmlDeviceGetUtilizationRates", Util);
    let uuid = sym!("nvmlDeviceGetUUID", Text);
    // SAFETY: documented NVML signatures; all pointers are valid locals/buffers.
    unsafe {
        if init() != 0 {
            out("nvml fail init".into());
            return false;
        }
        let mut n = 0u32;
        count(&mut n);
        for d in 0..n {
            let mut h: Ptr = std::ptr::null_mut();
            by_index(d, &mut h);
            let mut m = [0u64; 3];
            info(h, &mut m);
            let mut u = [0u32; 2];
            util(h, &mut u);
            let mut buf = [0 as c_char; 96];
            uuid(h, buf.as_mut_ptr(), buf.len() as u32);
            let id = CStr::from_ptr(buf.as_ptr()).to_string_lossy();
            out(format!(
                "nvml device={d} uuid={id} total={} free={} used={} util={}",
                m[0], m[1], m[2], u[0]
            ));
            let mut cnt = 0u32;
            procs(h, &mut cnt, std::ptr::null_mut());
            let mut list = vec![[0u32; 6]; cnt as usize + 4];
            cnt = list.len() as u32;
            procs(h, &mut cnt, list.as_mut_ptr());
            for p in &list[..cnt as usize] {
                let used = u64::from(p[2]) | (u64::from(p[3]) << 32);
                out(format!("nvml process device={d} pid={} used={used}", p[0]));
            }
        }
    }
    true
}
