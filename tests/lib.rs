//! End-to-end tests live in `it/`.
