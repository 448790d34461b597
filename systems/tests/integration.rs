//! The integration tests of `esper-systems`, one test binary: each file beside this one is a module of it.
//! One binary rather than one per file: every file would otherwise be its own crate, link its own
//! copy of the dependencies and re-instantiate the generic host code it uses, which made most of
//! CI's build time; in one binary the tests also share the cores while the slow ones run.
//! `cargo test -p esper-systems --test integration MODULE::` runs one file's tests.

mod ecs_equivalence;
mod observation;
mod optimizer_semantics;
mod policy;
