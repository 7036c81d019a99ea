//! Host processes by PID: their cgroup, and process descriptors that name a process so that
//! a PID reused meanwhile is never mistaken for it (a tenant can churn PIDs as fast as it can
//! fork).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use fgpu_common::cgroup::unified_path;

use super::cgroups::is_under;

/// `pidfd_open(pid, 0)`.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(pid, 0) has no memory arguments; it returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor from pidfd_open, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn send(pidfd: &OwnedFd, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: pidfd_send_signal with a null siginfo and no flags: no memory arguments.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// True while the pidfd's process has not been reaped (so its PID still names it).
pub fn alive(pidfd: &OwnedFd) -> bool {
    send(pidfd, 0).is_ok()
}

/// The cgroup v2 path of host process `pid` (None if it is gone). Unconfirmed: the PID may
/// name another process by now (see [`cgroup_of`]).
pub fn cgroup_of_pid(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    unified_path(&text).map(str::to_string)
}

/// The process's cgroup, read from /proc and confirmed to belong to the pidfd's process.
pub fn cgroup_of(pidfd: &OwnedFd, pid: u32) -> Option<String> {
    let path = cgroup_of_pid(pid)?;
    alive(pidfd).then_some(path)
}

/// SIGKILLs host process `pid` only if it is (still) in cgroup `ancestor` or below: the
/// process is pinned by a pidfd first, its cgroup read and confirmed for that very process,
/// and the signal goes through the pidfd. `Ok(false)`: gone, or not in that subtree (its PID
/// now names another process).
pub fn kill_in(pid: u32, ancestor: &str) -> io::Result<bool> {
    let pidfd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(false),
        Err(e) => return Err(e),
    };
    match cgroup_of(&pidfd, pid) {
        Some(path) if is_under(&path, ancestor) => match send(&pidfd, libc::SIGKILL) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
            Err(e) => Err(e),
        },
        _ => Ok(false),
    }
}

/// [`kill_in`], said as the end of a log line: "" when killed, else why not.
pub fn kill_in_said(pid: u32, ancestor: &str) -> &'static str {
    match kill_in(pid, ancestor) {
        Ok(true) => "",
        Ok(false) => " (it had gone, or its PID names a process elsewhere now)",
        Err(_) => " (kill failed)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_killed_only_inside_the_named_subtree() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let mine = unified_path(&text).unwrap().to_string();
        // Another subtree: left alone.
        let elsewhere = format!("{}/fgpu-not-here", mine.trim_end_matches('/'));
        assert!(!kill_in(pid, &elsewhere).unwrap());
        assert!(child.try_wait().unwrap().is_none(), "still running");
        assert!(kill_in(pid, &mine).unwrap());
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}
