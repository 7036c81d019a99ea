//! The shim's side of the agent connection (contract: `fgpu_common::proto::shim`).
//!
//! - At the first need of the ledger the shim connects to `$FGPU_SOCKET` (default
//!   `/run/fgpu/fgpu.sock`), sends `Hello` and receives `LedgerReply` with two memfds:
//!   `limits` (one page, sealed against writes: mapped `PROT_READ`) and `usage` (the usage page
//!   and the slots, shared read-write). They are mapped contiguously into one reserved
//!   region, so that together they form one [`Ledger`]. The connection stays open
//!   (close-on-exec) so that the shim can notice the agent going away.
//! - Agent gone: the mappings outlive it, the shim keeps enforcing the last ledger it had. On
//!   the allocation slow path ([`tick`], at most every 100 ms) a dead connection is noticed
//!   (`poll`, non-blocking) and a reconnect tried: `Hello` with `HELLO_HAS_USAGE_FD` and the
//!   usage memfd attached. Same usage inode back: the limits page is replaced in place
//!   (`MAP_FIXED`, an atomic page swap). Another one: charges move over
//!   ([`crate::ledger_file::migrate`]).
//!
//! Everything here runs on slow paths only (first use, reconnects); it may allocate and block
//! for at most [`HELLO_TIMEOUT_MS`].

use crate::config;
use crate::ledger_file::{self, now_ms};
use crate::log::{debug, error, info, warning};

use fgpu_common::proto::{self, Kind, shim};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU64, Ordering::SeqCst};

/// How long one connect + Hello + reply may take.
pub const HELLO_TIMEOUT_MS: u64 = 1000;
/// `FGPU_AGENT=required`: how long the shim keeps trying at start.
pub const REQUIRED_WAIT_MS: u64 = 10_000;
/// Dead-connection checks and reconnect attempts: at most this often.
pub const CHECK_EVERY_MS: u64 = 100;
/// Largest `LedgerReply` payload accepted (version + a cgroup path).
const MAX_REPLY: usize = 64 << 10;

/// No agent link and none wanted (standalone, inert, or an agent-less fork child).
const OFF: u8 = 0;
/// Connected; `CONN` is the socket.
const UP: u8 = 1;
/// The agent went away (or never came, with `FGPU_AGENT=required`): reconnect when due.
const DOWN: u8 = 2;

static LINK: AtomicU8 = AtomicU8::new(OFF);
static CONN: AtomicI32 = AtomicI32::new(-1);
static LAST_CHECK_MS: AtomicU64 = AtomicU64::new(0);
static BUSY: AtomicBool = AtomicBool::new(false);
static LOST_WARNED: AtomicBool = AtomicBool::new(false);

/// An owned descriptor, closed on drop.
pub struct Fd(pub i32);

impl Fd {
    /// Gives up ownership.
    pub fn into_raw(self) -> i32 {
        let fd = self.0;
        std::mem::forget(self);
        fd
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        if self.0 >= 0 {
            // SAFETY: closing a descriptor this value owns.
            unsafe { libc::close(self.0) };
        }
    }
}

/// Why no ledger came from the agent.
#[derive(Debug)]
pub enum HelloError {
    /// Nobody listens at the socket (missing, refused, timed out).
    NoAgent(String),
    /// The agent answered with an Error frame.
    Refused(String),
    /// The agent answered something unusable.
    Bad(String),
}

impl std::fmt::Display for HelloError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HelloError::NoAgent(s) => write!(f, "no fgpu agent ({s})"),
            HelloError::Refused(s) => write!(f, "the fgpu agent refused the ledger: {s}"),
            HelloError::Bad(s) => write!(f, "bad answer from the fgpu agent: {s}"),
        }
    }
}

/// What the agent handed over.
pub struct Reply {
    pub conn: Fd,
    pub limits: Fd,
    pub usage: Fd,
    pub cgroup: String,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn os_err() -> String {
    std::io::Error::last_os_error().to_string()
}

/// Waits until `fd` is ready for `events` or the deadline passes.
fn wait(fd: i32, events: i16, deadline: u64) -> Result<(), String> {
    loop {
        let left = deadline.saturating_sub(now_ms());
        if left == 0 {
            return Err("timed out".into());
        }
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut p, 1, left.min(i32::MAX as u64) as i32) };
        if rc > 0 {
            return Ok(());
        }
        if rc < 0 && errno() != libc::EINTR {
            return Err(os_err());
        }
    }
}

fn connect(path: &str, deadline: u64) -> Result<Fd, HelloError> {
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_bytes();
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(HelloError::NoAgent("socket path too long or empty".into()));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain socket creation.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(HelloError::NoAgent(os_err()));
    }
    let fd = Fd(fd);
    loop {
        // SAFETY: a valid socket and address of the given length.
        let rc = unsafe {
            libc::connect(
                fd.0,
                (&raw const addr).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return Ok(fd);
        }
        match errno() {
            libc::EINTR => {}
            // A unix socket whose backlog is full: try again shortly.
            libc::EAGAIN => {
                if now_ms() >= deadline {
                    return Err(HelloError::NoAgent("timed out connecting".into()));
                }
                // SAFETY: plain sleep.
                unsafe { libc::usleep(5000) };
            }
            libc::EINPROGRESS => {
                wait(fd.0, libc::POLLOUT, deadline).map_err(HelloError::NoAgent)?;
                let mut err: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: reading SO_ERROR into an int of the given length.
                unsafe {
                    libc::getsockopt(
                        fd.0,
                        libc::SOL_SOCKET,
                        libc::SO_ERROR,
                        (&raw mut err).cast(),
                        &mut len,
                    )
                };
                if err != 0 {
                    return Err(HelloError::NoAgent(
                        std::io::Error::from_raw_os_error(err).to_string(),
                    ));
                }
                return Ok(fd);
            }
            _ => return Err(HelloError::NoAgent(os_err())),
        }
    }
}

/// Control-message buffer, aligned for `cmsghdr`; room for 16 descriptors.
#[repr(C, align(8))]
struct Cmsg([u8; 128]);

/// Sends all of `bytes`, with `attach` (if any) riding on the first part.
fn send_all(fd: i32, bytes: &[u8], attach: Option<i32>, deadline: u64) -> Result<(), String> {
    let mut sent = 0;
    let mut attach = attach;
    while sent < bytes.len() {
        let mut iov = libc::iovec {
            iov_base: bytes[sent..].as_ptr() as *mut libc::c_void,
            iov_len: bytes.len() - sent,
        };
        let mut cbuf = Cmsg([0; 128]);
        // SAFETY: msghdr is plain data; all-zero is an empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Some(a) = attach {
            // SAFETY: CMSG_SPACE is pure arithmetic.
            let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
            msg.msg_control = cbuf.0.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: the control buffer holds `space` bytes (≤ 128), aligned; the macros stay
            // within msg_controllen.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
                libc::CMSG_DATA(c).cast::<i32>().write_unaligned(a);
            }
        }
        // SAFETY: msg points at live buffers; MSG_NOSIGNAL: a dead agent must not SIGPIPE us.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if n < 0 {
            match errno() {
                libc::EINTR => continue,
                libc::EAGAIN => {
                    wait(fd, libc::POLLOUT, deadline)?;
                    continue;
                }
                _ => return Err(os_err()),
            }
        }
        sent += n as usize;
        attach = None;
    }
    Ok(())
}

/// One frame: (kind, payload, descriptors that came with it).
fn recv_frame(fd: i32, deadline: u64) -> Result<(u16, Vec<u8>, Vec<Fd>), String> {
    let mut buf: Vec<u8> = Vec::with_capacity(256);
    let mut fds: Vec<Fd> = Vec::new();
    loop {
        if buf.len() >= proto::HEADER_LEN {
            if buf[..4] != proto::MAGIC {
                return Err("not an fgpu frame (bad magic)".into());
            }
            let version = u16::from_le_bytes([buf[4], buf[5]]);
            if version != proto::VERSION {
                return Err(format!(
                    "protocol version {version}, this shim speaks {}",
                    proto::VERSION
                ));
            }
            let kind = u16::from_le_bytes([buf[6], buf[7]]);
            let len = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
            if len > MAX_REPLY {
                return Err(format!("reply of {len} bytes is too large"));
            }
            if buf.len() >= proto::HEADER_LEN + len {
                let payload = buf[proto::HEADER_LEN..proto::HEADER_LEN + len].to_vec();
                return Ok((kind, payload, fds));
            }
        }
        wait(fd, libc::POLLIN, deadline)?;
        let mut chunk = [0u8; 4096];
        let mut iov = libc::iovec {
            iov_base: chunk.as_mut_ptr().cast(),
            iov_len: chunk.len(),
        };
        let mut cbuf = Cmsg([0; 128]);
        // SAFETY: msghdr is plain data; all-zero is an empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        msg.msg_controllen = cbuf.0.len() as _;
        // SAFETY: msg points at live buffers of the sizes given; received descriptors are
        // close-on-exec from the start.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
        if n < 0 {
            match errno() {
                libc::EINTR | libc::EAGAIN => continue,
                _ => return Err(os_err()),
            }
        }
        // SAFETY: walking the control buffer the kernel just filled, bounded by
        // msg_controllen through the libc macros.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c).cast::<i32>();
                    let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                        / std::mem::size_of::<i32>();
                    for i in 0..count {
                        fds.push(Fd(data.add(i).read_unaligned()));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            // What arrived is closed when `fds` drops.
            return Err("too many file descriptors in the reply".into());
        }
        if n == 0 {
            return Err("the agent closed the connection".into());
        }
        buf.extend_from_slice(&chunk[..n as usize]);
    }
}

/// Connects to the agent at `path` and asks for this cgroup's ledger, attaching `usage` (a
/// reconnect) if given.
pub fn hello(path: &str, usage: Option<i32>) -> Result<Reply, HelloError> {
    let deadline = now_ms() + HELLO_TIMEOUT_MS;
    let conn = connect(path, deadline)?;
    let payload = shim::HelloPayload {
        version: shim::VERSION,
        flags: if usage.is_some() {
            shim::HELLO_HAS_USAGE_FD
        } else {
            0
        },
    }
    .encode();
    let mut frame = Vec::with_capacity(proto::HEADER_LEN + payload.len());
    frame.extend_from_slice(&proto::MAGIC);
    frame.extend_from_slice(&proto::VERSION.to_le_bytes());
    frame.extend_from_slice(&(Kind::Hello as u16).to_le_bytes());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&payload);
    send_all(conn.0, &frame, usage, deadline).map_err(HelloError::NoAgent)?;
    let (kind, payload, mut fds) = recv_frame(conn.0, deadline).map_err(|e| {
        if e.contains("timed out") || e.contains("closed") {
            HelloError::NoAgent(e)
        } else {
            HelloError::Bad(e)
        }
    })?;
    if kind == Kind::Error as u16 {
        return Err(HelloError::Refused(
            String::from_utf8_lossy(&payload).into_owned(),
        ));
    }
    if kind != Kind::LedgerReply as u16 {
        return Err(HelloError::Bad(format!("unexpected frame kind {kind:#x}")));
    }
    let Some((version, cgroup)) = shim::decode_ledger_reply(&payload) else {
        return Err(HelloError::Bad("short LedgerReply".into()));
    };
    if version != shim::VERSION {
        return Err(HelloError::Bad(format!(
            "ledger payload version {version}, this shim speaks {}",
            shim::VERSION
        )));
    }
    if fds.len() != 2 {
        return Err(HelloError::Bad(format!(
            "{} file descriptors instead of 2 (limits, usage)",
            fds.len()
        )));
    }
    let usage = fds.pop().unwrap_or(Fd(-1));
    let limits = fds.pop().unwrap_or(Fd(-1));
    Ok(Reply {
        conn,
        limits,
        usage,
        cgroup: cgroup.to_string(),
    })
}

fn stat(fd: i32) -> Option<libc::stat> {
    // SAFETY: stat is plain data; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

/// Whether two descriptors refer to the same file.
pub fn same_file(a: i32, b: i32) -> bool {
    match (stat(a), stat(b)) {
        (Some(x), Some(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
        _ => false,
    }
}

/// Maps `limits` (read-only) and `usage` (read-write) contiguously as one ledger; returns its
/// address after checking seals, sizes, magic, version and layout.
pub fn map_ledger(limits: i32, usage: i32) -> Result<usize, String> {
    fgpu_ledger::map_shim(limits, usage).map_err(|e| e.to_string())
}

/// Replaces the limits page of the ledger at `base` with `limits` (validated first).
fn replace_limits(base: usize, limits: i32, usage: i32) -> Result<(), String> {
    fgpu_ledger::remap_limits(base, limits, usage).map_err(|e| e.to_string())
}

/// First contact (from [`crate::ledger_file`]): the agent's ledger, mapped, and our own open
/// file description of the usage memfd, or why not. `FGPU_AGENT=required` retries for up to
/// [`REQUIRED_WAIT_MS`].
pub fn first_contact() -> Result<(usize, i32, String), HelloError> {
    let cfg = config::get();
    let start = now_ms();
    let mut tries = 0u32;
    let reply = loop {
        tries += 1;
        match hello(&cfg.socket, None) {
            Ok(r) => break r,
            Err(HelloError::NoAgent(e))
                if cfg.agent_required && now_ms().saturating_sub(start) < REQUIRED_WAIT_MS =>
            {
                if tries == 1 {
                    info!(
                        "no fgpu agent at {} yet ({e}): waiting up to 10 s",
                        cfg.socket
                    );
                }
                // SAFETY: plain sleep.
                unsafe { libc::usleep(100_000) };
            }
            Err(e) => return Err(e),
        }
    };
    adopt_first(reply)
}

fn adopt_first(reply: Reply) -> Result<(usize, i32, String), HelloError> {
    let base = map_ledger(reply.limits.0, reply.usage.0).map_err(HelloError::Bad)?;
    // Our own open file description: the one that came over the socket is shared with the
    // agent and every other shim of the cgroup, and slot locks belong to descriptions.
    let own = ledger_file::reopen_own(reply.usage.0);
    if own < 0 {
        fgpu_ledger::unmap_shim(base);
        return Err(HelloError::Bad(format!(
            "cannot reopen the usage memfd through /proc/self/fd ({}): is /proc mounted?",
            os_err()
        )));
    }
    CONN.store(reply.conn.into_raw(), SeqCst);
    LINK.store(UP, SeqCst);
    LAST_CHECK_MS.store(now_ms(), SeqCst);
    Ok((base, own, reply.cgroup))
}

/// `FGPU_AGENT=required` and no agent: keep trying to reach it on the slow path.
pub fn want_reconnect() {
    LINK.store(DOWN, SeqCst);
}

/// Whether the connection is closed by the agent (non-blocking).
fn dead(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no waiting.
    let rc = unsafe { libc::poll(&mut p, 1, 0) };
    if rc <= 0 {
        return false;
    }
    if p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        return true;
    }
    // Readable: either EOF or something the agent sent unasked (drained and ignored, with
    // any descriptors closed).
    let mut chunk = [0u8; 256];
    let mut cbuf = Cmsg([0; 128]);
    let mut iov = libc::iovec {
        iov_base: chunk.as_mut_ptr().cast(),
        iov_len: chunk.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is an empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.0.as_mut_ptr().cast();
    msg.msg_controllen = cbuf.0.len() as _;
    // SAFETY: live buffers of the sizes given.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
    // SAFETY: closing any descriptor that came along, bounded by msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<i32>();
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    libc::close(data.add(i).read_unaligned());
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    n == 0 || (n < 0 && !matches!(errno(), libc::EAGAIN | libc::EINTR))
}

/// The allocation slow path's look at the agent link (at most every [`CHECK_EVERY_MS`]): a
/// dead connection is noticed and a reconnect tried. Costs one coarse clock read when not due.
pub fn tick() {
    let state = LINK.load(SeqCst);
    if state == OFF {
        return;
    }
    let now = now_ms();
    let last = LAST_CHECK_MS.load(SeqCst);
    if now.saturating_sub(last) < CHECK_EVERY_MS
        || LAST_CHECK_MS
            .compare_exchange(last, now, SeqCst, SeqCst)
            .is_err()
    {
        return;
    }
    if BUSY.swap(true, SeqCst) {
        return;
    }
    if state == UP {
        let fd = CONN.load(SeqCst);
        if fd >= 0 && dead(fd) {
            if !LOST_WARNED.swap(true, SeqCst) {
                warning!(
                    "the fgpu agent went away: enforcing the last limits it set, reconnecting"
                );
            }
            let old = CONN.swap(-1, SeqCst);
            if old >= 0 {
                // SAFETY: closing our dead connection.
                unsafe { libc::close(old) };
            }
            LINK.store(DOWN, SeqCst);
            reconnect();
        }
    } else {
        reconnect();
    }
    BUSY.store(false, SeqCst);
    // A compute share set or changed since the gate last looked.
    crate::gate::check_generation();
}

/// Tries once to get the agent's ledger again and switch to it.
fn reconnect() {
    let cfg = config::get();
    let (base, fd, agent_ledger) = ledger_file::current();
    // Hand over a fresh open file description, never the one our slot lock lives on: the
    // agent tests and takes slot locks through the description it holds, and through ours
    // it would find our own slot free.
    let attach = if agent_ledger {
        let fresh = ledger_file::reopen_own(fd);
        (fresh >= 0).then_some(Fd(fresh))
    } else {
        None
    };
    let result = hello(&cfg.socket, attach.as_ref().map(|f| f.0));
    drop(attach);
    let reply = match result {
        Ok(r) => r,
        Err(e) => {
            debug!("reconnect to {}: {e}", cfg.socket);
            return;
        }
    };
    let ok = if agent_ledger && fd >= 0 && same_file(reply.usage.0, fd) {
        // The agent adopted our usage memfd (or already had it): only the limits page is new.
        match replace_limits(base, reply.limits.0, reply.usage.0) {
            Ok(()) => true,
            Err(e) => {
                error!("reconnected to the fgpu agent, but its limits page is unusable: {e}");
                false
            }
        }
    } else {
        match map_ledger(reply.limits.0, reply.usage.0) {
            Ok(new_base) => {
                let own = ledger_file::reopen_own(reply.usage.0);
                if own >= 0 && ledger_file::migrate(new_base, own) {
                    true
                } else {
                    // Nothing refers to the new ledger (migrate published nothing).
                    if own >= 0 {
                        // SAFETY: closing the description we opened.
                        unsafe { libc::close(own) };
                    }
                    fgpu_ledger::unmap_shim(new_base);
                    false
                }
            }
            Err(e) => {
                error!("reconnected to the fgpu agent, but its ledger is unusable: {e}");
                false
            }
        }
    };
    if ok {
        let old = CONN.swap(reply.conn.into_raw(), SeqCst);
        if old >= 0 {
            // SAFETY: closing a connection we no longer use.
            unsafe { libc::close(old) };
        }
        LINK.store(UP, SeqCst);
        LOST_WARNED.store(false, SeqCst);
        crate::gate::ledger_changed();
        info!(
            "reconnected to the fgpu agent at {} (cgroup {})",
            cfg.socket, reply.cgroup
        );
    }
}

/// In a fork child (async-signal-safe): no reconnect is in progress here. The connection is
/// shared with the parent; either notices the agent going away.
pub fn after_fork_child() {
    BUSY.store(false, SeqCst);
    LAST_CHECK_MS.store(0, SeqCst);
}
