//! End-to-end tests across imagepipe services against real brokers; the tests live in
//! `tests/` of this crate and arrive with the services they exercise.
