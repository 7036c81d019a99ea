//! Fork: a child does not inherit its parent's CUDA allocations or contexts, so it starts
//! with empty tables, no context, and its own ledger slot (claimed at its next use of the
//! ledger; the parent's slot stays the parent's).

extern "C" fn child() {
    crate::ledger::after_fork_child();
    crate::account::reset_in_child();
    crate::cuda::context::reset_in_child();
    crate::gate::after_fork_child();
    crate::park::after_fork_child();
}

/// Registers the handler (from the constructor).
pub fn register() {
    // SAFETY: registering a plain extern "C" handler for the child only.
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
}
