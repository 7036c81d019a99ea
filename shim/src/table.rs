//! Fixed-size hash tables in anonymous memory: device pointer or handle → (size, meta, aux).
//!
//! Nothing here allocates from the heap: each table is one `mmap(MAP_NORESERVE)` region made
//! on first use (untouched pages cost nothing), split into shards that each have a spin lock
//! held only for the few instructions of one lookup, insert or delete — never across a driver
//! call. Linear probing with backward-shift deletion (no tombstones), so the tables do not
//! degrade under long alloc/free churn.
//!
//! After `fork`, the child calls [`Table::reset_in_child`]: a fresh zeroed mapping at the same
//! address and unlocked shards (CUDA allocations are not inherited by a fork child).

use std::sync::atomic::{
    AtomicBool, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Entry {
    /// 0 = empty slot.
    pub key: u64,
    pub size: u64,
    pub meta: u64,
    pub aux: u64,
}

const SHARDS: usize = 64;

pub struct Table {
    shard_bits: u32,
    base: AtomicUsize,
    locks: [AtomicBool; SHARDS],
}

struct Guard<'a>(&'a AtomicBool);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Release);
    }
}

fn lock(l: &AtomicBool) -> Guard<'_> {
    let mut spins = 0u32;
    while l
        .compare_exchange_weak(false, true, Acquire, Relaxed)
        .is_err()
    {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
    }
    Guard(l)
}

fn hash(key: u64) -> u64 {
    // Device pointers are 512-byte aligned: drop the low bits, then mix.
    let k = (key >> 9) ^ key;
    k.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Table {
    /// A table of `SHARDS << shard_bits` entries.
    pub const fn new(shard_bits: u32) -> Table {
        Table {
            shard_bits,
            base: AtomicUsize::new(0),
            locks: [const { AtomicBool::new(false) }; SHARDS],
        }
    }

    fn shard_cap(&self) -> usize {
        1 << self.shard_bits
    }

    fn bytes(&self) -> usize {
        SHARDS * self.shard_cap() * size_of::<Entry>()
    }

    fn map(&self, fixed: usize) -> usize {
        let flags = libc::MAP_PRIVATE
            | libc::MAP_ANONYMOUS
            | libc::MAP_NORESERVE
            | if fixed != 0 { libc::MAP_FIXED } else { 0 };
        // SAFETY: an anonymous mapping (at `fixed`, replacing our own earlier mapping of the
        // same size, when nonzero).
        let p = unsafe {
            libc::mmap(
                fixed as *mut libc::c_void,
                self.bytes(),
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED { 0 } else { p as usize }
    }

    /// The entries, mapping them on first use; None if mmap failed.
    fn entries(&self) -> Option<*mut Entry> {
        let b = self.base.load(Acquire);
        if b != 0 {
            return Some(b as *mut Entry);
        }
        let p = self.map(0);
        if p == 0 {
            return None;
        }
        match self.base.compare_exchange(0, p, Release, Acquire) {
            Ok(_) => Some(p as *mut Entry),
            Err(other) => {
                // SAFETY: unmapping the region we just mapped and nobody else saw.
                unsafe { libc::munmap(p as *mut libc::c_void, self.bytes()) };
                Some(other as *mut Entry)
            }
        }
    }

    /// Runs `f` on the shard of `key` with its lock held: (entries of the shard, capacity,
    /// home index of key).
    fn with_shard<R>(&self, key: u64, f: impl FnOnce(*mut Entry, usize, usize) -> R) -> Option<R> {
        let base = self.entries()?;
        let h = hash(key);
        let shard = (h >> 58) as usize % SHARDS;
        let cap = self.shard_cap();
        let _g = lock(&self.locks[shard]);
        // SAFETY: the shard lies inside the mapping (shard < SHARDS, cap entries each).
        let entries = unsafe { base.add(shard * cap) };
        Some(f(entries, cap, (h as usize) & (cap - 1)))
    }

    /// Inserts or replaces `key`. False if the shard is full (or no memory for the table).
    pub fn insert(&self, e: Entry) -> bool {
        if e.key == 0 {
            return false;
        }
        self.with_shard(e.key, |ents, cap, home| {
            for i in 0..cap {
                // SAFETY: index within the shard; the shard lock is held.
                let slot = unsafe { &mut *ents.add((home + i) & (cap - 1)) };
                if slot.key == 0 || slot.key == e.key {
                    *slot = e;
                    return true;
                }
            }
            false
        })
        .unwrap_or(false)
    }

    fn find(ents: *mut Entry, cap: usize, home: usize, key: u64) -> Option<usize> {
        for i in 0..cap {
            let idx = (home + i) & (cap - 1);
            // SAFETY: index within the shard; the caller holds the shard lock.
            let k = unsafe { (*ents.add(idx)).key };
            if k == key {
                return Some(idx);
            }
            if k == 0 {
                return None;
            }
        }
        None
    }

    /// Removes slot `idx` by shifting later members of its probe chain back.
    fn delete_at(ents: *mut Entry, cap: usize, mut idx: usize) {
        let mask = cap - 1;
        let mut next = (idx + 1) & mask;
        loop {
            // SAFETY: indices within the shard; the caller holds the shard lock.
            let e = unsafe { *ents.add(next) };
            if e.key == 0 {
                break;
            }
            let home = (hash(e.key) as usize) & mask;
            // Move `e` into the hole if its home is not in (idx, next] cyclically.
            let dist_hole = idx.wrapping_sub(home) & mask;
            let dist_next = next.wrapping_sub(home) & mask;
            if dist_hole <= dist_next {
                // SAFETY: as above.
                unsafe { *ents.add(idx) = e };
                idx = next;
            }
            next = (next + 1) & mask;
        }
        // SAFETY: as above.
        unsafe { *ents.add(idx) = Entry::default() };
    }

    /// Removes `key`, returning its entry.
    pub fn remove(&self, key: u64) -> Option<Entry> {
        if key == 0 {
            return None;
        }
        self.with_shard(key, |ents, cap, home| {
            let idx = Self::find(ents, cap, home, key)?;
            // SAFETY: idx from find, within the shard; lock held.
            let e = unsafe { *ents.add(idx) };
            Self::delete_at(ents, cap, idx);
            Some(e)
        })
        .flatten()
    }

    pub fn get(&self, key: u64) -> Option<Entry> {
        if key == 0 || self.base.load(Acquire) == 0 {
            return None;
        }
        self.with_shard(key, |ents, cap, home| {
            let idx = Self::find(ents, cap, home, key)?;
            // SAFETY: idx from find; lock held.
            Some(unsafe { *ents.add(idx) })
        })
        .flatten()
    }

    /// Changes `key`'s entry in place with the shard locked; `f` returns false to remove it.
    /// Returns the entry as `f` left it.
    pub fn update(&self, key: u64, f: impl FnOnce(&mut Entry) -> bool) -> Option<Entry> {
        if key == 0 {
            return None;
        }
        self.with_shard(key, |ents, cap, home| {
            let idx = Self::find(ents, cap, home, key)?;
            // SAFETY: idx from find; lock held.
            let e = unsafe { &mut *ents.add(idx) };
            let keep = f(e);
            let out = *e;
            if !keep {
                Self::delete_at(ents, cap, idx);
            }
            Some(out)
        })
        .flatten()
    }

    /// Removes every entry for which `pred` holds; calls `gone` on each (outside no lock
    /// held by the caller; shard lock held).
    pub fn remove_where(&self, mut pred: impl FnMut(&Entry) -> bool) {
        let Some(base) = (match self.base.load(Acquire) {
            0 => None,
            b => Some(b as *mut Entry),
        }) else {
            return;
        };
        let cap = self.shard_cap();
        for shard in 0..SHARDS {
            let _g = lock(&self.locks[shard]);
            // SAFETY: within the mapping.
            let ents = unsafe { base.add(shard * cap) };
            let mut i = 0;
            while i < cap {
                // SAFETY: within the shard; lock held.
                let e = unsafe { *ents.add(i) };
                if e.key != 0 && pred(&e) {
                    Self::delete_at(ents, cap, i);
                    // The slot may now hold a shifted entry: look at it again.
                    continue;
                }
                i += 1;
            }
        }
    }

    /// In a fork child: forget everything (fresh zero pages, unlocked shards).
    pub fn reset_in_child(&self) {
        let b = self.base.load(Acquire);
        if b != 0 && self.map(b) == 0 {
            self.base.store(0, Release);
        }
        for l in &self.locks {
            l.store(false, Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_find_remove_under_churn() {
        static T: Table = Table::new(6); // 64 per shard
        let key = |i: u64| 0x7f00_0000_0000 + i * 512;
        for round in 0..20u64 {
            for i in 0..1000 {
                assert!(T.insert(Entry {
                    key: key(i + round * 1000),
                    size: i,
                    meta: round,
                    aux: 0
                }));
            }
            for i in 0..1000 {
                let e = T.remove(key(i + round * 1000)).expect("present");
                assert_eq!((e.size, e.meta), (i, round));
            }
            assert!(T.get(key(round * 1000)).is_none());
        }
        assert!(T.insert(Entry {
            key: 5,
            size: 1,
            meta: 0,
            aux: 0
        }));
        assert_eq!(
            T.update(5, |e| {
                e.aux += 1;
                true
            })
            .map(|e| e.aux),
            Some(1)
        );
        T.update(5, |_| false);
        assert!(T.get(5).is_none());
        for i in 1..100 {
            T.insert(Entry {
                key: i,
                size: 0,
                meta: i % 2,
                aux: 0,
            });
        }
        T.remove_where(|e| e.meta == 1);
        assert!((1..100).all(|i| T.get(i).is_some() == (i % 2 == 0)));
    }
}
