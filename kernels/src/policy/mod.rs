//! The learned policy's numeric pieces that are plain functions over batches: the masked, floored
//! action distribution of every head ([`distribution`]), generalised advantage estimation ([`gae`]) and
//! the critic's target scale ([`value_normalizer`]). The network and the PPO update (candle) build on
//! them.

pub mod distribution;
pub mod gae;
pub mod value_normalizer;
