//! The two memfds of an agent's ledger: the limits page (sealed against writes through any
//! new mapping, so shims can only map it read-only) and the usage part (read-write for every
//! shim, but sealed against shrinking, growing and further sealing).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use fgpu_common::ledger::{PAGE, USAGE_SIZE};

use crate::Error;

/// Seals of the limits memfd.
pub const LIMITS_SEALS: i32 =
    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
/// Seals of the usage memfd: no resize (a shrunk file would fault every mapping of it), no
/// further seals (a write seal would lock the agent out of a restart's fresh mapping).
pub const USAGE_SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// The name every usage memfd starts with (`/memfd:fgpu-usage...` in `/proc/PID/fd`).
pub const USAGE_NAME: &str = "fgpu-usage";

/// The memfd name of cgroup `cgroup_id`'s usage part: `fgpu-usage:<cgroup id>`. The tag says
/// which cgroup's ledger a page belongs to, so that a page found in `/proc` or offered in a
/// Hello is adopted only by the ledger it was made for ([`usage_tag`]).
pub fn usage_name(cgroup_id: u64) -> std::ffi::CString {
    std::ffi::CString::new(format!("{USAGE_NAME}:{cgroup_id}"))
        .expect("a name of digits has no NUL")
}

/// What a `/proc/PID/fd` link target says of a usage memfd: `None` if it is not one at all
/// (no `/memfd:fgpu-usage` prefix), `Some(None)` for a usage memfd without a well-formed tag
/// (an older agent's, or a forgery), `Some(Some(id))` for one tagged with cgroup `id`.
/// The name is the creator's word only: the tag keeps a page from being adopted for another
/// cgroup than the one it was made for, it does not prove the creator.
pub fn usage_tag(link_target: &str) -> Option<Option<u64>> {
    let rest = link_target
        .strip_prefix("/memfd:")?
        .strip_prefix(USAGE_NAME)?;
    let rest = rest.strip_suffix(" (deleted)").unwrap_or(rest);
    if !rest.is_empty() && !rest.starts_with(':') {
        return None; // another name that merely starts the same way
    }
    Some(
        rest.strip_prefix(':')
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|t| t.parse().ok()),
    )
}

/// [`usage_tag`] of one of this process's descriptors (`/proc/self/fd/N`).
pub fn usage_tag_of(fd: RawFd) -> Option<Option<u64>> {
    let target = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    usage_tag(&target.to_string_lossy())
}

fn memfd(name: &std::ffi::CStr, len: usize) -> Result<OwnedFd, Error> {
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: valid NUL-terminated name; the returned descriptor is ours.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(Error::os("memfd_create"));
    }
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on our own fresh memfd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(Error::os("sizing a ledger memfd"));
    }
    Ok(fd)
}

fn add_seals(fd: RawFd, seals: i32, what: &'static str) -> Result<(), Error> {
    // SAFETY: fcntl(F_ADD_SEALS) on a descriptor the caller owns.
    if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } != 0 {
        return Err(Error::os(what));
    }
    Ok(())
}

/// A fresh limits page (not sealed yet: the creator initialises it through a writable
/// mapping first, then calls [`seal_limits`]).
pub fn create_limits() -> Result<OwnedFd, Error> {
    memfd(c"fgpu-limits", PAGE)
}

/// Seals the limits page: from now on only mappings made before (the agent's) can write it.
pub fn seal_limits(fd: RawFd) -> Result<(), Error> {
    add_seals(fd, LIMITS_SEALS, "sealing the limits memfd")
}

/// A fresh usage part of cgroup `cgroup_id`'s ledger, named for it ([`usage_name`]), sized
/// and sealed ([`USAGE_SEALS`]).
pub fn create_usage(cgroup_id: u64) -> Result<OwnedFd, Error> {
    let fd = memfd(&usage_name(cgroup_id), USAGE_SIZE)?;
    add_seals(fd.as_raw_fd(), USAGE_SEALS, "sealing the usage memfd")?;
    Ok(fd)
}

/// The seals on `fd` (`F_GET_SEALS`; an error for files that are not memfds).
pub fn seals(fd: RawFd) -> Result<i32, Error> {
    // SAFETY: fcntl(F_GET_SEALS) only reads the file's seals.
    let s = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if s < 0 {
        return Err(Error::os("reading seals (not a memfd?)"));
    }
    Ok(s)
}

/// The size of the file behind `fd`.
pub fn file_len(fd: RawFd) -> Result<i64, Error> {
    // SAFETY: stat is plain data; fstat writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; fstat fails cleanly on a bad descriptor.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(Error::os("fstat"));
    }
    Ok(st.st_size)
}

/// Checks that `fd` carries every seal of `want` and none of `forbid` (other seals, such as
/// `F_SEAL_EXEC` that `vm.memfd_noexec` adds, are harmless), and is `len` bytes.
fn check(fd: RawFd, what: &'static str, len: usize, want: i32, forbid: i32) -> Result<(), Error> {
    let got = seals(fd)?;
    if got & want != want || got & forbid != 0 {
        return Err(Error::Seals { what, got, want });
    }
    // Sealed: the size read now is the size for good.
    let size = file_len(fd)?;
    if size != len as i64 {
        return Err(Error::Size {
            what,
            got: size,
            want: len,
        });
    }
    Ok(())
}

/// Whether `fd` may be adopted as a cgroup's usage memfd: [`USAGE_SEALS`] (so nobody can
/// resize it while it is mapped, nor seal it further), no write seal (shims and the agent
/// write it), and exactly the usage size.
pub fn check_usage(fd: RawFd) -> Result<(), Error> {
    let write = libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE;
    check(fd, "the usage memfd", USAGE_SIZE, USAGE_SEALS, write)
}

/// Whether `fd` is a sealed limits page ([`LIMITS_SEALS`], one page).
pub fn check_limits(fd: RawFd) -> Result<(), Error> {
    check(fd, "the limits memfd", PAGE, LIMITS_SEALS, 0)
}
