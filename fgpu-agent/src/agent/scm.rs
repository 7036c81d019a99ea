//! Sending and receiving file descriptors over the control socket (SCM_RIGHTS).
//!
//! tokio's streams drop ancillary data, so the control connection reads and writes through
//! `recvmsg`/`sendmsg` on the stream's descriptor, driven by tokio's readiness.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::Interest;
use tokio::net::UnixStream;

/// At most this many descriptors are accepted in one message (the shim sends at most one);
/// the kernel closes any beyond them before they reach the agent's descriptor table.
const MAX_FDS: usize = 4;

/// Reads what is available into `buf`; descriptors that came with it are returned.
/// `Ok(0)` bytes means the peer closed the connection.
pub async fn recv(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || recv_now(stream.as_raw_fd(), buf)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

fn recv_now(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let space = cmsg_space(MAX_FDS);
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: zeroed msghdr is a valid "empty" header; we fill in the pointers below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg points at live buffers of the sizes given; MSG_CMSG_CLOEXEC so received
    // descriptors never leak into children.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control buffer the kernel just filled, with the libc macros that
    // bound every step by msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        // Some descriptors did not fit: the kernel dropped those, and what did arrive is
        // closed by dropping `fds`. `InvalidData` tells the caller to say so to the peer.
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("too many file descriptors in one message (at most {MAX_FDS})"),
        ));
    }
    Ok((n as usize, fds))
}

/// Writes all of `bytes`, with `fds` attached to the first part.
pub async fn send(stream: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut sent = 0;
    let mut attach = fds;
    while sent < bytes.len() {
        stream.writable().await?;
        match stream.try_io(Interest::WRITABLE, || {
            send_now(stream.as_raw_fd(), &bytes[sent..], attach)
        }) {
            Ok(n) => {
                sent += n;
                attach = &[];
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn send_now(fd: RawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut _,
        iov_len: bytes.len(),
    };
    let space = cmsg_space(fds.len());
    let mut control = vec![0u8; space];
    // SAFETY: zeroed msghdr is valid; pointers set below refer to live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer has room for one cmsg with fds.len() descriptors.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    // SAFETY: msg refers to live buffers; MSG_NOSIGNAL so a gone peer is an error, not SIGPIPE.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

fn cmsg_space(fds: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    unsafe { libc::CMSG_SPACE((fds.max(1) * std::mem::size_of::<RawFd>()) as u32) as usize }
}
