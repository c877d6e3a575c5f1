//! The shared crate's integration tests, one binary (one link): the tidy checks over the
//! workspace's own source, and the property tests of the identifier grammar and the PKI.
//!
//! Layout:
//! - `tidy`: rules a reviewer would otherwise have to remember.
//! - `fuzz_ids`: the identifier grammar, roles, error codes, payload text and durations.
//! - `fuzz_pki`: identity extraction from generated and damaged certificates.

mod fuzz_ids;
mod fuzz_pki;
mod tidy;
