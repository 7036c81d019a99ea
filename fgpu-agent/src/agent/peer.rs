//! Who is at the other end of a connection, in the kernel's words: SO_PEERCRED's uid, gid and
//! pid, a pidfd of the peer process, the cgroup it is in, and whether it shares the agent's
//! PID, mount and user namespaces (the admin door's defence in depth: root inside a container
//! is uid 0 too, but it is in other namespaces).
//!
//! The pidfd comes from `SO_PEERPIDFD` (Linux 6.5+): it names the process that called
//! `connect`, whatever happened to its PID since. On older kernels it comes from
//! `pidfd_open` of SO_PEERCRED's pid, which leaves a window between the peer's connect and
//! that call in which a recycled PID could be taken for the peer. Namespaces are read through
//! the pidfd itself (`PIDFD_GET_*_NAMESPACE`, Linux 6.11+); where that ioctl is missing they
//! are read from `/proc/PID/ns` and the pidfd is checked to be still alive afterwards, so that
//! what was read belongs to the pidfd's process and not to a later owner of the PID.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, OnceLock};

use tokio::net::UnixStream;

use super::doors::Door;
use super::pidfd::{alive, cgroup_of, pidfd_open};

/// `SO_PEERPIDFD` (include/uapi/asm-generic/socket.h); not in the libc crate yet.
const SO_PEERPIDFD: libc::c_int = 77;
/// `PIDFD_GET_*_NAMESPACE` = `_IO(0xFF, n)` (include/uapi/linux/pidfd.h, Linux 6.11).
const PIDFD_GET_MNT_NAMESPACE: libc::c_ulong = 0xFF03;
const PIDFD_GET_PID_NAMESPACE: libc::c_ulong = 0xFF05;
const PIDFD_GET_USER_NAMESPACE: libc::c_ulong = 0xFF09;

/// The namespaces the admin door requires its callers to share with the agent.
const NAMESPACES: [(&str, libc::c_ulong); 3] = [
    ("PID", PIDFD_GET_PID_NAMESPACE),
    ("mount", PIDFD_GET_MNT_NAMESPACE),
    ("user", PIDFD_GET_USER_NAMESPACE),
];

/// One connection's caller, identified once when the connection is accepted.
#[derive(Debug)]
pub struct Caller {
    pub door: Door,
    pub peer: Peer,
    /// The peer's cgroup v2 path (as the host names it), when it could be read.
    pub cgroup: Option<String>,
    /// `Ok` if the caller shares the agent's PID, mount and user namespaces; else why not.
    pub host: Result<(), String>,
    /// A pidfd of the process that connected, when it could be had: everything the agent
    /// later says or does about "this caller" goes by it (or by what was read and confirmed
    /// through it here), never by the PID again, which may name another process by then.
    pub pidfd: Option<Arc<OwnedFd>>,
}

impl Caller {
    /// Identifies the peer of `stream` (never blocks on the peer: only kernel queries).
    pub fn identify(stream: &UnixStream, door: Door) -> io::Result<Self> {
        let cred = stream.peer_cred()?;
        let peer = Peer {
            pid: cred.pid().and_then(|p| u32::try_from(p).ok()),
            uid: cred.uid(),
            gid: cred.gid(),
        };
        let pidfd = peer_pidfd(stream.as_raw_fd(), peer.pid);
        let cgroup = match (&pidfd, peer.pid) {
            (Ok(fd), Some(pid)) => cgroup_of(fd, pid),
            _ => None,
        };
        let host = match (&pidfd, door) {
            // Only the admin door asks; the containers' door serves everyone the same.
            // The other containers of the agent's own pod (`--admin-own-pod`) have mount
            // namespaces of their own; PID and user must still be the host's.
            (Ok(fd), Door::Admin) => {
                let own_pod = cgroup.as_deref().is_some_and(super::ownpod::contains);
                same_namespaces_by(fd, peer.pid, false, own_pod)
            }
            (Err(err), Door::Admin) => Err(format!("the caller's process cannot be named: {err}")),
            (_, Door::Containers) => Err("not checked on the containers' socket".into()),
        };
        Ok(Self {
            door,
            peer,
            cgroup,
            host,
            pidfd: pidfd.ok().map(Arc::new),
        })
    }

    /// For log lines: `cgroup` or `-`.
    pub fn cgroup_or_dash(&self) -> &str {
        self.cgroup.as_deref().unwrap_or("-")
    }
}

/// A pidfd of the process that connected.
fn peer_pidfd(sock: RawFd, pid: Option<u32>) -> io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`, a c_int of that size.
    let rc = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 && fd >= 0 {
        // SAFETY: the kernel just gave us this new descriptor; nobody else owns it.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::ENOPROTOOPT) && err.raw_os_error() != Some(libc::EINVAL) {
        return Err(err); // ESRCH: the peer has already exited
    }
    pidfd_open(pid.ok_or_else(|| io::Error::other("no peer credentials"))?)
}

/// A namespace's identity: the (device, inode) of its nsfs file.
type NsId = (u64, u64);

/// The agent's own namespaces, read once; in a container, the host's ([`super::hostns`]).
fn own_namespaces() -> &'static [Option<NsId>; 3] {
    static OWN: OnceLock<[Option<NsId>; 3]> = OnceLock::new();
    if let Some(host) = super::hostns::host() {
        return host;
    }
    OWN.get_or_init(|| {
        ["pid", "mnt", "user"].map(|ns| {
            std::fs::metadata(format!("/proc/self/ns/{ns}"))
                .ok()
                .map(|m| (m.dev(), m.ino()))
        })
    })
}

fn ns_by_pidfd(pidfd: &OwnedFd, request: libc::c_ulong) -> io::Result<NsId> {
    // SAFETY: this ioctl takes no argument and returns a new namespace descriptor or -1.
    let fd = unsafe { libc::ioctl(pidfd.as_raw_fd(), request as _, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor from the ioctl, owned by nobody else.
    let ns = unsafe { OwnedFd::from_raw_fd(fd) };
    let file = std::fs::File::from(ns);
    let m = file.metadata()?;
    Ok((m.dev(), m.ino()))
}

fn ns_by_proc(pid: u32, index: usize) -> io::Result<NsId> {
    let name = ["pid", "mnt", "user"][index];
    let m = std::fs::metadata(format!("/proc/{pid}/ns/{name}"))?;
    Ok((m.dev(), m.ino()))
}

/// `Ok` if the pidfd's process is in the agent's PID, mount and user namespaces (PID and user
/// only with `any_mount`); `force_proc` takes the path of kernels without the pidfd ioctls.
fn same_namespaces_by(
    pidfd: &OwnedFd,
    pid: Option<u32>,
    force_proc: bool,
    any_mount: bool,
) -> Result<(), String> {
    let own = own_namespaces();
    let mut via_proc = false;
    for (i, (name, request)) in NAMESPACES.iter().enumerate() {
        if any_mount && *name == "mount" {
            continue;
        }
        let by_pidfd = if force_proc {
            Err(io::Error::from_raw_os_error(libc::ENOTTY))
        } else {
            ns_by_pidfd(pidfd, *request)
        };
        let theirs = match by_pidfd {
            Ok(id) => id,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => {
                // A kernel before 6.11: read /proc, then confirm the pidfd below.
                let pid = pid.ok_or("no peer credentials")?;
                via_proc = true;
                ns_by_proc(pid, i).map_err(|e| format!("reading the caller's namespaces: {e}"))?
            }
            Err(e) => return Err(format!("reading the caller's {name} namespace: {e}")),
        };
        match own[i] {
            Some(mine) if mine == theirs => {}
            Some(_) => return Err(format!("the caller is not in the agent's {name} namespace")),
            None => return Err(format!("the agent cannot read its own {name} namespace")),
        }
    }
    if via_proc && !alive(pidfd) {
        return Err("the caller exited while it was being identified".into());
    }
    Ok(())
}

/// Who is asking, from the socket's SO_PEERCRED.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub pid: Option<u32>,
    pub uid: u32,
    pub gid: u32,
}

/// Who may use the control requests: root, and the members of one configured group.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub group_name: Option<String>,
    pub group_gid: Option<u32>,
}

impl Access {
    pub fn allows(&self, peer: Peer) -> bool {
        if peer.uid == 0 {
            return true;
        }
        let Some(gid) = self.group_gid else {
            return false;
        };
        peer.gid == gid
            || peer
                .pid
                .is_some_and(|pid| supplementary_groups(pid).contains(&gid))
    }
}

fn supplementary_groups(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
                g.split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_common::cgroup::unified_path;

    #[tokio::test(flavor = "current_thread")]
    async fn a_caller_in_our_own_namespaces_is_the_host() {
        let (a, b) = UnixStream::pair().unwrap();
        let caller = Caller::identify(&a, Door::Admin).unwrap();
        assert_eq!(caller.peer.pid, Some(std::process::id()));
        assert_eq!(caller.host, Ok(()), "{caller:?}");
        let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert_eq!(caller.cgroup.as_deref(), unified_path(&text));
        assert!(caller.pidfd.as_deref().is_some_and(alive));
        let on_containers = Caller::identify(&b, Door::Containers).unwrap();
        assert!(on_containers.host.is_err());
        assert_eq!(on_containers.cgroup, caller.cgroup);
    }

    #[test]
    fn the_fallbacks_of_older_kernels_agree() {
        // pidfd_open instead of SO_PEERPIDFD, /proc/PID/ns instead of the pidfd ioctls.
        let me = std::process::id();
        let pidfd = pidfd_open(me).unwrap();
        assert!(alive(&pidfd));
        assert_eq!(same_namespaces_by(&pidfd, Some(me), true, false), Ok(()));
        assert_eq!(same_namespaces_by(&pidfd, Some(me), false, false), Ok(()));
        let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert_eq!(cgroup_of(&pidfd, me).as_deref(), unified_path(&text));
    }

    #[test]
    fn privileged_a_process_in_its_own_pid_namespace_is_not_the_host_by_either_path() {
        if !fgpu_testkit::privileged() {
            return;
        }
        let mut unshare = std::process::Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                "sleep",
                "10",
            ])
            .spawn()
            .unwrap();
        let children = format!("/proc/{0}/task/{0}/children", unshare.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let sleeper: u32 = loop {
            let text = std::fs::read_to_string(&children).unwrap_or_default();
            if let Some(pid) = text.split_whitespace().next() {
                break pid.parse().unwrap();
            }
            assert!(std::time::Instant::now() < deadline, "no child of unshare");
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        // Its mount namespace is set up by unshare before the exec: wait for the exec.
        while std::fs::read_link(format!("/proc/{sleeper}/exe"))
            .is_ok_and(|p| !p.ends_with("sleep"))
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let pidfd = pidfd_open(sleeper).unwrap();
        for (force_proc, any_mount) in [(false, false), (true, false), (false, true)] {
            assert_eq!(
                same_namespaces_by(&pidfd, Some(sleeper), force_proc, any_mount),
                Err("the caller is not in the agent's PID namespace".to_string()),
                "force_proc {force_proc}, any mount namespace {any_mount} (the agent's pod)"
            );
        }
        let _ = unshare.kill();
        let _ = unshare.wait();
    }

    /// A container of the agent's own pod (`--admin-own-pod`): the host's PID namespace
    /// (`hostPID`), a mount namespace of its own. Refused as a host caller, accepted with
    /// any mount namespace — by either path.
    #[test]
    fn privileged_a_process_in_its_own_mount_namespace_passes_only_as_the_agents_pod() {
        if !fgpu_testkit::privileged() {
            return;
        }
        let mut unshare = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sleep", "10"])
            .spawn()
            .unwrap();
        let pid = unshare.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| !p.ends_with("sleep")) {
            assert!(
                std::time::Instant::now() < deadline,
                "unshare did not exec sleep"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let pidfd = pidfd_open(pid).unwrap();
        for force_proc in [false, true] {
            assert_eq!(
                same_namespaces_by(&pidfd, Some(pid), force_proc, false),
                Err("the caller is not in the agent's mount namespace".to_string()),
                "force_proc {force_proc}"
            );
            assert_eq!(
                same_namespaces_by(&pidfd, Some(pid), force_proc, true),
                Ok(()),
                "force_proc {force_proc}"
            );
        }
        let _ = unshare.kill();
        let _ = unshare.wait();
    }
}
