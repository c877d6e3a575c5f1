//! The hub's property tests of untrusted input, one test binary: request bodies and queries
//! through the real router (`fuzz_http`), `hub.toml` (`fuzz_config`), cursors, patterns and
//! stored names (`fuzz_cursors`). `BATON_FUZZ_CASES` sets the cases per property (the long run
//! in README.md); a failing case is kept under `proptest-regressions/`.

mod fuzz_config;
mod fuzz_cursors;
mod fuzz_http;
