//! Reaching the agent: connect to its socket, send `Hello` (with the usage memfd attached on
//! a reconnect), receive `LedgerReply` and its two descriptors, all within
//! [`HELLO_TIMEOUT_MS`]. Everything the agent sends is checked (kind, size, version, the
//! number of descriptors) before it is used. And, later, whether the agent closed the
//! connection ([`dead`]).

use crate::sys::now_ms;

use fgpu_common::proto::{self, Kind, shim};

/// How long one connect + Hello + reply may take.
pub const HELLO_TIMEOUT_MS: u64 = 1000;
/// Largest `LedgerReply` payload accepted (version + a cgroup path).
const MAX_REPLY: usize = 64 << 10;

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
    /// The ledger the agent handed over did not map (seals, sizes, magic, version, layout).
    Ledger(fgpu_ledger::Error),
}

impl std::fmt::Display for HelloError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HelloError::NoAgent(s) => write!(f, "no fgpu agent ({s})"),
            HelloError::Refused(s) => write!(f, "the fgpu agent refused the ledger: {s}"),
            HelloError::Bad(s) => write!(f, "bad answer from the fgpu agent: {s}"),
            HelloError::Ledger(e) => write!(f, "bad answer from the fgpu agent: {e}"),
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

pub(super) fn os_err() -> String {
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

/// Whether the connection is closed by the agent (non-blocking).
pub(super) fn dead(fd: i32) -> bool {
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
