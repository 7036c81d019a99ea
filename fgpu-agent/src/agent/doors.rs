//! The agent's two sockets ("doors") and what each allows a peer to hold.
//!
//! - The **containers' socket** (`--socket`, default `/run/fgpu/fgpu.sock`, mode 0666, alone
//!   in its directory so that the directory can be bind-mounted into containers) answers a
//!   shim's Hello and the caller's own status; it refuses everything else.
//! - The **admin socket** (`--admin-socket`, default `/run/fgpu-admin/fgpu.sock`, mode 0600
//!   in a directory of mode 0700, never mounted into containers) serves every request, the
//!   control ones only to callers in the agent's PID, mount and user namespaces.
//!
//! Every connection is bounded: frame size, time to finish a frame, time idle before its
//! first request, time to take a reply, descriptors pending, one Hello, and connections per
//! door in total and per tenant ([`super::tenant`]: never a leaf cgroup, which a tenant can
//! multiply; its uid when the cgroup is unknown).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Which socket a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    Containers,
    Admin,
}

impl Door {
    pub fn name(self) -> &'static str {
        match self {
            Door::Containers => "containers",
            Door::Admin => "admin",
        }
    }
}

/// What one connection may use.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request payload (bytes); a header announcing more is refused at once.
    pub max_frame: usize,
    /// A frame must be complete this long after its first byte arrived.
    pub frame_timeout: Duration,
    /// A connection that has not said Hello is closed after this long without a request.
    /// (A shim keeps its connection open to notice an agent restart: after a well-formed Hello
    /// there is no idle limit; the connection is closed when the process that opened it
    /// exits.)
    pub idle_timeout: Duration,
    /// A reply must be taken by the peer within this long.
    pub write_timeout: Duration,
    /// Descriptors a connection may have pending (received, not yet consumed by a Hello).
    pub max_fds: usize,
    /// Connections open at once on this door, and per tenant.
    pub max_connections: usize,
    pub max_per_caller: usize,
    /// Requests answered at once (off the event thread); more wait their turn.
    pub concurrent_requests: usize,
}

impl Limits {
    pub fn containers(max_connections: usize, max_per_caller: usize) -> Self {
        Self {
            // A Hello is 20 bytes, a status request 12.
            max_frame: 1024,
            frame_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(5),
            // A Hello carries at most one (the usage memfd on a reconnect).
            max_fds: 2,
            max_connections,
            max_per_caller,
            concurrent_requests: 2,
        }
    }

    pub fn admin() -> Self {
        Self {
            max_frame: 64 << 10,
            frame_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(10),
            max_fds: 2,
            max_connections: 256,
            max_per_caller: 64,
            concurrent_requests: 4,
        }
    }
}

/// Counts open connections, in total and per tenant key.
#[derive(Debug)]
pub struct Budget {
    max_total: usize,
    max_per: usize,
    counts: Mutex<(usize, HashMap<String, usize>)>,
}

/// One admitted connection; gives its place back on drop.
#[derive(Debug)]
pub struct Admitted {
    budget: Arc<Budget>,
    key: String,
}

impl Budget {
    pub fn new(max_total: usize, max_per: usize) -> Arc<Self> {
        Arc::new(Self {
            max_total,
            max_per,
            counts: Mutex::new((0, HashMap::new())),
        })
    }

    /// Admits one more connection of `key`, or says why not.
    pub fn admit(self: &Arc<Self>, key: &str) -> Result<Admitted, String> {
        let mut counts = self.counts.lock().expect("budget lock");
        let (total, per) = &mut *counts;
        if *total >= self.max_total {
            return Err(format!(
                "too many connections: this socket holds at most {} at once; try again later",
                self.max_total
            ));
        }
        let mine = per.entry(key.to_string()).or_insert(0);
        if *mine >= self.max_per {
            return Err(format!(
                "too many connections from {key}: at most {} at once per tenant",
                self.max_per
            ));
        }
        *mine += 1;
        *total += 1;
        Ok(Admitted {
            budget: Arc::clone(self),
            key: key.to_string(),
        })
    }

    /// Open connections (total, and of `key`).
    #[cfg(test)]
    pub fn open(&self, key: &str) -> (usize, usize) {
        let counts = self.counts.lock().expect("budget lock");
        (counts.0, counts.1.get(key).copied().unwrap_or(0))
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self.budget.counts.lock().expect("budget lock");
        let (total, per) = &mut *counts;
        *total -= 1;
        if let Some(n) = per.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.key);
            }
        }
    }
}

/// Raises this process's soft descriptor limit to its hard limit (the default soft limit of
/// 1024 is below what the containers' socket admits); returns the soft limit now in force.
pub fn raise_fd_limit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write a valid rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        if rl.rlim_cur < rl.rlim_max {
            let want = libc::rlimit {
                rlim_cur: rl.rlim_max,
                rlim_max: rl.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                rl.rlim_cur = rl.rlim_max;
            }
        }
    }
    rl.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_in_total_and_per_caller_and_places_come_back() {
        let b = Budget::new(3, 2);
        let a1 = b.admit("/a").unwrap();
        let _a2 = b.admit("/a").unwrap();
        assert_eq!(
            b.admit("/a").unwrap_err(),
            "too many connections from /a: at most 2 at once per tenant"
        );
        let _b1 = b.admit("/b").unwrap();
        assert!(
            b.admit("/c")
                .unwrap_err()
                .starts_with("too many connections:")
        );
        assert_eq!(b.open("/a"), (3, 2));
        drop(a1);
        assert_eq!(b.open("/a"), (2, 1));
        let _c1 = b.admit("/c").unwrap();
    }
}
