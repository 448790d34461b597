//! The alpha controller against the reference trajectories of spec kasmina §4.1 and values worked out
//! by hand from its formulas.

use esper_components::alpha::{AlphaController, AlphaCurve, AlphaMode, curve_progress};

/// Ramp from the controller's current alpha to `target` over `n` ticks; every per-tick alpha.
fn trajectory(from: f64, target: f64, n: u32, curve: AlphaCurve, k: f64) -> Vec<f64> {
    let mut c = AlphaController::holding_at(from);
    c.retarget(target, n, Some(curve), Some(k)).unwrap();
    (0..n)
        .map(|_| {
            c.step();
            c.alpha
        })
        .collect()
}

fn assert_close(actual: &[f64], expected: &[f64], tol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!((a - e).abs() <= tol, "{what}: tick {}: got {a}, expected {e}", i + 1);
    }
}

#[test]
fn reference_trajectories_zero_to_one() {
    use AlphaCurve::*;
    let table: &[(u32, AlphaCurve, f64, &[f64])] = &[
        (3, Linear, 12.0, &[0.3333, 0.6667, 1.0]),
        (3, Sigmoid, 12.0, &[0.1173, 0.8827, 1.0]),
        (5, Linear, 12.0, &[0.2, 0.4, 0.6, 0.8, 1.0]),
        (5, Cosine, 12.0, &[0.0955, 0.3455, 0.6545, 0.9045, 1.0]),
        (5, Sigmoid, 6.0, &[0.1043, 0.3391, 0.6609, 0.8957, 1.0]),
        (5, Sigmoid, 12.0, &[0.0242, 0.2301, 0.7699, 0.9758, 1.0]),
        (5, Sigmoid, 24.0, &[0.0007, 0.0832, 0.9168, 0.9993, 1.0]),
        (8, Linear, 12.0, &[0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]),
        (8, Sigmoid, 12.0, &[0.0086, 0.0452, 0.1808, 0.5, 0.8192, 0.9548, 0.9914, 1.0]),
    ];
    for &(n, curve, k, expected) in table {
        let got = trajectory(0.0, 1.0, n, curve, k);
        assert_close(&got, expected, 5e-5, &format!("N={n} {curve:?} k={k}"));
        assert_eq!(*got.last().unwrap(), 1.0, "the last tick snaps exactly");
    }
}

#[test]
fn hand_derived_values_are_exact() {
    // LINEAR is t itself: 1/3 and 2/3 exactly as f64 computes them.
    let lin = trajectory(0.0, 1.0, 3, AlphaCurve::Linear, 12.0);
    assert_eq!(lin, vec![1.0 / 3.0, 2.0 / 3.0, 1.0]);
    // COSINE at t = 1/2 is (1 - cos(pi/2)) / 2 = 0.5 (up to cos rounding).
    assert!((curve_progress(AlphaCurve::Cosine, 12.0, 0.5) - 0.5).abs() < 1e-15);
    // SIGMOID k=12 at t = 1/3: (σ(-2) - σ(-6)) / (σ(6) - σ(-6)).
    let s = |z: f64| 1.0 / (1.0 + (-z).exp());
    let p = (s(-2.0) - s(-6.0)) / (s(6.0) - s(-6.0));
    assert!((p - 0.117_310_43).abs() < 1e-8, "{p}");
    assert!((curve_progress(AlphaCurve::Sigmoid, 12.0, 1.0 / 3.0) - p).abs() < 1e-15);
    // Symmetry: p(t) + p(1 - t) = 1 for cosine and sigmoid.
    for curve in [AlphaCurve::Cosine, AlphaCurve::Sigmoid] {
        for t in [0.1, 0.25, 0.4] {
            let sum = curve_progress(curve, 12.0, t) + curve_progress(curve, 12.0, 1.0 - t);
            assert!((sum - 1.0).abs() < 1e-12, "{curve:?} t={t}");
        }
    }
}

#[test]
fn partial_targets_scale_progress() {
    // Target T from 0: every value is the full trajectory × T.
    for target in [0.5, 0.7] {
        let got = trajectory(0.0, target, 5, AlphaCurve::Cosine, 12.0);
        let expected: Vec<f64> = [0.0955, 0.3455, 0.6545, 0.9045, 1.0].iter().map(|v| v * target).collect();
        assert_close(&got, &expected, 5e-5, &format!("cosine to {target}"));
        assert_eq!(*got.last().unwrap(), target);
    }
    // 0.5 → 0.7 linear over 4: 0.55, 0.6, 0.65, 0.7.
    let got = trajectory(0.5, 0.7, 4, AlphaCurve::Linear, 12.0);
    assert_close(&got, &[0.55, 0.6, 0.65, 0.7], 1e-12, "0.5 to 0.7");
}

#[test]
fn down_ramps_mirror_up_ramps() {
    // 1 → 0 linear over 4: 0.75, 0.5, 0.25, 0.
    assert_close(
        &trajectory(1.0, 0.0, 4, AlphaCurve::Linear, 12.0),
        &[0.75, 0.5, 0.25, 0.0],
        1e-12,
        "1 to 0",
    );
    // 0.7 → 0 cosine over 5: 0.7·(1 − p) with p from the table.
    let expected: Vec<f64> = [0.0955, 0.3455, 0.6545, 0.9045, 1.0].iter().map(|p| 0.7 * (1.0 - p)).collect();
    assert_close(&trajectory(0.7, 0.0, 5, AlphaCurve::Cosine, 12.0), &expected, 5e-5, "0.7 to 0 cosine");
    // 1 → 0.5 sigmoid k=24 over 5: 1 − 0.5·p.
    let expected: Vec<f64> = [0.0007, 0.0832, 0.9168, 0.9993, 1.0].iter().map(|p| 1.0 - 0.5 * p).collect();
    assert_close(&trajectory(1.0, 0.5, 5, AlphaCurve::Sigmoid, 24.0), &expected, 5e-5, "1 to 0.5 sharp");
}

#[test]
fn modes_instant_and_hold() {
    let mut c = AlphaController::holding_at(0.0);
    c.retarget(0.7, 3, None, None).unwrap();
    assert_eq!(c.mode, AlphaMode::Up);
    assert_eq!((c.time_to_target(), c.velocity()), (3, 0.7 / 3.0));
    assert!(!c.step());
    assert!(!c.step());
    assert!(c.step(), "reached on the last tick");
    assert_eq!((c.mode, c.alpha, c.steps_done), (AlphaMode::Hold, 0.7, 3));
    assert!(!c.step(), "HOLD ticks do nothing");
    assert_eq!(c.alpha, 0.7);

    // INSTANT (0 steps) jumps and holds.
    c.retarget(0.2, 0, None, None).unwrap();
    assert_eq!((c.mode, c.alpha), (AlphaMode::Hold, 0.2));
    // Retarget to the current value holds.
    c.retarget(0.2, 5, None, None).unwrap();
    assert_eq!((c.mode, c.alpha), (AlphaMode::Hold, 0.2));
    // Targets are clamped into [0, 1].
    c.retarget(3.0, 0, None, None).unwrap();
    assert_eq!(c.alpha, 1.0);
}

#[test]
fn retarget_mid_ramp_is_an_error() {
    let mut c = AlphaController::holding_at(0.0);
    c.retarget(1.0, 5, Some(AlphaCurve::Linear), None).unwrap();
    c.step();
    let before = c;
    assert!(c.retarget(0.5, 3, None, None).is_err());
    assert_eq!(c, before, "a refused retarget changes nothing");
}

#[test]
fn never_overshoots_and_is_monotone_per_ramp() {
    let curves = [
        (AlphaCurve::Linear, 12.0),
        (AlphaCurve::Cosine, 12.0),
        (AlphaCurve::Sigmoid, 6.0),
        (AlphaCurve::Sigmoid, 24.0),
    ];
    let points = [0.0, 0.3, 0.5, 0.7, 1.0];
    for (curve, k) in curves {
        for &from in &points {
            for &to in &points {
                for n in 1..=9 {
                    let traj = trajectory(from, to, n, curve, k);
                    let (lo, hi) = (from.min(to), from.max(to));
                    let mut prev = from;
                    for &a in &traj {
                        assert!((lo..=hi).contains(&a), "{curve:?} {from}->{to} n={n}: {a} outside");
                        if to >= from {
                            assert!(a >= prev, "not monotone up");
                        } else {
                            assert!(a <= prev, "not monotone down");
                        }
                        prev = a;
                    }
                    assert_eq!(*traj.last().unwrap(), to, "snap to target");
                }
            }
        }
    }
}

#[test]
fn steepness_is_floored() {
    let mut c = AlphaController::holding_at(0.0);
    c.retarget(1.0, 4, Some(AlphaCurve::Sigmoid), Some(0.0)).unwrap();
    assert_eq!(c.steepness, 0.1);
    // A nearly flat sigmoid behaves like LINEAR.
    c.step();
    assert!((c.alpha - 0.25).abs() < 1e-3, "{}", c.alpha);
}

#[test]
fn serialise_restore_preserves_trajectory() {
    let mut a = AlphaController::holding_at(0.2);
    a.retarget(0.9, 6, Some(AlphaCurve::Sigmoid), Some(6.0)).unwrap();
    a.step();
    a.step();
    let bytes = postcard::to_allocvec(&a).unwrap();
    let mut b: AlphaController = postcard::from_bytes(&bytes).unwrap();
    assert_eq!(a, b);
    for _ in 0..5 {
        assert_eq!(a.step(), b.step());
        assert_eq!(a, b);
    }
    assert_eq!(b.mode, AlphaMode::Hold);
    assert_eq!(b.alpha, 0.9);
}
