//! A hostile tenant's peers against the metrics listener: each holds as many connections as it
//! is let, some idle after a keep-alive request, some sending their request head a byte at a
//! time and never finishing it, and opens a new one whenever one is closed or refused.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::connect_from;

/// What one peer does: from `src`, `idle` keep-alive connections (one request each, then
/// idle) and `half_sent` connections trickling an unfinished request head.
pub struct Peer {
    pub src: [u8; 4],
    pub idle: usize,
    pub half_sent: usize,
}

/// What the flood saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Connections opened.
    pub opened: u64,
    /// ... closed by the listener.
    pub closed: u64,
    /// ... answered `503` (refused) before being closed.
    pub refused: u64,
    /// Keep-alive requests answered.
    pub answered: u64,
}

pub struct Flood {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Seen>>,
}

struct Conn {
    src: [u8; 4],
    half_sent: bool,
    stream: Option<TcpStream>,
    sent: bool,
    last: Instant,
}

/// Starts the flood against `addr` on a thread of its own; it goes on until [`Flood::stop`].
pub fn start(addr: &str, peers: &[Peer]) -> Flood {
    let mut conns: Vec<Conn> = Vec::new();
    for p in peers {
        for i in 0..p.idle + p.half_sent {
            conns.push(Conn {
                src: p.src,
                half_sent: i >= p.idle,
                stream: None,
                sent: false,
                last: Instant::now(),
            });
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    let addr = addr.to_string();
    let thread = std::thread::spawn(move || {
        let mut seen = Seen::default();
        while !stopped.load(Ordering::Relaxed) {
            for c in &mut conns {
                pass(c, &addr, &mut seen);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        seen
    });
    Flood {
        stop,
        thread: Some(thread),
    }
}

impl Flood {
    /// Stops the flood (its connections close) and says what it saw.
    pub fn stop(mut self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn pass(c: &mut Conn, addr: &str, seen: &mut Seen) {
    let Some(s) = c.stream.as_mut() else {
        if let Ok(s) = connect_from(c.src, addr, false) {
            seen.opened += 1;
            c.stream = Some(s);
            c.sent = false;
            c.last = Instant::now();
        }
        return;
    };
    let mut buf = [0u8; 16 * 1024];
    let mut closed = false;
    match s.read(&mut buf) {
        Ok(0) => closed = true,
        Ok(n) => {
            if buf[..n].starts_with(b"HTTP/1.1 503") {
                seen.refused += 1;
            } else if buf[..n].starts_with(b"HTTP/1.1 ") {
                seen.answered += 1;
            }
        }
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::NotConnected
            ) => {}
        Err(_) => closed = true,
    }
    if !closed {
        let wrote = if !c.sent {
            let head: &[u8] = if c.half_sent {
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: "
            } else {
                b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
            };
            s.write(head).map(|_| c.sent = true)
        } else if c.half_sent && c.last.elapsed() >= Duration::from_millis(250) {
            c.last = Instant::now();
            s.write(b"a").map(|_| ())
        } else {
            Ok(())
        };
        if let Err(e) = wrote
            && !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::NotConnected
            )
        {
            closed = true;
        }
    }
    if closed {
        seen.closed += 1;
        c.stream = None;
    }
}
