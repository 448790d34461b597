//! The alpha controller (spec kasmina §4.1): a pure scheduler that ramps a seed's amplitude toward a
//! target over a fixed number of ticks along a curve, never overshooting and snapping exactly to the
//! target on the last tick. Arithmetic in f64, as in the reference.

use bevy_ecs::component::Component;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Equality epsilon for "target reached", "target is full", "target is zero".
pub const ALPHA_EPSILON: f64 = 1e-6;
/// Default sigmoid steepness (the germination ramp always uses it).
pub const DEFAULT_STEEPNESS: f64 = 12.0;
const MIN_STEEPNESS: f64 = 0.1;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum AlphaMode {
    #[default]
    Hold = 0,
    Up = 1,
    Down = 2,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum AlphaCurve {
    #[default]
    Linear = 1,
    Cosine = 2,
    Sigmoid = 3,
}

/// Numerically stable logistic function (two-branch form).
pub fn stable_sigmoid(z: f64) -> f64 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

/// Ramp progress `p(t)` for `t ∈ [0, 1]`; `p(0) = 0`, `p(1) = 1`.
pub fn curve_progress(curve: AlphaCurve, steepness: f64, t: f64) -> f64 {
    match curve {
        AlphaCurve::Linear => t,
        AlphaCurve::Cosine => (1.0 - (std::f64::consts::PI * t).cos()) / 2.0,
        AlphaCurve::Sigmoid => {
            let k = steepness;
            let lo = stable_sigmoid(-k / 2.0);
            let hi = stable_sigmoid(k / 2.0);
            let denom = hi - lo;
            if denom == 0.0 { t } else { (stable_sigmoid(k * (t - 0.5)) - lo) / denom }
        }
    }
}

fn clamp01(v: f64) -> f64 {
    v.clamp(0.0, 1.0)
}

/// `retarget` was called while a ramp was in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetargetWhileRamping;

impl fmt::Display for RetargetWhileRamping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("cannot retarget the alpha controller mid-ramp (mode is not HOLD)")
    }
}

impl std::error::Error for RetargetWhileRamping {}

/// One seed's alpha scheduler. `alpha` here is the controller's copy; the slot's canonical amplitude is
/// [`crate::slot::SeedAlpha`], which catches up on the next BLENDING tick after an instant retarget.
#[derive(Component, Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlphaController {
    pub alpha: f64,
    pub start: f64,
    pub target: f64,
    pub mode: AlphaMode,
    pub curve: AlphaCurve,
    pub steepness: f64,
    pub steps_total: u32,
    pub steps_done: u32,
}

impl Default for AlphaController {
    fn default() -> Self {
        Self::holding_at(0.0)
    }
}

impl AlphaController {
    /// HOLD at `alpha` with start = target = alpha and no steps.
    pub fn holding_at(alpha: f64) -> Self {
        let a = clamp01(alpha);
        Self {
            alpha: a,
            start: a,
            target: a,
            mode: AlphaMode::Hold,
            curve: AlphaCurve::Linear,
            steepness: DEFAULT_STEEPNESS,
            steps_total: 0,
            steps_done: 0,
        }
    }

    /// Start a ramp from the current alpha to `target` over `steps` ticks. Errors outside HOLD.
    pub fn retarget(
        &mut self,
        target: f64,
        steps: u32,
        curve: Option<AlphaCurve>,
        steepness: Option<f64>,
    ) -> Result<(), RetargetWhileRamping> {
        if self.mode != AlphaMode::Hold {
            return Err(RetargetWhileRamping);
        }
        self.start = self.alpha;
        self.target = clamp01(target);
        if let Some(c) = curve {
            self.curve = c;
        }
        if let Some(k) = steepness {
            self.steepness = k.max(MIN_STEEPNESS);
        }
        self.steps_total = steps;
        self.steps_done = 0;
        self.mode = if self.target > self.alpha {
            AlphaMode::Up
        } else if self.target < self.alpha {
            AlphaMode::Down
        } else {
            self.alpha = self.target;
            AlphaMode::Hold
        };
        if self.steps_total == 0 {
            self.alpha = self.target;
            self.mode = AlphaMode::Hold;
        }
        Ok(())
    }

    /// Advance one tick; returns true on the tick that reaches the target.
    pub fn step(&mut self) -> bool {
        if self.mode == AlphaMode::Hold || self.steps_total == 0 {
            return false;
        }
        self.steps_done += 1;
        if self.steps_done >= self.steps_total {
            self.steps_done = self.steps_total;
            self.alpha = self.target;
            self.mode = AlphaMode::Hold;
            return true;
        }
        let t = self.steps_done as f64 / self.steps_total as f64;
        let p = curve_progress(self.curve, self.steepness, t);
        let raw = clamp01(self.start + (self.target - self.start) * p);
        // No overshoot and monotone per ramp: clamp into the segment [start, target].
        self.alpha = if self.mode == AlphaMode::Up {
            raw.clamp(self.start, self.target)
        } else {
            raw.clamp(self.target, self.start)
        };
        false
    }

    /// Ticks left in the current ramp (`time_to_target`).
    pub fn time_to_target(&self) -> u32 {
        self.steps_total.saturating_sub(self.steps_done)
    }

    /// Per-tick slope of the ramp (`alpha_velocity`): 0 in HOLD or with no steps.
    pub fn velocity(&self) -> f64 {
        if self.mode == AlphaMode::Hold || self.steps_total == 0 {
            0.0
        } else {
            (self.target - self.start) / self.steps_total as f64
        }
    }

    pub fn target_is_full(&self) -> bool {
        self.target >= 1.0 - ALPHA_EPSILON
    }
}
