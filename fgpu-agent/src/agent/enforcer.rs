//! What the enforce loop ([`super::enforce`]) remembers between its passes, and the one way
//! other threads reach it.
//!
//! The loop's task owns its [`Enforcer`], by value and without a lock: the cgroups processes
//! were seen exec'ing in, and the consecutive passes each limited cgroup has been over its
//! threshold in the kernel's count and in the driver's ([`super::unseen`]). The event thread
//! tells it of execs and removed cgroups through [`Notices`], the sending end of a channel
//! whose receiving end the enforcer holds; the loop takes them in between its passes. It
//! knows nothing else of the agent.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// What the event thread tells the enforce loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Notice {
    /// A process exec'd in this cgroup (the kernel's exec record).
    Exec(u64),
    /// This cgroup was removed (the kernel's record).
    CgroupGone(u64),
}

/// The event thread's end of the channel to the enforce loop.
#[derive(Debug, Clone)]
pub struct Notices(UnboundedSender<Notice>);

impl Notices {
    /// A process exec'd in cgroup `id` (from the kernel's exec record): a cgroup the loop has
    /// not seen wakes it for a pass.
    pub fn exec_in(&self, id: u64) {
        // The loop may be gone only while the agent shuts down.
        let _ = self.0.send(Notice::Exec(id));
    }

    /// Cgroup `id` was removed (from the kernel's record): the loop forgets it.
    pub fn cgroup_gone(&self, id: u64) {
        let _ = self.0.send(Notice::CgroupGone(id));
    }
}

/// What the enforcement side remembers between passes; the enforce loop owns it.
#[derive(Debug)]
pub struct Enforcer {
    inbox: UnboundedReceiver<Notice>,
    /// Cgroup ids processes were seen exec'ing in (a new one triggers a sync).
    seen: HashSet<u64>,
    /// Limited cgroups found over their threshold, by id: consecutive passes.
    over: Passes<u64>,
    /// The same for the driver's count ([`super::unseen`]), by (cgroup path, GPU).
    unseen: Passes<(String, u32)>,
}

/// A new enforcer, and the notices' end of its channel for the event thread.
pub fn channel() -> (Enforcer, Notices) {
    let (tx, rx) = unbounded_channel();
    let enforcer = Enforcer {
        inbox: rx,
        seen: HashSet::new(),
        over: Passes::default(),
        unseen: Passes::default(),
    };
    (enforcer, Notices(tx))
}

impl Enforcer {
    /// Waits for a notice that asks for a pass now (a process exec'd in a cgroup not seen
    /// before), taking in the others as they come, then takes in what else is queued (several
    /// new cgroups ask for one pass). Cancel-safe: a notice is taken in whole or left queued.
    /// Once the event thread is gone, never returns (the loop's tick goes on).
    pub async fn woken(&mut self) {
        loop {
            match self.inbox.recv().await {
                Some(notice) => {
                    if self.take(notice) {
                        break;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        }
        while let Ok(notice) = self.inbox.try_recv() {
            self.take(notice);
        }
    }

    /// Takes in one notice; whether it asks for a pass.
    fn take(&mut self, notice: Notice) -> bool {
        match notice {
            Notice::Exec(id) => self.seen.insert(id),
            Notice::CgroupGone(id) => {
                self.seen.remove(&id);
                self.over.0.remove(&id);
                false
            }
        }
    }

    /// Consecutive reconcile passes each limited cgroup (by id) was over its threshold in the
    /// kernel's count.
    pub fn over(&mut self) -> &mut Passes<u64> {
        &mut self.over
    }

    /// Consecutive reconcile passes each (cgroup path, GPU) was over in the driver's count.
    pub fn unseen(&mut self) -> &mut Passes<(String, u32)> {
        &mut self.unseen
    }
}

/// Consecutive passes each key has been found over.
#[derive(Debug)]
pub struct Passes<K>(HashMap<K, u32>);

impl<K> Default for Passes<K> {
    fn default() -> Self {
        Passes(HashMap::new())
    }
}

impl<K: Eq + Hash> Passes<K> {
    /// Forgets the keys a pass did not find over (`still_over` false).
    pub fn retain(&mut self, still_over: impl Fn(&K) -> bool) {
        self.0.retain(|key, _| still_over(key));
    }

    /// One more pass found `key` over: how many in a row now (1 the first time).
    pub fn count(&mut self, key: K) -> u32 {
        let passes = self.0.entry(key).or_insert(0);
        *passes += 1;
        *passes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_cgroup_wakes_the_loop_and_a_removed_one_is_forgotten() {
        let (mut e, notices) = channel();
        assert!(e.take(Notice::Exec(7)), "first exec in 7: a pass");
        assert!(!e.take(Notice::Exec(7)), "seen already");
        assert_eq!(e.over().count(7), 1);
        assert_eq!(e.over().count(7), 2);
        notices.cgroup_gone(7);
        let notice = e.inbox.try_recv().unwrap();
        assert!(!e.take(notice));
        assert_eq!(e.over().count(7), 1, "forgotten with its cgroup");
        assert!(e.take(Notice::Exec(7)), "re-created: a pass again");
    }

    #[tokio::test]
    async fn woken_takes_in_what_is_queued_behind_the_notice_that_woke_it() {
        let (mut e, notices) = channel();
        notices.exec_in(1);
        notices.exec_in(2);
        notices.cgroup_gone(1);
        e.woken().await;
        assert!(e.inbox.try_recv().is_err(), "all taken in");
        assert_eq!(e.seen, HashSet::from([2]));
    }
}
