//! Small OS helpers the shim's layers share: the coarse monotonic clock and a new open file
//! description of a descriptor (ledger slot locks live on descriptions).

/// Monotonic milliseconds (coarse clock: a few ns to read).
pub fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// A new open file description of what `fd` refers to (`open("/proc/self/fd/N")`), or -1.
/// Async-signal-safe (used in fork children): no allocation.
pub fn reopen_own(fd: i32) -> i32 {
    if fd < 0 {
        return -1;
    }
    let mut path = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let mut digits = [0u8; 11];
    let (mut n, mut len) = (fd as u32, 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for k in 0..len {
        path[14 + k] = digits[len - 1 - k];
    }
    // SAFETY: a NUL-terminated path in a local buffer (zeros after the digits).
    unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) }
}
