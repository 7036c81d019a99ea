//! fgpu-sim-hip's kernel commands: registration as hipcc-built programs do it, launches,
//! module launches, graphs.

use super::*;

impl Run {
    pub(super) fn kernel(&mut self, name: &str) -> Ptr {
        if let Some((_, k)) = self.kernels.iter().find(|(n, _)| n == name) {
            return &**k as *const u8 as Ptr;
        }
        let h = &self.hip;
        if self.modules.is_null() {
            let f = dlsym(h.handle, "__hipRegisterFatBinary");
            if !f.is_null() {
                // SAFETY: __hipRegisterFatBinary(const void *) -> void **.
                let f: unsafe extern "C" fn(Ptr) -> Ptr = unsafe { std::mem::transmute(f) };
                // SAFETY: any bytes are a fat binary for the simulator.
                self.modules = unsafe { f(c"sim".as_ptr() as Ptr) };
            }
        }
        let stub = Box::new(0u8);
        let host = &*stub as *const u8 as Ptr;
        let reg = dlsym(h.handle, "__hipRegisterFunction");
        let cname = CString::new(name).unwrap_or_default();
        if !reg.is_null() {
            type Reg = unsafe extern "C" fn(
                Ptr,
                Ptr,
                *const c_char,
                *const c_char,
                u32,
                Ptr,
                Ptr,
                Ptr,
                Ptr,
                *mut i32,
            );
            // SAFETY: __hipRegisterFunction's C signature.
            let f: Reg = unsafe { std::mem::transmute(reg) };
            let n = std::ptr::null_mut();
            // SAFETY: valid module list, host stub and names.
            unsafe {
                f(
                    self.modules,
                    host,
                    cname.as_ptr(),
                    cname.as_ptr(),
                    0,
                    n,
                    n,
                    n,
                    n,
                    std::ptr::null_mut(),
                )
            };
        }
        self.kernels.push((name.into(), stub));
        host
    }

    pub(super) fn launch(&mut self, n: u64, name: &str) -> i32 {
        let k = self.kernel(name);
        let d = Dim3 { x: 1, y: 1, z: 1 };
        let h = &self.hip;
        let mut rc = 0;
        for _ in 0..n {
            rc = call!(
                h,
                "hipLaunchKernel",
                fn(Ptr, Dim3, Dim3, *mut Ptr, usize, Ptr),
                k,
                d,
                d,
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut()
            );
            if rc != 0 {
                break;
            }
        }
        out(format!("launch rc={rc} n={n}"));
        rc
    }

    pub(super) fn ext_launch(&mut self, k: &str) -> i32 {
        let host = self.kernel(k);
        let h = &self.hip;
        let (mut a, mut b): (Ptr, Ptr) = (std::ptr::null_mut(), std::ptr::null_mut());
        call!(h, "hipEventCreate", fn(*mut Ptr), &mut a);
        call!(h, "hipEventCreate", fn(*mut Ptr), &mut b);
        let d = Dim3 { x: 1, y: 1, z: 1 };
        let n = std::ptr::null_mut();
        let rc = call!(
            h,
            "hipExtLaunchKernel",
            fn(Ptr, Dim3, Dim3, *mut Ptr, usize, Ptr, Ptr, Ptr, i32),
            host,
            d,
            d,
            n,
            0,
            std::ptr::null_mut(),
            a,
            b,
            0
        );
        call!(h, "hipEventSynchronize", fn(Ptr), b);
        let mut ms = 0f32;
        call!(
            h,
            "hipEventElapsedTime",
            fn(*mut f32, Ptr, Ptr),
            &mut ms,
            a,
            b
        );
        out(format!("ext-launch rc={rc} ms={ms:.3}"));
        rc
    }

    pub(super) fn module_launch(&mut self, n: u64, k: &str) -> i32 {
        let h = &self.hip;
        let k = CString::new(k).unwrap_or_default();
        let (mut m, mut f): (Ptr, Ptr) = (std::ptr::null_mut(), std::ptr::null_mut());
        let mut rc = call!(
            h,
            "hipModuleLoadData",
            fn(*mut Ptr, Ptr),
            &mut m,
            c"x".as_ptr() as Ptr
        );
        if rc == 0 {
            rc = call!(
                h,
                "hipModuleGetFunction",
                fn(*mut Ptr, Ptr, *const c_char),
                &mut f,
                m,
                k.as_ptr()
            );
        }
        let z = std::ptr::null_mut::<Ptr>();
        for _ in 0..n {
            if rc != 0 {
                break;
            }
            rc = call!(
                h,
                "hipModuleLaunchKernel",
                fn(Ptr, u32, u32, u32, u32, u32, u32, u32, Ptr, *mut Ptr, *mut Ptr),
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                z,
                z
            );
        }
        out(format!("module-launch rc={rc} n={n}"));
        rc
    }

    pub(super) fn graph(&mut self, n: u64, k: &str, replays: u64) -> i32 {
        let h = &self.hip;
        let mut s: Ptr = std::ptr::null_mut();
        call!(h, "hipStreamCreate", fn(*mut Ptr), &mut s);
        let mut rc = call!(h, "hipStreamBeginCapture", fn(Ptr, i32), s, 0);
        let host = self.kernel(k);
        let h = &self.hip;
        let d = Dim3 { x: 1, y: 1, z: 1 };
        for _ in 0..n {
            rc |= call!(
                h,
                "hipLaunchKernel",
                fn(Ptr, Dim3, Dim3, *mut Ptr, usize, Ptr),
                host,
                d,
                d,
                std::ptr::null_mut(),
                0,
                s
            );
        }
        let (mut g, mut e): (Ptr, Ptr) = (std::ptr::null_mut(), std::ptr::null_mut());
        rc |= call!(h, "hipStreamEndCapture", fn(Ptr, *mut Ptr), s, &mut g);
        rc |= call!(
            h,
            "hipGraphInstantiate",
            fn(*mut Ptr, Ptr, Ptr, *mut c_char, usize),
            &mut e,
            g,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0
        );
        for _ in 0..replays {
            rc |= call!(h, "hipGraphLaunch", fn(Ptr, Ptr), e, s);
        }
        rc |= call!(h, "hipStreamSynchronize", fn(Ptr), s);
        out(format!("graph rc={rc} replays={replays}"));
        rc
    }
}
