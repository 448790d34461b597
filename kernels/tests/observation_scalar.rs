//! A second, independent oracle for the batched observation kernel (`build_observations`): a
//! per-env scalar Obs V3 builder written straight from the spec (tamiyo §1.1–1.2), a property test
//! that the kernel equals it feature for feature on random worlds (every stage, op, blueprint, alpha
//! mode and algorithm; options present, absent and non-finite; values across every clamp and past
//! `E`), and a few hand-derived literal cases.
//!
//! Nothing here is taken from the kernel's code: only its public API (`ObsInputs` and its columns,
//! `obs_dim`, the feature-count constants) is used, and every formula and table (symlog, the stage
//! one-hot map, the enum contract ints) is restated from the spec text and the reference source.
//! Arithmetic is f64, each feature rounded to f32 when stored, as the reference's float32 tensor.
//! One documented deviation from the reference is reproduced: a non-finite current gradient health
//! encodes as 0.0 (the reference raises).

use esper_components::{AlphaAlgorithm, AlphaMode, BlueprintAction, LifecycleOp, SeedStage};
use esper_kernels::observation::{BASE_FEATURES, ObsInputs, SLOT_FEATURES, build_observations, obs_dim};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

// ---------------------------------------------------------------------------------------------
// Spec constants (tamiyo §0, §1). Written out here, not imported, so the oracle stays ours.
// ---------------------------------------------------------------------------------------------

const BASE: usize = 23;
const PER_SLOT: usize = 31;
const HISTORY: usize = 5;
/// `_SYMLOG_NORM`.
const SYMLOG_NORM: f64 = 7.0;
/// `OBS_V3_UNKNOWN_SENTINEL`.
const SENTINEL: f64 = -1.0;
/// `_IMPROVEMENT_CLAMP_PCT_PTS`.
const CLAMP_PP: f64 = 10.0;
/// `DEFAULT_GAMMA` (counterfactual freshness).
const GAMMA: f64 = 0.995;

// ---------------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------------

/// One slot's report and the loop's tracking for it. Only read when the stage has a state.
#[derive(Clone, Debug, Default)]
struct SlotCase {
    stage: SeedStage,
    blueprint: BlueprintAction,
    alpha: f64,
    contribution: Option<f64>,
    contribution_velocity: f64,
    blend_tempo_epochs: u32,
    alpha_start: f64,
    alpha_target: f64,
    alpha_mode: AlphaMode,
    alpha_steps_total: u32,
    alpha_steps_done: u32,
    alpha_algorithm: AlphaAlgorithm,
    interaction_sum: f64,
    gradient_norm: Option<f64>,
    gradient_health: Option<f64>,
    has_vanishing: Option<bool>,
    has_exploding: Option<bool>,
    gradient_health_prev: Option<f64>,
    epochs_in_stage: u32,
    epochs_since_counterfactual: Option<u32>,
    epochs_total: u32,
}

/// One env: its training signals, its last action, and one `SlotCase` per configured slot.
#[derive(Clone, Debug, Default)]
struct EnvCase {
    epoch: u32,
    val_loss: f64,
    val_accuracy: f64,
    /// The newest `history_len` values oldest first; the entries past `history_len` are junk.
    loss_history: [f64; HISTORY],
    accuracy_history: [f64; HISTORY],
    history_len: u8,
    last_action_success: bool,
    last_action_op: LifecycleOp,
    slots: Vec<SlotCase>,
}

#[derive(Clone, Debug)]
struct WorldCase {
    max_epochs: u32,
    envs: Vec<EnvCase>,
}

// ---------------------------------------------------------------------------------------------
// The scalar oracle (spec tamiyo §1.1–1.2)
// ---------------------------------------------------------------------------------------------

/// `sign(x)·ln(1+|x|)`, in the reference's form (`log1p(x)` for x ≥ 0, else `−log1p(−x)`).
fn symlog(x: f64) -> f64 {
    if x >= 0.0 { x.ln_1p() } else { -(-x).ln_1p() }
}

/// `min(x, E) / E`.
fn epoch_scale(x: f64, e: f64) -> f64 {
    x.min(e) / e
}

/// The reference's `max(-1.0, min(x, 1.0))` with Python's `min`/`max` (each returns its first
/// argument unless the second compares strictly better): NaN reads −1.0.
fn clamp1(x: f64) -> f64 {
    let m = if 1.0 < x { 1.0 } else { x };
    if m > -1.0 { m } else { -1.0 }
}

/// The slot "has a report" iff its state exists: UNKNOWN and DORMANT are empty.
fn present(stage: SeedStage) -> bool {
    !matches!(stage, SeedStage::Unknown | SeedStage::Dormant)
}

/// `STAGE_TO_INDEX` (stage value 5 is reserved and cannot be built).
fn stage_index(stage: SeedStage) -> usize {
    match stage {
        SeedStage::Unknown => 0,
        SeedStage::Dormant => 1,
        SeedStage::Germinated => 2,
        SeedStage::Training => 3,
        SeedStage::Blending => 4,
        SeedStage::Holding => 5,
        SeedStage::Fossilized => 6,
        SeedStage::Pruned => 7,
        SeedStage::Embargoed => 8,
        SeedStage::Resetting => 9,
    }
}

fn op_index(op: LifecycleOp) -> usize {
    match op {
        LifecycleOp::Wait => 0,
        LifecycleOp::Germinate => 1,
        LifecycleOp::SetAlphaTarget => 2,
        LifecycleOp::Prune => 3,
        LifecycleOp::Fossilize => 4,
        LifecycleOp::Advance => 5,
    }
}

fn mode_value(mode: AlphaMode) -> f64 {
    match mode {
        AlphaMode::Hold => 0.0,
        AlphaMode::Up => 1.0,
        AlphaMode::Down => 2.0,
    }
}

fn algorithm_value(alg: AlphaAlgorithm) -> f64 {
    match alg {
        AlphaAlgorithm::Add => 1.0,
        AlphaAlgorithm::Multiply => 2.0,
        AlphaAlgorithm::Gate => 3.0,
    }
}

/// The 5-wide history block: the `len` real values in the LAST positions, `−1` before them.
fn history_block(values: &[f64; HISTORY], len: u8, f: impl Fn(f64) -> f64) -> [f64; HISTORY] {
    let len = usize::from(len).min(HISTORY);
    let mut out = [SENTINEL; HISTORY];
    for i in 0..len {
        out[HISTORY - len + i] = f(values[i]);
    }
    out
}

/// One env's observation row (`23 + 31·S` f32) and blueprint indices (`S` i64).
fn scalar_obs(env: &EnvCase, max_epochs: u32) -> (Vec<f32>, Vec<i64>) {
    let n = env.slots.len();
    let e = f64::from(max_epochs);
    let mut row = vec![0.0f64; BASE + PER_SLOT * n];
    let mut bp = vec![-1i64; n];

    // §1.1 base block.
    row[0] = epoch_scale(f64::from(env.epoch), e);
    row[1] = symlog(env.val_loss) / SYMLOG_NORM;
    row[2] = env.val_accuracy / 100.0;
    let loss = history_block(&env.loss_history, env.history_len, |x| symlog(x) / SYMLOG_NORM);
    let acc = history_block(&env.accuracy_history, env.history_len, |x| x / 100.0);
    row[3..8].copy_from_slice(&loss);
    row[8..13].copy_from_slice(&acc);
    let count = |pred: &dyn Fn(SeedStage) -> bool| {
        env.slots.iter().filter(|s| present(s.stage) && pred(s.stage)).count()
    };
    let training = count(&|s| s == SeedStage::Training);
    let blending = count(&|s| s == SeedStage::Blending);
    let holding = count(&|s| s == SeedStage::Holding || s == SeedStage::Fossilized);
    row[13] = training as f64 / n as f64;
    row[14] = blending as f64 / n as f64;
    row[15] = holding as f64 / n as f64;
    row[16] = if env.last_action_success { 1.0 } else { 0.0 };
    row[17 + op_index(env.last_action_op)] = 1.0;

    // §1.2 slot blocks.
    for (k, s) in env.slots.iter().enumerate() {
        if !present(s.stage) {
            continue; // all 31 zeros, blueprint index −1
        }
        bp[k] = s.blueprint as i64;
        let o = BASE + PER_SLOT * k;
        let f = &mut row[o..o + PER_SLOT];
        f[0] = 1.0;
        f[1 + stage_index(s.stage)] = 1.0;
        f[11] = s.alpha;
        f[12] = clamp1(s.contribution.unwrap_or(0.0) / CLAMP_PP);
        f[13] = clamp1(s.contribution_velocity / CLAMP_PP);
        f[14] = f64::from(s.blend_tempo_epochs) / 12.0;
        f[15] = s.alpha_target;
        f[16] = mode_value(s.alpha_mode) / 2.0;
        f[17] = epoch_scale(f64::from(s.alpha_steps_total), e);
        f[18] = epoch_scale(f64::from(s.alpha_steps_done), e);
        let to_target = (i64::from(s.alpha_steps_total) - i64::from(s.alpha_steps_done)).max(0);
        f[19] = epoch_scale(to_target as f64, e);
        let velocity = if s.alpha_mode == AlphaMode::Hold || s.alpha_steps_total == 0 {
            0.0
        } else {
            (s.alpha_target - s.alpha_start) / f64::from(s.alpha_steps_total)
        };
        f[20] = clamp1(velocity);
        f[21] = (algorithm_value(s.alpha_algorithm) - 1.0) / 2.0;
        f[22] = clamp1(s.interaction_sum / CLAMP_PP);
        f[23] = match s.gradient_norm {
            Some(g) if g.is_finite() => symlog(g) / SYMLOG_NORM,
            _ => 0.0,
        };
        f[24] = match s.gradient_health {
            Some(h) if h.is_finite() => clamp1(h),
            _ => 0.0, // None, and (this project's deviation) NaN / ±inf
        };
        f[25] = if s.has_vanishing == Some(true) { 1.0 } else { 0.0 };
        f[26] = if s.has_exploding == Some(true) { 1.0 } else { 0.0 };
        f[27] = s.gradient_health_prev.unwrap_or(SENTINEL);
        f[28] = epoch_scale(f64::from(s.epochs_in_stage), e);
        f[29] = match s.epochs_since_counterfactual {
            Some(n) => GAMMA.powf(f64::from(n)),
            None => SENTINEL,
        };
        f[30] = epoch_scale(f64::from(s.epochs_total), e);
    }
    (row.into_iter().map(|x| x as f32).collect(), bp)
}

// ---------------------------------------------------------------------------------------------
// Layout and comparison
// ---------------------------------------------------------------------------------------------

/// The kernel's columns for a world: `[E]` by env, `[E × S]` at `e·S + k`.
fn layout(world: &WorldCase) -> ObsInputs {
    let n = world.envs.len();
    let s = world.envs[0].slots.len();
    let mut x = ObsInputs::default();
    x.resize(n, s);
    x.max_epochs = world.max_epochs;
    for (e, env) in world.envs.iter().enumerate() {
        x.epoch[e] = env.epoch;
        x.val_loss[e] = env.val_loss;
        x.val_accuracy[e] = env.val_accuracy;
        x.loss_history[e] = env.loss_history;
        x.accuracy_history[e] = env.accuracy_history;
        x.history_len[e] = env.history_len;
        x.last_action_success[e] = env.last_action_success;
        x.last_action_op[e] = env.last_action_op;
        for (k, sc) in env.slots.iter().enumerate() {
            let i = e * s + k;
            x.stage[i] = sc.stage;
            x.blueprint[i] = sc.blueprint;
            x.alpha[i] = sc.alpha;
            x.contribution[i] = sc.contribution;
            x.contribution_velocity[i] = sc.contribution_velocity;
            x.blend_tempo_epochs[i] = sc.blend_tempo_epochs;
            x.alpha_start[i] = sc.alpha_start;
            x.alpha_target[i] = sc.alpha_target;
            x.alpha_mode[i] = sc.alpha_mode;
            x.alpha_steps_total[i] = sc.alpha_steps_total;
            x.alpha_steps_done[i] = sc.alpha_steps_done;
            x.alpha_algorithm[i] = sc.alpha_algorithm;
            x.interaction_sum[i] = sc.interaction_sum;
            x.gradient_norm[i] = sc.gradient_norm;
            x.gradient_health[i] = sc.gradient_health;
            x.has_vanishing[i] = sc.has_vanishing;
            x.has_exploding[i] = sc.has_exploding;
            x.gradient_health_prev[i] = sc.gradient_health_prev;
            x.epochs_in_stage[i] = sc.epochs_in_stage;
            x.epochs_since_counterfactual[i] = sc.epochs_since_counterfactual;
            x.epochs_total[i] = sc.epochs_total;
        }
    }
    x
}

/// Run the kernel on garbage-filled buffers (so an unwritten feature shows up).
fn run_kernel(x: &ObsInputs) -> (Vec<f32>, Vec<i64>) {
    let mut obs = vec![7.0f32; x.n_envs * obs_dim(x.n_slots)];
    let mut bp = vec![99i64; x.n_envs * x.n_slots];
    build_observations(x, &mut obs, &mut bp);
    (obs, bp)
}

/// Bit-for-bit f32 equality (so the sign of zero counts: the reference's `symlog(−0.0)` is −0.0) that
/// also calls two NaNs equal.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn feature_name(i: usize) -> String {
    if i < BASE {
        format!("base[{i}]")
    } else {
        format!("slot{}[{}]", (i - BASE) / PER_SLOT, (i - BASE) % PER_SLOT)
    }
}

/// Every feature and index where the kernel and the oracle differ.
fn differences(world: &WorldCase) -> Vec<String> {
    let x = layout(world);
    let (obs, bp) = run_kernel(&x);
    let s = x.n_slots;
    let dim = obs_dim(s);
    let mut diffs = Vec::new();
    if dim != BASE + PER_SLOT * s || x.dim() != dim || BASE_FEATURES != BASE || SLOT_FEATURES != PER_SLOT {
        diffs.push(format!("dim {dim} (x.dim() {}) for S={s}, want {}", x.dim(), BASE + PER_SLOT * s));
    }
    for (e, env) in world.envs.iter().enumerate() {
        let (want, want_bp) = scalar_obs(env, world.max_epochs);
        let got = &obs[e * dim..(e + 1) * dim];
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            if !same(g, w) {
                diffs.push(format!("env {e} {}: kernel {g:?} oracle {w:?}", feature_name(i)));
            }
        }
        let got_bp = &bp[e * s..(e + 1) * s];
        if got_bp != want_bp.as_slice() {
            diffs.push(format!("env {e} blueprint indices: kernel {got_bp:?} oracle {want_bp:?}"));
        }
    }
    diffs
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// Mostly stages with a state; UNKNOWN and DORMANT (empty) still often.
fn stage() -> impl Strategy<Value = SeedStage> {
    prop_oneof![
        2 => prop::sample::select(SeedStage::ALL.to_vec()),
        1 => prop::sample::select(vec![SeedStage::Training, SeedStage::Blending, SeedStage::Holding, SeedStage::Fossilized]),
    ]
}

fn blueprint() -> impl Strategy<Value = BlueprintAction> {
    (0u8..13).prop_map(|i| BlueprintAction::from_index(i).expect("13 blueprints"))
}

/// Percentage-point values around and past the ±10 clamp.
fn pp() -> impl Strategy<Value = f64> {
    prop_oneof![
        1 => Just(0.0),
        1 => Just(10.0),
        1 => Just(-10.0),
        1 => Just(f64::NAN),
        6 => -40.0..40.0f64,
        2 => -12.0..12.0f64,
    ]
}

/// Epoch-like counts below, at and past `E` (E < 200).
fn ticks() -> impl Strategy<Value = u32> {
    prop_oneof![1 => Just(0u32), 3 => 0u32..12, 3 => 0u32..400]
}

/// Losses and gradient-like values, occasionally non-finite.
fn loss_value() -> impl Strategy<Value = f64> {
    prop_oneof![
        1 => Just(0.0),
        1 => Just(-0.0),
        6 => 0.0..12.0f64,
        2 => -3.0..3.0f64,
        1 => 0.0..1e5f64,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
    ]
}

fn maybe_non_finite(finite: impl Strategy<Value = f64>) -> impl Strategy<Value = Option<f64>> {
    prop::option::weighted(
        0.8,
        prop_oneof![
            8 => finite,
            1 => Just(f64::NAN),
            1 => Just(f64::INFINITY),
            1 => Just(f64::NEG_INFINITY),
        ],
    )
}

fn slot_case() -> impl Strategy<Value = SlotCase> {
    (
        (
            stage(),
            blueprint(),
            prop_oneof![Just(0.0), Just(1.0), 0.0..1.0f64],
            prop::option::weighted(0.7, pp()),
        ),
        (pp(), prop_oneof![Just(3u32), Just(5), Just(8), 0u32..30]),
        (
            prop_oneof![2 => 0.0..1.0f64, 1 => -3.0..3.0f64],
            prop_oneof![Just(0.5), Just(0.7), Just(1.0), Just(0.0), -3.0..3.0f64],
            prop::sample::select(vec![AlphaMode::Hold, AlphaMode::Up, AlphaMode::Down]),
            prop_oneof![1 => Just(0u32), 2 => 1u32..6, 2 => ticks()],
            ticks(),
            prop::sample::select(vec![AlphaAlgorithm::Add, AlphaAlgorithm::Multiply, AlphaAlgorithm::Gate]),
        ),
        (
            pp(),
            maybe_non_finite(prop_oneof![0.0..20.0f64, 0.0..1e4f64, -5.0..5.0f64]),
            maybe_non_finite(prop_oneof![Just(1.0), 0.0..1.0f64, -2.5..2.5f64]),
            prop::option::of(any::<bool>()),
            prop::option::of(any::<bool>()),
        ),
        (
            prop::option::weighted(0.6, prop_oneof![0.0..1.0f64, -0.5..1.5f64]),
            ticks(),
            prop::option::weighted(0.6, prop_oneof![0u32..5, 0u32..3000]),
            ticks(),
        ),
    )
        .prop_map(
            |(
                (stage, blueprint, alpha, contribution),
                (contribution_velocity, blend_tempo_epochs),
                (alpha_start, alpha_target, alpha_mode, alpha_steps_total, alpha_steps_done, alpha_algorithm),
                (interaction_sum, gradient_norm, gradient_health, has_vanishing, has_exploding),
                (gradient_health_prev, epochs_in_stage, epochs_since_counterfactual, epochs_total),
            )| SlotCase {
                stage,
                blueprint,
                alpha,
                contribution,
                contribution_velocity,
                blend_tempo_epochs,
                alpha_start,
                alpha_target,
                alpha_mode,
                alpha_steps_total,
                alpha_steps_done,
                alpha_algorithm,
                interaction_sum,
                gradient_norm,
                gradient_health,
                has_vanishing,
                has_exploding,
                gradient_health_prev,
                epochs_in_stage,
                epochs_since_counterfactual,
                epochs_total,
            },
        )
}

fn env_case(n_slots: usize) -> impl Strategy<Value = EnvCase> {
    (
        (ticks(), loss_value(), prop_oneof![Just(0.0), Just(100.0), 0.0..100.0f64]),
        (
            prop::array::uniform5(loss_value()),
            prop::array::uniform5(prop_oneof![0.0..100.0f64, Just(123.0)]),
            0u8..=5,
        ),
        (any::<bool>(), prop::sample::select(LifecycleOp::ALL.to_vec())),
        prop::collection::vec(slot_case(), n_slots),
    )
        .prop_map(
            |(
                (epoch, val_loss, val_accuracy),
                (loss_history, accuracy_history, history_len),
                (last_action_success, last_action_op),
                slots,
            )| EnvCase {
                epoch,
                val_loss,
                val_accuracy,
                loss_history,
                accuracy_history,
                history_len,
                last_action_success,
                last_action_op,
                slots,
            },
        )
}

fn world() -> impl Strategy<Value = WorldCase> {
    (prop_oneof![1 => Just(1u32), 1 => Just(150), 4 => 1u32..200], 1usize..=5, 1usize..=6)
        .prop_flat_map(|(max_epochs, n_slots, n_envs)| {
            (Just(max_epochs), prop::collection::vec(env_case(n_slots), n_envs))
        })
        .prop_map(|(max_epochs, envs)| WorldCase { max_epochs, envs })
}

fn check(world: &WorldCase) -> Result<(), TestCaseError> {
    let diffs = differences(world);
    prop_assert!(diffs.is_empty(), "E = {}\n{}", world.max_epochs, diffs.join("\n"));
    Ok(())
}

proptest! {
    // No regression file is written: a failure prints the shrunk world and the differing features.
    #![proptest_config(ProptestConfig {
        cases: 2048,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn kernel_matches_scalar_observation(w in world()) {
        check(&w)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Hand-derived cases
// ---------------------------------------------------------------------------------------------

fn one_env(max_epochs: u32, env: EnvCase) -> (Vec<f32>, Vec<i64>) {
    let x = layout(&WorldCase { max_epochs, envs: vec![env] });
    run_kernel(&x)
}

/// ln 3, to f64 precision.
const LN_3: f64 = 1.098_612_288_668_109_8;

#[test]
fn first_epoch_history_is_padded_with_the_sentinel() {
    // E = 150, epoch 1, val loss 2.0, accuracy 40 %; the histories hold one entry each (the rest of
    // the arrays is junk the kernel must not read), last action = successful WAIT, one empty slot.
    let env = EnvCase {
        epoch: 1,
        val_loss: 2.0,
        val_accuracy: 40.0,
        loss_history: [2.0, 55.0, 55.0, 55.0, 55.0],
        accuracy_history: [40.0, 55.0, 55.0, 55.0, 55.0],
        history_len: 1,
        last_action_success: true,
        last_action_op: LifecycleOp::Wait,
        slots: vec![SlotCase::default()],
    };
    let (obs, bp) = one_env(150, env);
    assert_eq!(obs.len(), 23 + 31);
    // idx 0 = 1/150; idx 1 = symlog(2)/7 = ln(3)/7; idx 2 = 40/100.
    assert_eq!(obs[0], (1.0f64 / 150.0) as f32);
    assert_eq!(obs[1], (LN_3 / 7.0) as f32);
    assert_eq!(obs[2], 0.4f32);
    // History: the one entry is the newest (last position), the 4 older ones are −1.
    assert_eq!(&obs[3..7], &[-1.0f32; 4]);
    assert_eq!(obs[7], (LN_3 / 7.0) as f32);
    assert_eq!(&obs[8..12], &[-1.0f32; 4]);
    assert_eq!(obs[12], 0.4f32);
    // No seeds counted; success = 1; WAIT one-hot at 17.
    assert_eq!(&obs[13..23], &[0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    // The empty slot: 31 zeros, blueprint −1.
    assert_eq!(&obs[23..54], &[0.0f32; 31]);
    assert_eq!(bp, vec![-1]);
}

#[test]
fn stage_counts_divide_by_the_configured_slot_count() {
    // S = 3: one TRAINING, one FOSSILIZED, one HOLDING → #TRAINING/3 = 1/3, #BLENDING = 0,
    // #HOLDING (HOLDING or FOSSILIZED)/3 = 2/3. Stage one-hot positions: TRAINING → 3,
    // FOSSILIZED → 6, HOLDING → 5, i.e. obs 23+1+3 = 27, 54+1+6 = 61, 85+1+5 = 91.
    let seed = |stage, blueprint| SlotCase { stage, blueprint, ..SlotCase::default() };
    let env = EnvCase {
        last_action_op: LifecycleOp::Prune,
        slots: vec![
            seed(SeedStage::Training, BlueprintAction::ConvLight),
            seed(SeedStage::Fossilized, BlueprintAction::Noop),
            seed(SeedStage::Holding, BlueprintAction::FlexAttention),
        ],
        ..EnvCase::default()
    };
    let (obs, bp) = one_env(10, env);
    assert_eq!(obs.len(), 23 + 3 * 31);
    assert_eq!(obs[13], (1.0f64 / 3.0) as f32);
    assert_eq!(obs[14], 0.0);
    assert_eq!(obs[15], (2.0f64 / 3.0) as f32);
    // success = false; PRUNE (3) one-hot at 17 + 3 = 20.
    assert_eq!(&obs[16..23], &[0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
    for (start, hot) in [(23, 27), (54, 61), (85, 91)] {
        assert_eq!(obs[start], 1.0, "is_active at {start}");
        for (i, &v) in obs.iter().enumerate().take(start + 11).skip(start + 1) {
            assert_eq!(v, if i == hot { 1.0 } else { 0.0 }, "stage one-hot at {i}");
        }
    }
    assert_eq!(bp, vec![1, 0, 12]);
}

#[test]
fn live_slot_features_by_hand() {
    // E = 10, one BLENDING slot (blueprint attention = 2), stage one-hot position 4.
    let slot = SlotCase {
        stage: SeedStage::Blending,
        blueprint: BlueprintAction::Attention,
        alpha: 0.25,                               // 11: raw 0.25
        contribution: Some(25.0),                  // 12: clamp(2.5) = 1
        contribution_velocity: 3.0,                // 13: 0.3
        blend_tempo_epochs: 3,                     // 14: 3/12 = 0.25
        alpha_start: 0.2,                          //
        alpha_target: 1.0,                         // 15: raw 1.0
        alpha_mode: AlphaMode::Up,                 // 16: 1/2 = 0.5
        alpha_steps_total: 4,                      // 17: 4/10 = 0.4
        alpha_steps_done: 1,                       // 18: 0.1; 19: (4−1)/10 = 0.3
        alpha_algorithm: AlphaAlgorithm::Multiply, // 21: (2−1)/2 = 0.5; 20: (1−0.2)/4 = 0.2
        interaction_sum: -15.0,                    // 22: clamp(−1.5) = −1
        gradient_norm: Some(f64::NAN),             // 23: not finite → 0
        gradient_health: Some(f64::INFINITY),      // 24: non-finite → 0 (deviation)
        has_vanishing: Some(true),                 // 25: 1
        has_exploding: None,                       // 26: 0
        gradient_health_prev: None,                // 27: −1
        epochs_in_stage: 25,                       // 28: min(25,10)/10 = 1
        epochs_since_counterfactual: Some(0),      // 29: 0.995^0 = 1
        epochs_total: 7,                           // 30: 0.7
    };
    let env = EnvCase { slots: vec![slot], ..EnvCase::default() };
    let (obs, bp) = one_env(10, env);
    let f = &obs[23..54];
    let want: [f32; 31] = [
        1.0, // is_active
        0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, // stage one-hot: BLENDING → 4
        0.25, 1.0, 0.3, 0.25, 1.0, 0.5, 0.4, 0.1, 0.3, 0.2, 0.5, -1.0, // 11..22
        0.0, 0.0, 1.0, 0.0, -1.0, 1.0, 1.0, 0.7, // 23..30
    ];
    assert_eq!(f, &want);
    assert_eq!(bp, vec![2]);
}

/// Asserts `got` equals the spec's printed vector to its printed precision (five decimals).
fn assert_printed(got: &[f32], printed: &[f64], what: &str) {
    assert_eq!(got.len(), printed.len(), "{what}: length");
    for (i, (&g, &p)) in got.iter().zip(printed).enumerate() {
        assert!((g as f64 - p).abs() <= 5e-6, "{what}[{i}]: {g} where the spec prints {p}");
    }
}

#[test]
fn the_specs_golden_base_and_slot_vectors() {
    // tamiyo §7.3, the reference's golden vectors. Base: E = 100, epoch 50, loss 1.5, accuracy 85,
    // loss history [2.0, 1.8, 1.6, 1.5, 1.5], accuracy history [75, 78, 81, 83, 85], no slots, last
    // op 2, success. Slot r0c0 (E = 100): TRAINING, alpha .5, contribution 2.5, velocity .5, tempo 8,
    // target 1.0, mode UP, steps 10 total / 4 done (time to target 6), alpha velocity .2, GATE,
    // interaction 1.5, gradient norm 2.5, health .95, no vanishing / exploding, previous health .85,
    // 3 epochs in stage, 5 since the counterfactual, age 40; blueprint index 1. The reference's test
    // sets the alpha velocity itself; here it follows from the schedule, (1.0 − start) / 10 = .2 with
    // start −1.0.
    let base_env = EnvCase {
        epoch: 50,
        val_loss: 1.5,
        val_accuracy: 85.0,
        loss_history: [2.0, 1.8, 1.6, 1.5, 1.5],
        accuracy_history: [75.0, 78.0, 81.0, 83.0, 85.0],
        history_len: 5,
        last_action_success: true,
        last_action_op: LifecycleOp::SetAlphaTarget,
        slots: vec![SlotCase::default()],
    };
    let base_printed = [
        0.5, 0.13090, 0.85, 0.15694, 0.14709, 0.13650, 0.13090, 0.13090, 0.75, 0.78, 0.81, 0.83, 0.85, 0.0,
        0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0,
    ];
    let (obs, bp) = one_env(100, base_env.clone());
    assert_printed(&obs[..23], &base_printed, "base");
    // §7.3: an empty slot is 31 zeros and blueprint index −1.
    assert_eq!(&obs[23..], &[0.0f32; 31]);
    assert_eq!(bp, vec![-1]);

    let slot = SlotCase {
        stage: SeedStage::Training,
        blueprint: BlueprintAction::ConvLight,
        alpha: 0.5,
        contribution: Some(2.5),
        contribution_velocity: 0.5,
        blend_tempo_epochs: 8,
        alpha_start: -1.0,
        alpha_target: 1.0,
        alpha_mode: AlphaMode::Up,
        alpha_steps_total: 10,
        alpha_steps_done: 4,
        alpha_algorithm: AlphaAlgorithm::Gate,
        interaction_sum: 1.5,
        gradient_norm: Some(2.5),
        gradient_health: Some(0.95),
        has_vanishing: Some(false),
        has_exploding: Some(false),
        gradient_health_prev: Some(0.85),
        epochs_in_stage: 3,
        epochs_since_counterfactual: Some(5),
        epochs_total: 40,
    };
    let slot_printed = [
        1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.25, 0.05, 0.66667, 1.0, 0.5, 0.1, 0.04,
        0.06, 0.2, 1.0, 0.15, 0.17897, 0.95, 0.0, 0.0, 0.85, 0.03, 0.97525, 0.4,
    ];
    let (obs, bp) = one_env(100, EnvCase { slots: vec![slot.clone()], ..base_env.clone() });
    assert_printed(&obs[23..], &slot_printed, "slot r0c0");
    assert_eq!(bp, vec![1]);

    // §7.3: freshness 0.995^138 ≈ 0.5007 (the printed precision: four decimals).
    let stale = SlotCase { epochs_since_counterfactual: Some(138), ..slot };
    let (obs, _) = one_env(100, EnvCase { slots: vec![stale.clone()], ..base_env.clone() });
    assert!((obs[23 + 29] as f64 - 0.5007).abs() <= 5e-5, "freshness after 138 epochs: {}", obs[23 + 29]);

    // §7.3: 5 slots → an observation of 178 features.
    let (obs, bp) = one_env(100, EnvCase { slots: vec![stale; 5], ..base_env });
    assert_eq!((obs.len(), obs_dim(5)), (178, 178));
    assert_eq!(bp, vec![1; 5]);
}
