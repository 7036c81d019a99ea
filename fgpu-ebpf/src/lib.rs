//! eBPF object
