//! Simulated GPU driver (work in progress).
