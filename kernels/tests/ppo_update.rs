//! The PPO update on fixed batches collected by the agent itself (the same network step, draw and
//! buffer the Decide and Record systems use): the direction of one update, the clip fraction and the
//! KL early stop over several epochs, and the death penalty's cut.

use candle_core::{DType, Device, Tensor};
use esper_components::masks::{MaskParams, MaskSeedInfo, compute_action_masks};
use esper_components::{ActionMasks, AlphaMode, Head, LifecycleOp, SeedStage, Topology};
use esper_kernels::policy::distribution::HEAD_FLOORS;
use esper_kernels::policy::log_prob::floored_log_prob;
use esper_kernels::policy::network::{PolicyShape, Recurrent};
use esper_kernels::policy::ppo::{PpoAgent, PpoConfig};
use esper_kernels::policy::rollout::{RolloutBuffer, StepRow};
use esper_kernels::policy::sampler::{DrawScratch, draw, head_mask};
use esper_kernels::rng::{Purpose, StreamKey};

const SLOTS: usize = 3;

fn shape() -> PolicyShape {
    PolicyShape { n_slots: SLOTS, obs_dim: 23 + 31 * SLOTS, hidden: 32, head_hidden: 16 }
}

/// Masks of a random slot state (empty slots and seeds at random stages).
fn masks(stream: &mut esper_kernels::rng::Stream) -> ActionMasks {
    let slots: Vec<Option<MaskSeedInfo>> = (0..SLOTS)
        .map(|_| {
            let stage = SeedStage::ALL[stream.below(10) as usize];
            (stream.below(2) == 0 && stage.has_seed()).then(|| MaskSeedInfo {
                stage,
                seed_age_epochs: stream.below(12) as u32,
                alpha_mode: AlphaMode::Hold,
            })
        })
        .collect();
    let params = MaskParams {
        topology: Topology::Cnn,
        max_seeds: 3,
        allow_governor_override: false,
        disable_advance: false,
    };
    let seeds = slots.iter().filter(|s| s.is_some()).count() as u32;
    compute_action_masks(&slots, seeds, &params)
}

/// `rows` envs × `cols` steps drawn by `agent` from random observations; every row truncates at its
/// last step. Rewards are left 0 for the test to set.
fn collect(agent: &PpoAgent, rows: usize, cols: usize, seed: u64) -> RolloutBuffer {
    let sh = agent.net.shape;
    let mut buffer = RolloutBuffer::new(rows, cols, sh.obs_dim, SLOTS);
    let mut stream = StreamKey::new(seed, 0, 0, Purpose::Test).stream(0);
    let mut state = Recurrent::zeros(rows, sh.hidden, DType::F32, &Device::Cpu).unwrap();
    let mut scratch = DrawScratch::default();
    for t in 0..cols {
        let obs: Vec<f32> = (0..rows * sh.obs_dim).map(|_| stream.uniform(-2.0, 2.0) as f32).collect();
        let blueprints: Vec<i64> = (0..rows * SLOTS).map(|_| stream.below(14) as i64 - 1).collect();
        let obs_t = Tensor::from_slice(&obs, (rows, sh.obs_dim), &Device::Cpu).unwrap();
        let out = agent.net.step(&obs_t, &blueprints, &state).unwrap();
        let logits: Vec<Vec<f32>> =
            out.logits.iter().map(|l| l.flatten_all().unwrap().to_vec1().unwrap()).collect();
        let values: Vec<f32> = out.value.to_vec1().unwrap();
        let sizes = sh.head_sizes();
        for e in 0..rows {
            let m = masks(&mut stream);
            let rows8: [&[f32]; 8] = std::array::from_fn(|h| &logits[h][e * sizes[h]..(e + 1) * sizes[h]]);
            let u: [f64; 8] = std::array::from_fn(|_| stream.next_f64());
            let d = draw(rows8, &m, u, false, &mut scratch);
            let op = LifecycleOp::from_index(d.action.op).unwrap();
            buffer.push(
                e,
                StepRow {
                    state: &obs[e * sh.obs_dim..(e + 1) * sh.obs_dim],
                    blueprints: &blueprints[e * SLOTS..(e + 1) * SLOTS],
                    action: d.action,
                    effective_op: op,
                    value: values[e],
                    reward: 0.0,
                    truncated: t + 1 == cols,
                    masks: &m,
                    contribution_targets: &[None; SLOTS],
                },
            );
        }
        state = out.state;
    }
    buffer
}

/// Per valid step, the op head's log-prob of the stored action under the agent's current weights.
fn op_log_probs(agent: &PpoAgent, b: &RolloutBuffer) -> Vec<f32> {
    head_log_probs(agent, b).swap_remove(Head::Op as usize)
}

/// One update with K = 1 on one-step episodes whose reward is +1 or −1: the op head's log-prob of
/// the stored action rises on average where the advantage was positive and falls where it was
/// negative (V is near 0 at initialisation, so the advantage has the reward's sign).
#[test]
fn one_update_raises_positive_and_lowers_negative_advantage_actions() {
    // The policy loss alone (the regularisers also move the shared trunk).
    let config = PpoConfig {
        value_coef: 0.0,
        entropy_coef: 0.0,
        entropy_coef_min: 0.0,
        entropy_floor_coefs: [0.0; 8],
        aux_coef: 0.0,
        ..PpoConfig::default()
    };
    let mut agent = PpoAgent::new(shape(), 5, config, &Device::Cpu).unwrap();
    let rows = 64;
    let mut buffer = collect(&agent, rows, 1, 6);
    // Only rows where the op head had a choice can move.
    let free: Vec<bool> = buffer.masks.iter().map(|m| m.op.iter().filter(|&&b| b).count() > 1).collect();
    for e in 0..rows {
        buffer.rewards[e] = if e % 2 == 0 { 1.0 } else { -1.0 };
    }
    let before = op_log_probs(&agent, &buffer);
    let metrics = agent.update(&buffer).unwrap().expect("a non-empty batch");
    let after = op_log_probs(&agent, &buffer);
    assert_eq!((metrics.epochs_run, agent.train_steps, agent.adam.step), (1, 1, 1));
    assert_eq!(metrics.clip_fraction, 0.0, "K = 1: the ratio is exactly 1");
    let (mut up, mut down, mut right) = (0, 0, 0);
    let (mut rise, mut fall) = (0.0f64, 0.0f64);
    for e in (0..rows).filter(|&e| free[e]) {
        let delta = (after[e] - before[e]) as f64;
        if e % 2 == 0 {
            up += 1;
            rise += delta;
            right += usize::from(delta > 0.0);
        } else {
            down += 1;
            fall += delta;
            right += usize::from(delta < 0.0);
        }
    }
    eprintln!(
        "rows {up}+{down}: mean rise {:.5}, mean fall {:.5}, {right} right",
        rise / up as f64,
        fall / down as f64
    );
    assert!(up >= 10 && down >= 10, "{up} positive and {down} negative rows with a choice");
    assert!(rise > 0.0 && fall < 0.0, "Σ Δ log π: {rise} where A > 0, {fall} where A < 0");
    // Row by row it is a majority, not a law: one shared network moves every row's logits at once.
    assert!(right * 3 >= (up + down) * 2 - 3, "{right} of {} moved the advantage's way", up + down);
}

/// K = 4 on a fixed batch with a large step: after the first epoch the ratios leave the clip range
/// (clip fraction > 0); with a tiny KL bound the second epoch stops before its backward.
#[test]
fn several_epochs_clip_and_the_kl_bound_stops_them() {
    let config = PpoConfig { epochs: 4, lr: 3e-2, target_kl: None, ..PpoConfig::default() };
    let mut agent = PpoAgent::new(shape(), 7, config.clone(), &Device::Cpu).unwrap();
    let mut buffer = collect(&agent, 8, 6, 8);
    let mut stream = StreamKey::new(9, 0, 0, Purpose::Test).stream(0);
    buffer.rewards.iter_mut().for_each(|r| *r = stream.uniform(-1.0, 1.0) as f32);
    let m = agent.update(&buffer).unwrap().unwrap();
    assert_eq!((m.epochs_run, m.early_stopped), (4, false));
    assert!(m.clip_fraction > 0.0, "clip fraction {}", m.clip_fraction);
    assert!(m.approx_kl > 0.0);

    let bounded = PpoConfig { target_kl: Some(1e-9), ..config };
    let mut agent = PpoAgent::new(shape(), 7, bounded, &Device::Cpu).unwrap();
    let m = agent.update(&buffer).unwrap().unwrap();
    assert!(m.early_stopped);
    assert_eq!(m.epochs_run, 1, "the first epoch steps (KL 0), the second stops");
    assert_eq!(agent.adam.step, 1);
}

/// The same batch gives the same update bit for bit (nothing in the update draws randomness).
#[test]
fn the_update_is_deterministic() {
    let run = || {
        let mut agent = PpoAgent::new(shape(), 11, PpoConfig::default(), &Device::Cpu).unwrap();
        let mut buffer = collect(&agent, 4, 5, 12);
        buffer.rewards.iter_mut().enumerate().for_each(|(i, r)| *r = (i % 3) as f32 - 1.0);
        assert!(buffer.end_with_rollback(1)); // a death penalty in the middle of env 1's row
        let m = agent.update(&buffer).unwrap().unwrap();
        let weights: Vec<f32> = agent.net.vars()[1].as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        (m, weights)
    };
    let (a, wa) = run();
    let (b, wb) = run();
    assert_eq!(a, b);
    assert_eq!(wa, wb);
    assert_eq!(a.penalised_rollbacks, 1);
    assert!(a.grad_norm > 0.0 && a.value_loss > 0.0);
}

/// Per head (`Head as usize`), per step, the log-prob of the stored action under the agent's current
/// weights, each head's mask canonicalised by the stored op as the update does.
fn head_log_probs(agent: &PpoAgent, b: &RolloutBuffer) -> Vec<Vec<f32>> {
    let sh = agent.net.shape;
    let obs = Tensor::from_slice(&b.states, (b.n_envs, b.capacity, sh.obs_dim), &Device::Cpu).unwrap();
    let zero = Recurrent::zeros(b.n_envs, sh.hidden, DType::F32, &Device::Cpu).unwrap();
    let out = agent.net.sequence(&obs, &b.blueprints, &zero, &[]).unwrap();
    let n = b.n_envs * b.capacity;
    let sizes = sh.head_sizes();
    Head::ALL
        .iter()
        .map(|&head| {
            let (h, k) = (head as usize, sizes[head as usize]);
            let mut mask = vec![false; n * k];
            for i in 0..n {
                let op = LifecycleOp::from_index(b.actions[i].op).unwrap();
                head_mask(&b.masks[i], head, op, &mut mask[i * k..(i + 1) * k]);
            }
            let actions: Vec<u8> = b.actions.iter().map(|a| a.head(head)).collect();
            let (lp, _) = floored_log_prob(&out.logits[h], &mask, HEAD_FLOORS[h], &actions).unwrap();
            lp.to_vec1().unwrap()
        })
        .collect()
}

/// simic §4.8.7e with the reference's masks: the approximate KL averages `(r − 1) − ln r` over every
/// step where a head is causally relevant to the effective op, forced steps included (the reference's
/// `compute_ratio_metrics` gets `compute_per_head_advantages`' masks, not the losses' M_h, which leave
/// forced steps out). Computed here from the log-probs before and after one step of the update, which a
/// tiny KL bound stops before its second backward.
#[test]
fn approx_kl_counts_forced_steps_as_the_reference_does() {
    let config = PpoConfig { epochs: 2, lr: 3e-2, target_kl: Some(1e-12), ..PpoConfig::default() };
    let mut agent = PpoAgent::new(shape(), 13, config, &Device::Cpu).unwrap();
    let mut buffer = collect(&agent, 16, 4, 14);
    let mut stream = StreamKey::new(15, 0, 0, Purpose::Test).stream(0);
    buffer.rewards.iter_mut().for_each(|r| *r = stream.uniform(-1.0, 1.0) as f32);
    // Random slot states rarely leave WAIT the only legal op: make every other WAIT step a forced one
    // (its stored action stays legal).
    let waits: Vec<usize> = (0..buffer.actions.len()).filter(|&i| buffer.actions[i].op == 0).collect();
    for &i in waits.iter().step_by(2) {
        buffer.masks[i].op = [true, false, false, false, false, false];
    }
    let forced = buffer.masks.iter().filter(|m| m.is_forced_wait()).count();
    assert!(forced >= 4, "{forced} forced steps in the batch");

    let before = head_log_probs(&agent, &buffer);
    let m = agent.update(&buffer).unwrap().unwrap();
    assert_eq!((m.epochs_run, m.early_stopped), (1, true));
    let after = head_log_probs(&agent, &buffer);

    // Σ_h Σ_t m_h·kl / Σ_h n_h, once over every relevant step and once leaving the forced ones out.
    let (mut kl, mut weight, mut kl_unforced, mut weight_unforced) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (i, stored) in buffer.actions.iter().enumerate() {
        let relevant = esper_components::relevant_heads(LifecycleOp::from_index(stored.op).unwrap());
        let is_forced = buffer.masks[i].is_forced_wait();
        for h in (0..8).filter(|&h| relevant[h]) {
            let log_ratio = (after[h][i] as f64 - before[h][i] as f64).clamp(-20.0, 20.0);
            let step_kl = log_ratio.exp() - 1.0 - log_ratio;
            kl += step_kl;
            weight += 1.0;
            if !is_forced {
                kl_unforced += step_kl;
                weight_unforced += 1.0;
            }
        }
    }
    let (want, unforced) = (kl / weight, kl_unforced / weight_unforced);
    eprintln!("approx KL {} against {want} (forced steps left out: {unforced})", m.approx_kl);
    assert!(want > 0.0 && (unforced - want) > 1e-3 * want, "the two masks must give different figures");
    assert!(
        (m.approx_kl - want).abs() <= 1e-4 * want,
        "approx KL {} where the reference's masks give {want}",
        m.approx_kl
    );
}
