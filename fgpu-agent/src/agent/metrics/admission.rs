//! Who gets a connection on the metrics listener. A peer is a source IP address. Each peer
//! may hold [`MAX_PER_PEER`] connections at once: its next one is refused at once. The
//! listener holds [`MAX_CONNECTIONS`] in all: when they are all taken, a newcomer takes the
//! oldest connection of the peer that holds the most, provided that peer holds more than the
//! newcomer's own; otherwise the newcomer is refused. So one peer, or many, can fill the
//! listener, but never keep out a peer that holds less than they do: the kubelet's probes
//! (one connection at a time from the node) always get in.
//!
//! Nothing here waits: a connection is admitted or refused the moment it is accepted, never
//! left in the kernel's backlog behind idle ones.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

/// Connections open at once, all peers together.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections open at once from one source address.
pub const MAX_PER_PEER: usize = 4;

/// The open connections, by peer.
pub struct Slots {
    max: usize,
    per_peer: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Each peer's connections, oldest first.
    peers: HashMap<IpAddr, Vec<Held>>,
    open: usize,
    next_id: u64,
}

struct Held {
    id: u64,
    since: Instant,
    evict: Arc<Notify>,
}

/// What a newly accepted connection gets.
pub enum Admission {
    Admitted(Slot),
    /// Its peer already holds `per_peer` connections.
    PeerFull,
    /// The listener is full and no peer holds more than this one.
    Full,
}

/// An admitted connection's place; dropping it frees the place.
pub struct Slot {
    slots: Arc<Slots>,
    peer: IpAddr,
    id: u64,
    evict: Arc<Notify>,
    /// The peer whose connection this one took, if the listener was full.
    pub took_from: Option<IpAddr>,
}

impl Slot {
    /// Resolves once a newcomer has taken this connection's place: close it then.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.slots.inner.lock().expect("metrics slots lock");
        let Some(held) = inner.peers.get_mut(&self.peer) else {
            return;
        };
        // An evicted connection's entry is gone already.
        let Some(at) = held.iter().position(|h| h.id == self.id) else {
            return;
        };
        held.remove(at);
        if held.is_empty() {
            inner.peers.remove(&self.peer);
        }
        inner.open -= 1;
    }
}

impl Slots {
    pub fn new(max: usize, per_peer: usize) -> Arc<Slots> {
        Arc::new(Slots {
            max,
            per_peer,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// Admits a connection from `peer`, or says why not (module note).
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Admission {
        // An IPv4 client of a dual-stack listener is the same peer as over IPv4.
        let peer = peer.to_canonical();
        let mut inner = self.inner.lock().expect("metrics slots lock");
        let mine = inner.peers.get(&peer).map_or(0, Vec::len);
        if mine >= self.per_peer {
            return Admission::PeerFull;
        }
        let mut took_from = None;
        if inner.open >= self.max {
            // The peer holding the most (the one whose oldest connection is older, among
            // equals), if it holds more than this one.
            let victim = inner
                .peers
                .iter()
                .filter(|(p, held)| **p != peer && held.len() > mine)
                .max_by(|(_, a), (_, b)| {
                    a.len()
                        .cmp(&b.len())
                        .then_with(|| b[0].since.cmp(&a[0].since))
                })
                .map(|(p, _)| *p);
            let Some(victim) = victim else {
                return Admission::Full;
            };
            let held = inner.peers.get_mut(&victim).expect("the victim's entry");
            let oldest = held.remove(0);
            if held.is_empty() {
                inner.peers.remove(&victim);
            }
            inner.open -= 1;
            oldest.evict.notify_one();
            took_from = Some(victim);
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let evict = Arc::new(Notify::new());
        inner.peers.entry(peer).or_default().push(Held {
            id,
            since: Instant::now(),
            evict: Arc::clone(&evict),
        });
        inner.open += 1;
        Admission::Admitted(Slot {
            slots: Arc::clone(self),
            peer,
            id,
            evict,
            took_from,
        })
    }

    /// Connections open now (for tests).
    #[cfg(test)]
    fn open(&self) -> usize {
        self.inner.lock().unwrap().open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn slot(a: Admission) -> Slot {
        match a {
            Admission::Admitted(s) => s,
            Admission::PeerFull => panic!("refused: peer full"),
            Admission::Full => panic!("refused: full"),
        }
    }

    #[test]
    fn a_peer_is_held_to_its_share_and_others_still_get_in() {
        let slots = Slots::new(8, 4);
        let mut held: Vec<Slot> = (0..4).map(|_| slot(slots.admit(ip(1)))).collect();
        assert!(matches!(slots.admit(ip(1)), Admission::PeerFull));
        // The same address over a dual-stack listener is the same peer.
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert!(matches!(slots.admit(mapped), Admission::PeerFull));
        held.push(slot(slots.admit(ip(2))));
        // A closed connection frees its place.
        held.remove(0);
        assert_eq!(slots.open(), 4);
        held.push(slot(slots.admit(ip(1))));
        assert_eq!(slots.open(), 5);
    }

    #[test]
    fn when_full_a_newcomer_takes_the_oldest_place_of_the_peer_holding_the_most() {
        let slots = Slots::new(8, 4);
        let a: Vec<Slot> = (0..4).map(|_| slot(slots.admit(ip(1)))).collect();
        let b: Vec<Slot> = (0..3).map(|_| slot(slots.admit(ip(2)))).collect();
        let c = slot(slots.admit(ip(3)));
        assert_eq!(slots.open(), 8);
        // The node's probe (a peer holding nothing) gets in at a's expense: a's oldest.
        let probe = slot(slots.admit(ip(9)));
        assert_eq!(probe.took_from, Some(ip(1)));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let told = |s: &Slot| {
            rt.block_on(async {
                tokio::time::timeout(std::time::Duration::from_millis(1), s.evicted())
                    .await
                    .is_ok()
            })
        };
        assert!(told(&a[0]) && !told(&a[1]) && !told(&b[0]) && !told(&c));
        // a and b now hold 3 each; a's oldest was opened before b's, so it goes next.
        let second = slot(slots.admit(ip(8)));
        assert_eq!(second.took_from, Some(ip(1)));
        assert_eq!(slots.open(), 8);
        // Eight peers holding one each: a ninth takes the oldest; then it holds as many as
        // anyone and is refused.
        drop(a);
        drop(b);
        drop(c);
        drop(probe);
        drop(second);
        assert_eq!(slots.open(), 0);
        let even: Vec<Slot> = (1..=8).map(|i| slot(slots.admit(ip(i)))).collect();
        let more = slot(slots.admit(ip(9)));
        assert_eq!(more.took_from, Some(ip(1)));
        assert!(matches!(slots.admit(ip(9)), Admission::Full));
        drop(even);
    }
}
