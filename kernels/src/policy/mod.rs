//! The learned policy's numeric pieces: the masked, floored action distribution of every head
//! ([`distribution`]) and the draw of a whole factored action with op-conditioned masks ([`sampler`]),
//! the same log-prob and entropy as candle ops for the update ([`log_prob`]), the factored LSTM network
//! in candle ([`network`]), generalised advantage
//! estimation ([`gae`]), the critic's target scale ([`value_normalizer`]), the rollout buffer ([`rollout`]),
//! Adam ([`adam`]) and the agent with its PPO update ([`ppo`]).

pub mod adam;
pub mod distribution;
pub mod gae;
pub mod log_prob;
pub mod network;
pub mod ppo;
pub mod rollout;
pub mod sampler;
pub mod value_normalizer;
