//! What a lower module calls back up into: a `&'static` table or function that `lib.rs`'s
//! constructor registers once, before anything is resolved (the launch hooks' installation,
//! the fast-path publish, the gate's device-API tables, the gate's hooks for the agent link,
//! the accounting's hooks). A pointer in an atomic: set with Release, read with Acquire; no
//! heap, no lock, usable from any thread and in a fork child.

use std::sync::atomic::{AtomicPtr, Ordering::Acquire, Ordering::Release};

/// A `&'static T` registered at load time (None until then).
pub struct Registered<T: Sync + 'static>(AtomicPtr<T>);

impl<T: Sync + 'static> Registered<T> {
    pub const fn new() -> Self {
        Registered(AtomicPtr::new(std::ptr::null_mut()))
    }

    /// Registers `v`; called once, by the library's constructor.
    pub fn set(&self, v: &'static T) {
        self.0.store(std::ptr::from_ref(v).cast_mut(), Release);
    }

    /// What was registered, if anything yet.
    pub fn get(&self) -> Option<&'static T> {
        let p = self.0.load(Acquire);
        // SAFETY: only `set` stores here, a pointer from a `&'static T`.
        (!p.is_null()).then(|| unsafe { &*p })
    }
}

#[cfg(test)]
mod tests {
    use super::Registered;

    static HOOK: Registered<fn(u32) -> u32> = Registered::new();
    static DOUBLE: fn(u32) -> u32 = |x| 2 * x;

    #[test]
    fn empty_until_set_then_the_registered_value() {
        assert!(HOOK.get().is_none());
        HOOK.set(&DOUBLE);
        assert_eq!(HOOK.get().map(|f| f(21)), Some(42));
    }
}
