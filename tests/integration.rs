//! The integration tests of `esper-ecs`, one test binary: each file beside this one is a module of it.
//! One binary rather than one per file: every file would otherwise be its own crate, link its own
//! copy of the dependencies and re-instantiate the generic host code it uses, which made most of
//! CI's build time; in one binary the tests also share the cores while the slow ones run.
//! `cargo test -p esper-ecs --test integration MODULE::` runs one file's tests.

mod backend_seam;
mod cli;
mod common;
mod compare;
mod deferred_trace;
mod observation_step;
mod ppo_train;
mod profile;
mod reward_step;
mod rollout_step;
mod signals;
mod step_bookkeeping;
mod trace;
mod train_loop;
