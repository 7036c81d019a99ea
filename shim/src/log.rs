//! Log lines on stderr, `fgpu: ...`, filtered by `FGPU_LOG=error|warn|info|debug` (default
//! warn; `off` silences everything).
//!
//! Formatting goes into a buffer on the stack and out with one `write(2)`: logging allocates
//! nothing and works in any thread, and in a fork child.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
#[repr(u8)]
pub enum Level {
    Off = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "none" | "0" => Some(Level::Off),
            "error" => Some(Level::Error),
            "warn" | "warning" => Some(Level::Warn),
            "info" => Some(Level::Info),
            "debug" | "trace" => Some(Level::Debug),
            _ => None,
        }
    }
}

pub fn set_level(l: Level) {
    LEVEL.store(l as u8, Relaxed);
}

pub fn enabled(l: Level) -> bool {
    l as u8 <= LEVEL.load(Relaxed) && l != Level::Off
}

/// A fixed-size text buffer; what does not fit is cut (with "..." at the end).
pub struct StackBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
    cut: bool,
}

impl<const N: usize> StackBuf<N> {
    pub const fn new() -> Self {
        StackBuf {
            buf: [0; N],
            len: 0,
            cut: false,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl<const N: usize> fmt::Write for StackBuf<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = N - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        if n < s.len() {
            self.cut = true;
        }
        Ok(())
    }
}

/// Writes one line `fgpu: <args>\n` to stderr if `level` is enabled.
pub fn line(level: Level, args: fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let mut b = StackBuf::<600>::new();
    let _ = b.write_str("fgpu: ");
    let _ = b.write_fmt(args);
    if b.cut {
        b.len = b.len.min(596);
        let _ = b.write_str("...");
    }
    let _ = b.write_str("\n");
    let bytes = b.as_bytes();
    // SAFETY: writing an initialised buffer of `bytes.len()` bytes to fd 2; a failed or short
    // write only loses a log line.
    unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

macro_rules! error {
    ($($t:tt)*) => { $crate::log::line($crate::log::Level::Error, format_args!($($t)*)) };
}
macro_rules! warning {
    ($($t:tt)*) => { $crate::log::line($crate::log::Level::Warn, format_args!($($t)*)) };
}
macro_rules! info {
    ($($t:tt)*) => { $crate::log::line($crate::log::Level::Info, format_args!($($t)*)) };
}
macro_rules! debug {
    ($($t:tt)*) => { $crate::log::line($crate::log::Level::Debug, format_args!($($t)*)) };
}
pub(crate) use {debug, error, info, warning};
