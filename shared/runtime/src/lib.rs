//! Shared runtime (being built).
