//! Which processes use the shim: those whose shim said Hello to this agent, and those holding
//! a ledger's usage memfd (shims of an earlier agent that have not reconnected yet), looked
//! up once per process. The budgets take what the *other* processes of a ledger's domain
//! hold off the shims' budget ([`super::budget`]).
//!
//! A shim that said Hello is kept with the pidfd taken when its connection was accepted: its
//! PID counts as a shim only while that pidfd's process lives, so a PID reused by a process
//! that bypasses the shim is never taken for the shim that once had it.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::pidfd::alive;

#[derive(Debug, Default)]
pub struct Shims(Mutex<ShimPids>);

#[derive(Debug, Default)]
struct ShimPids {
    /// Host PID -> the pidfd of the process that said Hello with it, and the cgroup of the
    /// ledger it got.
    hello: HashMap<u32, (Arc<OwnedFd>, String)>,
    looked_up: HashMap<u32, bool>,
}

impl Shims {
    /// Remembers the shim of host process `pid`, named by `pidfd`, which got the ledger of
    /// cgroup `ledger`.
    pub fn register(&self, pid: u32, pidfd: Arc<OwnedFd>, ledger: &str) {
        self.0
            .lock()
            .expect("shims lock")
            .hello
            .insert(pid, (pidfd, ledger.to_string()));
    }

    /// Live processes whose shim said Hello (for the metrics).
    pub fn connected(&self) -> usize {
        let s = self.0.lock().expect("shims lock");
        s.hello.values().filter(|(fd, _)| alive(fd)).count()
    }

    /// Forgets processes that are gone; returns the ledgers (their cgroups) of the shims
    /// that were among them, whose slots may now be taken back.
    pub fn prune(&self) -> Vec<String> {
        let exists = |p: &u32| Path::new(&format!("/proc/{p}")).exists();
        let mut s = self.0.lock().expect("shims lock");
        let mut died = Vec::new();
        s.hello.retain(|_, (fd, ledger)| {
            let live = alive(fd);
            if !live {
                died.push(std::mem::take(ledger));
            }
            live
        });
        s.looked_up.retain(|p, _| exists(p));
        died
    }

    pub fn uses_shim(&self, pid: u32) -> bool {
        let mut s = self.0.lock().expect("shims lock");
        if s.hello.get(&pid).is_some_and(|(fd, _)| alive(fd)) {
            return true;
        }
        *s.looked_up
            .entry(pid)
            .or_insert_with(|| holds_usage_memfd(pid))
    }
}

/// Whether process `pid` has a ledger's usage memfd open.
fn holds_usage_memfd(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.filter_map(Result::ok).any(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| fgpu_ledger::usage_tag(&t.to_string_lossy()).is_some())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::pidfd::pidfd_open;

    #[test]
    fn a_shims_pid_counts_only_while_its_pidfds_process_lives() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let shims = Shims::default();
        shims.register(pid, Arc::new(pidfd_open(pid).unwrap()), "/t");
        assert!(shims.uses_shim(pid));
        assert_eq!(shims.connected(), 1);
        child.kill().unwrap();
        child.wait().unwrap();
        // Whoever has the PID now, the registered shim is gone.
        assert_eq!(shims.connected(), 0);
        assert!(
            !shims
                .0
                .lock()
                .unwrap()
                .hello
                .get(&pid)
                .is_some_and(|(f, _)| alive(f))
        );
        assert_eq!(
            shims.prune(),
            ["/t"],
            "its ledger's slots may be taken back"
        );
        assert!(shims.0.lock().unwrap().hello.is_empty());
    }
}
