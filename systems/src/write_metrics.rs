//! Record: one `metrics.jsonl` line per env per epoch, written into the run's [`MetricsSink`]. Each line
//! carries the env's validation and training figures, the action its policy sampled (`sampled_op`,
//! `sampled_slot`), the op that counts for the reward (`effective_op`), what became of the sampled op
//! (`outcome`), every slot's stage and alpha, and the reward — null for an env that rolled back
//! (it gets none): `reward` (raw), `reward_norm`, `reward_components` (the named terms of the run's
//! mode), and — when
//! the sink logs them — `reward_inputs`, every input the reward kernel read for the env, and
//! `observation` (the env's raw Obs V3 features this step, `23 + 31·S` numbers) with its
//! `blueprint_indices`. The buffers
//! live in the system's `Local`s and are sized once, so a step's lines allocate nothing.

use crate::build_observations::ObsBatch;
use crate::compute_rewards::RewardBatch;
use crate::host_resources::StepClock;
use crate::resources::{ActionBatch, EffectiveOps, EnvCount, OpOutcomes};
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::{
    EnvIndex, HostMetrics, LifecycleOp, RewardConfig, SeedAlpha, SeedStage, SlotConfig, SlotIndex, Stage,
};
use esper_kernels::reward::Term;
use std::io::Write;

/// Where the Record stage writes `metrics.jsonl`. An I/O error stops the writing and is kept for the
/// run driver to report after the step (a system has no caller to return it to).
#[derive(Resource)]
pub struct MetricsSink {
    out: Box<dyn Write + Send + Sync>,
    slot_names: Vec<String>,
    /// The reward terms a line carries (those of the run's mode).
    reward_terms: &'static [Term],
    log_reward_inputs: bool,
    log_observations: bool,
    error: Option<String>,
}

impl MetricsSink {
    /// A sink for the default reward's terms, without reward inputs.
    pub fn new(out: Box<dyn Write + Send + Sync>, slots: &SlotConfig) -> Self {
        Self {
            out,
            slot_names: slots.ids().iter().map(|s| s.to_string()).collect(),
            reward_terms: Term::of(&RewardConfig::default()),
            log_reward_inputs: false,
            log_observations: false,
            error: None,
        }
    }

    /// Carry `reward`'s terms, and every reward input when `log_inputs`.
    pub fn with_reward(mut self, reward: &RewardConfig, log_inputs: bool) -> Self {
        self.reward_terms = Term::of(reward);
        self.log_reward_inputs = log_inputs;
        self
    }

    /// Carry each env's raw observation and blueprint indices when `log`.
    pub fn with_observations(mut self, log: bool) -> Self {
        self.log_observations = log;
        self
    }

    /// The first write error, if any (the sink writes nothing after it).
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// One more line (the run's per-round line), flushed; a failure is kept like a step's.
    pub fn write_line(&mut self, line: &serde_json::Value) {
        if self.error.is_some() {
            return;
        }
        let result =
            json_line(&mut self.out, line).and_then(|()| self.out.flush().map_err(|e| e.to_string()));
        if let Err(e) = result {
            self.error = Some(format!("metrics.jsonl: {e}"));
        }
    }
}

/// `value` as one JSON line.
fn json_line(out: &mut dyn Write, value: &impl serde::Serialize) -> Result<(), String> {
    serde_json::to_writer(&mut *out, value).map_err(|err| err.to_string())?;
    out.write_all(b"\n").map_err(|err| err.to_string())
}

/// One line of `metrics.jsonl`.
#[derive(serde::Serialize)]
struct MetricsLine<'a> {
    env: u32,
    round: u64,
    epoch: u64,
    val_acc: f64,
    val_loss: f64,
    train_loss: f64,
    train_acc: f64,
    sampled_op: &'a str,
    sampled_slot: &'a str,
    effective_op: &'a str,
    outcome: &'a str,
    stages: &'a [&'static str],
    alphas: &'a [f64],
    reward: Option<f64>,
    reward_norm: Option<f64>,
    reward_components: Option<TermsView<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reward_inputs: Option<InputsView<'a>>,
    /// The raw observation the policy's input was normalised from (a non-finite value reads null).
    #[serde(skip_serializing_if = "Option::is_none")]
    observation: Option<&'a [f32]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    blueprint_indices: Option<&'a [i64]>,
}

/// One env's reward terms as a JSON object `{name: value}` (no map is built).
struct TermsView<'a> {
    batch: &'a RewardBatch,
    terms: &'static [Term],
    env: usize,
}

impl serde::Serialize for TermsView<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.terms.len()))?;
        for &term in self.terms {
            map.serialize_entry(term.name(), &self.batch.outputs.term(term, self.env))?;
        }
        map.end()
    }
}

/// Every input the reward kernel read for one env (simic §2.0 names), enough to recompute its reward.
struct InputsView<'a> {
    batch: &'a RewardBatch,
    slot_names: &'a [String],
    env: usize,
}

impl serde::Serialize for InputsView<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let (x, out, e) = (&self.batch.inputs, &self.batch.outputs, self.env);
        let k = x.target_slot[e] as usize;
        let i = e * x.n_slots + k;
        let mut m = serializer.serialize_map(None)?;
        m.serialize_entry("epoch", &x.epoch)?;
        m.serialize_entry("max_epochs", &x.max_epochs)?;
        m.serialize_entry("action_for_reward", x.op[e].name())?;
        m.serialize_entry("target_slot", self.slot_names.get(k).map_or("", String::as_str))?;
        m.serialize_entry("stage", x.stage[i].name())?;
        m.serialize_entry("previous_stage", x.previous_stage[i].name())?;
        m.serialize_entry("epochs_in_stage", &x.epochs_in_stage[i])?;
        m.serialize_entry("previous_epochs_in_stage", &x.previous_epochs_in_stage[i])?;
        m.serialize_entry("seed_age_epochs", &x.seed_age[i])?;
        m.serialize_entry("alpha", &x.alpha[i])?;
        m.serialize_entry("seed_contribution", &out.contribution[e])?;
        m.serialize_entry("cf_imp", &x.cf_imp[e])?;
        m.serialize_entry("progress", &out.progress[e])?;
        m.serialize_entry("acc_at_germination", &x.acc_at_germination[i])?;
        m.serialize_entry("improvement_since_stage_start", &x.improvement_since_stage_start[i])?;
        m.serialize_entry("total_improvement", &x.total_improvement[i])?;
        m.serialize_entry("interaction_sum", &x.interaction_sum[i])?;
        m.serialize_entry("val_acc", &x.val_acc[e])?;
        m.serialize_entry("val_loss", &x.val_loss[e])?;
        m.serialize_entry("acc_delta", &x.acc_delta[e])?;
        // +∞ at an episode's first epoch (no previous loss): JSON has no infinity, so it reads null.
        m.serialize_entry("loss_delta", &x.loss_delta[e])?;
        m.serialize_entry("stable_val_acc", &x.stable_val_acc[e])?;
        m.serialize_entry("committed_val_acc", &x.committed_val_acc[e])?;
        m.serialize_entry("host_params", &x.host_params)?;
        m.serialize_entry("effective_seed_params", &out.effective_seed_params[e])?;
        m.serialize_entry("alpha_delta_sq_sum", &out.alpha_delta_sq_sum[e])?;
        m.serialize_entry("fossil_params", &out.fossil_params[e])?;
        m.serialize_entry("n_active", &out.n_active[e])?;
        m.serialize_entry("n_fossil", &x.n_fossil[e])?;
        m.serialize_entry("n_contrib_fossil", &x.n_contrib_fossil[e])?;
        m.serialize_entry("escrow_credit_prev", &x.escrow_credit[i])?;
        m.serialize_entry("escrow_credit_next", &out.escrow_credit[i])?;
        m.serialize_entry("pending_auto_prune_penalty", &x.pending_auto_prune_penalty[e])?;
        m.serialize_entry("pending_hindsight_credit", &x.pending_hindsight_credit[e])?;
        let row = e * x.n_slots..(e + 1) * x.n_slots;
        m.serialize_entry("slot_stages", &StageNames(&x.stage[row.clone()]))?;
        m.serialize_entry("slot_alphas", &x.alpha[row.clone()])?;
        m.serialize_entry("slot_prev_alphas", &x.prev_alpha[row.clone()])?;
        m.serialize_entry("slot_params", &x.params[row.clone()])?;
        m.serialize_entry("slot_prev_params", &x.prev_params[row.clone()])?;
        m.serialize_entry("slot_trainable_params", &x.trainable_params[row.clone()])?;
        m.serialize_entry("slot_seed_ages", &x.seed_age[row.clone()])?;
        m.serialize_entry("slot_contributions", &x.contribution[row.clone()])?;
        m.serialize_entry("slot_drip_scales", &x.drip_scale[row.clone()])?;
        m.serialize_entry("slot_escrow_credits_prev", &x.escrow_credit[row.clone()])?;
        m.serialize_entry("slot_escrow_credits_next", &out.escrow_credit[row.clone()])?;
        m.end()
    }
}

/// Stage names of a slot row as a JSON array.
struct StageNames<'a>(&'a [SeedStage]);

impl serde::Serialize for StageNames<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|s| s.name()))
    }
}

/// The system's reused `[E]` and `[E × S]` columns.
#[derive(Default)]
pub struct MetricsScratch {
    metrics: Vec<HostMetrics>,
    stages: Vec<&'static str>,
    alphas: Vec<f64>,
}

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn write_metrics(
    envs: Query<(&EnvIndex, &HostMetrics)>,
    slots: Query<(&EnvIndex, &SlotIndex, &Stage, &SeedAlpha)>,
    actions: Res<ActionBatch>,
    effective: Res<EffectiveOps>,
    outcomes: Res<OpOutcomes>,
    clock: Res<StepClock>,
    n_envs: Res<EnvCount>,
    rewards: Res<RewardBatch>,
    observations: Res<ObsBatch>,
    sink: Option<ResMut<MetricsSink>>,
    mut scratch: Local<MetricsScratch>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Record::write_metrics");
    // No sink (a replay's re-run), or one that failed: nothing to write.
    let Some(mut sink) = sink.filter(|s| s.error.is_none()) else { return };
    let n_slots = sink.slot_names.len();
    let MetricsScratch { metrics, stages, alphas } = &mut *scratch;
    metrics.resize(n_envs.0, HostMetrics::default());
    stages.resize(n_envs.0 * n_slots, "DORMANT");
    alphas.resize(n_envs.0 * n_slots, 0.0);
    for (env, m) in &envs {
        metrics[env.0 as usize] = *m;
    }
    for (env, index, stage, alpha) in &slots {
        let row = env.0 as usize * n_slots + index.0 as usize;
        stages[row] = stage.current.name();
        alphas[row] = alpha.0;
    }
    let sink = &mut *sink;
    let result =
        (|| -> Result<(), String> {
            for (e, m) in metrics.iter().enumerate() {
                let action = actions.get(e);
                let line =
                    MetricsLine {
                        env: e as u32,
                        round: clock.round,
                        epoch: clock.epoch,
                        val_acc: m.val_accuracy,
                        val_loss: m.val_loss,
                        train_loss: m.train_loss,
                        train_acc: m.train_accuracy,
                        sampled_op: LifecycleOp::from_index(action.op).map_or("?", LifecycleOp::name),
                        sampled_slot: sink.slot_names.get(action.slot as usize).map_or("", String::as_str),
                        effective_op: effective.0[e].name(),
                        outcome: outcomes.0[e].name(),
                        stages: &stages[e * n_slots..(e + 1) * n_slots],
                        alphas: &alphas[e * n_slots..(e + 1) * n_slots],
                        reward: rewards.rewarded(e).then(|| rewards.outputs.raw[e]),
                        reward_norm: rewards.rewarded(e).then(|| rewards.normalized[e]),
                        reward_components: rewards.rewarded(e).then_some(TermsView {
                            batch: &rewards,
                            terms: sink.reward_terms,
                            env: e,
                        }),
                        reward_inputs: (sink.log_reward_inputs && rewards.rewarded(e))
                            .then_some(InputsView { batch: &rewards, slot_names: &sink.slot_names, env: e }),
                        observation: sink.log_observations.then(|| observations.raw_row(e)),
                        blueprint_indices: sink.log_observations.then(|| observations.blueprint_row(e)),
                    };
                json_line(&mut sink.out, &line)?;
            }
            sink.out.flush().map_err(|err| err.to_string())
        })();
    if let Err(err) = result {
        sink.error = Some(format!("metrics.jsonl: {err}"));
    }
}
