//! Seed modules: parameter counts against the spec, birth behaviour, finite-difference gradients (f64),
//! batch equivalence and thread-count independence (f32, bit for bit), buffer reuse.

use super::*;
use crate::ops::testing::*;
use crate::rng::{Purpose, StreamKey};

const fn shape(envs: usize, batch: usize, channels: usize, h: usize, w: usize) -> SeedShape {
    SeedShape { envs, batch, channels, h, w }
}

/// Shapes for the gradient checks: G(8) = 8 groups of one channel on a non-square plane; G(16) = one
/// group of 16 on a 1×1 plane (the deepest post-pool slot of cifar_scale); C = 4 makes the bottleneck
/// wider than its input (b = 8) and attention's squeeze r = 1.
const GRADIENT_SHAPES: [SeedShape; 3] = [shape(2, 3, 8, 4, 3), shape(3, 2, 16, 1, 1), shape(2, 4, 4, 2, 2)];

/// A test input whose channel means differ from image to image (so squeeze-excite and the gate see
/// varied pooled features): a per-(image, channel) offset in `[-1, 1)` plus noise in `[-0.5, 0.5)`.
fn test_input(seed: u64, s: SeedShape) -> Vec<f64> {
    let plane = s.h * s.w;
    let offsets = signed(seed, s.samples() * s.channels);
    let noise = signed(seed + 1, s.len());
    noise.iter().enumerate().map(|(i, n)| offsets[i / plane] + 0.5 * n).collect()
}

fn birth_stream(seed: u64, env: usize) -> crate::rng::Stream {
    StreamKey::new(seed, 0, env as u64, Purpose::SeedInit).stream(0)
}

/// Born rows for `envs` envs, one stream per env.
fn born_rows<T: Real>(layout: &ParamLayout, envs: usize, multiply: bool, seed: u64) -> Vec<T> {
    let p = layout.param_count();
    let mut rows = vec![T::ZERO; envs * p];
    for (e, row) in rows.chunks_exact_mut(p).enumerate() {
        layout.init_row(multiply, &mut birth_stream(seed, e), row);
    }
    rows
}

/// Born rows moved off their special values (λ ≠ 0, UP ≠ 0, γ ≠ 1, …) so that every path carries
/// gradient.
fn random_rows(layout: &ParamLayout, envs: usize, seed: u64) -> Vec<f64> {
    let mut rows = born_rows::<f64>(layout, envs, false, seed);
    for (v, noise) in rows.iter_mut().zip(signed(seed + 1000, envs * layout.param_count())) {
        *v += 0.3 * noise;
    }
    rows
}

/// Forward and backward (with the input gradient) of one gathered batch in a fresh workspace.
struct Run<T> {
    y: Vec<T>,
    grad_params: Vec<T>,
    grad_x: Vec<T>,
}

fn run<T: Real>(bp: CnnBlueprint, s: SeedShape, params: &[T], x: &[T], grad_y: &[T]) -> Run<T> {
    let mut ws = Workspace::new();
    let mut y = vec![T::ZERO; s.len()];
    forward(bp, s, params, x, &mut y, &mut ws);
    let mut grad_params = vec![T::ZERO; params.len()];
    let mut grad_x = vec![T::ZERO; s.len()];
    backward(bp, s, x, grad_y, &mut grad_params, Some(&mut grad_x), &mut ws);
    Run { y, grad_params, grad_x }
}

fn forward_only<T: Real>(bp: CnnBlueprint, s: SeedShape, params: &[T], x: &[T]) -> Vec<T> {
    let mut y = vec![T::ZERO; s.len()];
    forward(bp, s, params, x, &mut y, &mut Workspace::new());
    y
}

#[test]
fn parameter_counts_match_the_spec() {
    // kasmina §7.1 and §4.4, for C = 8, 16, 32, 64.
    let expected = [
        (CnnBlueprint::Norm, [17, 33, 65, 129]),
        (CnnBlueprint::Attention, [40, 144, 544, 2112]),
        (CnnBlueprint::Depthwise, [152, 432, 1376, 4800]),
        (CnnBlueprint::Bottleneck, [720, 864, 1152, 4480]),
        (CnnBlueprint::ConvSmall, [80, 288, 1088, 4224]),
        (CnnBlueprint::ConvLight, [592, 2336, 9280, 36992]),
        (CnnBlueprint::ConvHeavy, [1184, 4672, 18560, 73984]),
    ];
    for (bp, counts) in expected {
        for (c, count) in [8, 16, 32, 64].into_iter().zip(counts) {
            assert_eq!(param_count(bp, c), count, "{} at C = {c}", bp.name());
        }
    }
    for (c, count) in [8, 16, 32, 64].into_iter().zip([81, 145, 273, 1057]) {
        assert_eq!(gate_param_count(c), count, "gate at C = {c}");
    }
}

#[test]
fn layouts_are_packed_back_to_back() {
    for c in [1, 4, 8, 16, 32, 64, 128] {
        let layouts = CnnBlueprint::ALL.map(|bp| (bp.name(), layout(bp, c)));
        for (name, l) in layouts.into_iter().chain([("gate", gate_layout(c))]) {
            let mut offset = 0;
            for t in l.tensors() {
                assert_eq!(t.offset, offset, "{name} {} at C = {c}", t.name);
                assert!(t.len > 0, "{name} {} is empty", t.name);
                offset += t.len;
            }
            assert_eq!(offset, l.param_count(), "{name} at C = {c}");
        }
    }
    // Spot checks of the documented offsets.
    let heavy = layout(CnnBlueprint::ConvHeavy, 8);
    assert_eq!(heavy.tensor("conv2.weight").unwrap().offset, 9 * 64 + 16);
    assert_eq!(heavy.tensor("norm2.bias").unwrap().offset, 18 * 64 + 3 * 8);
    let bottleneck = layout(CnnBlueprint::Bottleneck, 64);
    assert_eq!(bottleneck.tensor("up.weight").unwrap().range(), 16 * 64 + 9 * 256..2 * 16 * 64 + 9 * 256);
    assert_eq!(layout(CnnBlueprint::Norm, 16).tensor("scale").unwrap().offset, 32);
}

#[test]
fn group_counts_match_the_spec() {
    for (c, g) in [(8, 8), (16, 1), (32, 2), (64, 4), (128, 8), (4, 4), (2, 2), (1, 1), (24, 1), (48, 2)] {
        assert_eq!(group_norm_groups(c), g, "G({c})");
    }
}

#[test]
fn blueprint_values_are_the_action_indices() {
    assert_eq!(CnnBlueprint::from_action_index(0), None);
    assert_eq!(CnnBlueprint::from_action_index(8), None);
    let names = ["conv_light", "attention", "norm", "depthwise", "bottleneck", "conv_small", "conv_heavy"];
    for (i, name) in (1u8..=7).zip(names) {
        let bp = CnnBlueprint::from_action_index(i).unwrap();
        assert_eq!(bp.action_index(), i);
        assert_eq!(bp.name(), name);
    }
}

#[test]
fn birth_draws_follow_pytorch_defaults() {
    let c = 64;
    for l in CnnBlueprint::ALL.map(|bp| layout(bp, c)).into_iter().chain([gate_layout(c)]) {
        let row = born_rows::<f64>(&l, 1, false, 7);
        for t in l.tensors() {
            let values = &row[t.range()];
            match t.init {
                Init::Uniform { fan_in } => {
                    let bound = 1.0 / (fan_in as f64).sqrt();
                    let max = values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                    assert!(max <= bound, "{}: {max} beyond {bound}", t.name);
                    if values.len() >= 32 {
                        assert!(max > 0.8 * bound, "{}: draws do not spread over ±{bound}", t.name);
                        // Four standard errors of the mean of U(±bound).
                        let mean = values.iter().sum::<f64>() / values.len() as f64;
                        let limit = 4.0 * bound / (3.0 * values.len() as f64).sqrt();
                        assert!(mean.abs() < limit, "{}: mean {mean}", t.name);
                    }
                }
                Init::Const(v) => assert!(values.iter().all(|&x| x == v), "{}", t.name),
            }
        }
    }
    // The fan-ins that matter: 3×3 convs see 9·c_in, the depthwise conv 9, a linear its inputs.
    let fan_in = |bp, name| match layout(bp, c).tensor(name).unwrap().init {
        Init::Uniform { fan_in } => fan_in,
        Init::Const(_) => 0,
    };
    assert_eq!(fan_in(CnnBlueprint::ConvLight, "conv.weight"), 9 * c);
    assert_eq!(fan_in(CnnBlueprint::Depthwise, "depthwise.weight"), 9);
    assert_eq!(fan_in(CnnBlueprint::Depthwise, "pointwise.weight"), c);
    assert_eq!(fan_in(CnnBlueprint::Bottleneck, "conv.weight"), 9 * 16);
    assert_eq!(fan_in(CnnBlueprint::Attention, "fc1.weight"), c);
    // Same key, same row; another env, another row.
    let l = layout(CnnBlueprint::ConvLight, 8);
    let a = born_rows::<f32>(&l, 2, false, 3);
    let b = born_rows::<f32>(&l, 2, false, 3);
    assert_eq!(bits(&a), bits(&b));
    let p = l.param_count();
    assert_ne!(bits(&a[..p]), bits(&a[p..]));
}

#[test]
fn multiply_zeroes_exactly_the_last_linear_or_conv() {
    let last = |bp| -> Vec<&'static str> {
        layout(bp, 8).tensors().iter().filter(|t| t.zeroed_by_multiply).map(|t| t.name).collect()
    };
    assert_eq!(last(CnnBlueprint::ConvLight), ["conv.weight"]);
    assert_eq!(last(CnnBlueprint::Attention), ["fc2.weight", "fc2.bias"]);
    assert!(last(CnnBlueprint::Norm).is_empty());
    assert_eq!(last(CnnBlueprint::Depthwise), ["pointwise.weight"]);
    assert_eq!(last(CnnBlueprint::Bottleneck), ["up.weight"]);
    assert_eq!(last(CnnBlueprint::ConvSmall), ["conv.weight"]);
    assert_eq!(last(CnnBlueprint::ConvHeavy), ["conv2.weight"]);
    assert!(gate_layout(8).tensors().iter().all(|t| !t.zeroed_by_multiply));

    for bp in CnnBlueprint::ALL {
        let l = layout(bp, 16);
        let plain = born_rows::<f32>(&l, 1, false, 11);
        let multiply = born_rows::<f32>(&l, 1, true, 11);
        for t in l.tensors() {
            if t.zeroed_by_multiply {
                assert!(multiply[t.range()].iter().all(|&v| v == 0.0), "{} {}", bp.name(), t.name);
            } else {
                assert_eq!(bits(&plain[t.range()]), bits(&multiply[t.range()]), "{} {}", bp.name(), t.name);
            }
        }
    }
}

#[test]
fn birth_outputs() {
    let s = shape(3, 2, 8, 5, 5);
    let x = to_f32(&signed(1, s.len()));
    let born = |bp, multiply| born_rows::<f32>(&layout(bp, s.channels), s.envs, multiply, 5);

    // Exact identities: conv_small, bottleneck, norm always; conv_light, conv_heavy, depthwise with MULTIPLY.
    for bp in [CnnBlueprint::ConvSmall, CnnBlueprint::Bottleneck, CnnBlueprint::Norm] {
        for multiply in [false, true] {
            let y = forward_only(bp, s, &born(bp, multiply), &x);
            assert_eq!(bits(&y), bits(&x), "{} (multiply {multiply}) is not an identity", bp.name());
        }
    }
    for bp in [CnnBlueprint::ConvLight, CnnBlueprint::ConvHeavy, CnnBlueprint::Depthwise] {
        let y = forward_only(bp, s, &born(bp, true), &x);
        assert_eq!(bits(&y), bits(&x), "{} with MULTIPLY is not an identity", bp.name());
        let y = forward_only(bp, s, &born(bp, false), &x);
        let moved = y.iter().zip(&x).filter(|(a, b)| (*a - *b).abs() > 1e-3).count();
        assert!(moved > s.len() / 4, "{} should not be an identity at birth ({moved} moved)", bp.name());
    }

    // Squeeze-excite: σ(3)·x ≈ 0.9526·x, and 0.5·x with MULTIPLY.
    let sigma3 = crate::ops::sigmoid(3.0f32);
    assert!((sigma3 - 0.9526).abs() < 1e-4);
    let y = forward_only(CnnBlueprint::Attention, s, &born(CnnBlueprint::Attention, false), &x);
    assert_eq!(bits(&y), bits(&x.iter().map(|v| v * sigma3).collect::<Vec<_>>()));
    let y = forward_only(CnnBlueprint::Attention, s, &born(CnnBlueprint::Attention, true), &x);
    assert_eq!(bits(&y), bits(&x.iter().map(|v| v * 0.5).collect::<Vec<_>>()));
}

fn check_gradients(bp: CnnBlueprint) {
    for (i, s) in GRADIENT_SHAPES.into_iter().enumerate() {
        let seed = 100 * (bp as u64) + 10 * i as u64;
        let l = layout(bp, s.channels);
        let params = random_rows(&l, s.envs, seed);
        let x = test_input(seed + 1, s);
        let r = signed(seed + 3, s.len());
        let analytic = run(bp, s, &params, &x, &r);

        let mut ws = Workspace::new();
        let mut y = vec![0.0; s.len()];
        let numeric_params = numeric_gradient(&params, |p| {
            forward(bp, s, p, &x, &mut y, &mut ws);
            project(&r, &y)
        });
        let numeric_x = numeric_gradient(&x, |xp| {
            forward(bp, s, &params, xp, &mut y, &mut ws);
            project(&r, &y)
        });
        let name = format!("{} {s:?}", bp.name());
        assert_gradient(&format!("{name} params"), &analytic.grad_params, &numeric_params);
        assert_gradient(&format!("{name} input"), &analytic.grad_x, &numeric_x);
        // Every tensor of every env gets its own gradient: the check is not carried by one tensor.
        let p = l.param_count();
        for e in 0..s.envs {
            for t in l.tensors() {
                let range = e * p + t.offset..e * p + t.offset + t.len;
                let norm: f64 = numeric_params[range].iter().map(|v| v * v).sum();
                assert!(norm > 1e-12, "{name}: env {e} {} has no gradient", t.name);
            }
        }

        // The input gradient is optional and does not change the parameter gradient.
        forward(bp, s, &params, &x, &mut y, &mut ws);
        let mut without = vec![f64::NAN; params.len()];
        backward(bp, s, &x, &r, &mut without, None, &mut ws);
        assert_eq!(without, analytic.grad_params, "{name}: parameter gradient depends on grad_x");
    }
}

#[test]
fn norm_gradients_match_finite_differences() {
    check_gradients(CnnBlueprint::Norm);
}

#[test]
fn attention_gradients_match_finite_differences() {
    check_gradients(CnnBlueprint::Attention);
}

#[test]
fn depthwise_gradients_match_finite_differences() {
    check_gradients(CnnBlueprint::Depthwise);
}

#[test]
fn bottleneck_gradients_match_finite_differences() {
    check_gradients(CnnBlueprint::Bottleneck);
}

#[test]
fn conv_small_gradients_match_finite_differences() {
    check_gradients(CnnBlueprint::ConvSmall);
}

#[test]
fn conv_light_gradients_match_finite_differences() {
    check_gradients(CnnBlueprint::ConvLight);
}

#[test]
fn conv_heavy_gradients_match_finite_differences() {
    check_gradients(CnnBlueprint::ConvHeavy);
}

#[test]
fn birth_gradients_of_identity_seeds_match_finite_differences() {
    // At birth the zero UP blocks most of the bottleneck and λ = 0 blocks the norm's affine; what does
    // flow (into UP and the norm; into λ) must be right, and the input gradient is the identity's.
    let s = shape(2, 2, 8, 3, 3);
    for bp in [CnnBlueprint::Bottleneck, CnnBlueprint::Norm] {
        let params = born_rows::<f64>(&layout(bp, s.channels), s.envs, false, 21);
        let x = uniform(22, s.len(), -1.0, 2.0);
        let r = signed(23, s.len());
        let analytic = run(bp, s, &params, &x, &r);
        let mut ws = Workspace::new();
        let mut y = vec![0.0; s.len()];
        let numeric = numeric_gradient(&params, |p| {
            forward(bp, s, p, &x, &mut y, &mut ws);
            project(&r, &y)
        });
        assert_gradient(&format!("{} at birth", bp.name()), &analytic.grad_params, &numeric);
        assert_eq!(analytic.grad_x, r, "{}: input gradient at birth is not the identity's", bp.name());
    }
}

#[test]
fn seeds_born_with_a_zero_conv_before_relu_get_no_gradient() {
    // conv_small at birth, and conv_light / conv_heavy / depthwise born under MULTIPLY, end in
    // relu(GN(0)) = relu(β = 0) = 0, where ReLU's subgradient is 0 (PyTorch's convention): every parameter
    // gradient is exactly zero, as in the reference, so such a seed stays an identity under SGD.
    // (Finite differences disagree here: GN rescales a tiny conv output to O(1), across the kink.)
    let s = shape(2, 2, 8, 3, 3);
    let x = uniform(24, s.len(), -1.0, 2.0);
    let r = signed(25, s.len());
    for (bp, multiply) in [
        (CnnBlueprint::ConvSmall, false),
        (CnnBlueprint::ConvLight, true),
        (CnnBlueprint::ConvHeavy, true),
        (CnnBlueprint::Depthwise, true),
    ] {
        let params = born_rows::<f64>(&layout(bp, s.channels), s.envs, multiply, 26);
        let analytic = run(bp, s, &params, &x, &r);
        assert!(analytic.grad_params.iter().all(|&g| g == 0.0), "{}: non-zero gradient at birth", bp.name());
        assert_eq!(analytic.grad_x, r, "{}", bp.name());
    }
}

fn gate_run<T: Real>(s: SeedShape, params: &[T], x: &[T], grad_g: &[T]) -> Run<T> {
    let mut ws = GateWorkspace::new();
    let mut g = vec![T::ZERO; s.samples()];
    gate_forward(s, params, x, &mut g, &mut ws);
    let mut grad_params = vec![T::ZERO; params.len()];
    let mut grad_x = vec![T::ZERO; s.len()];
    gate_backward(s, grad_g, &mut grad_params, Some(&mut grad_x), &mut ws);
    Run { y: g, grad_params, grad_x }
}

#[test]
fn gate_gradients_match_finite_differences() {
    for (i, s) in GRADIENT_SHAPES.into_iter().enumerate() {
        let l = gate_layout(s.channels);
        let seed = 900 + 10 * i as u64;
        let params = random_rows(&l, s.envs, seed);
        let x = test_input(seed + 1, s);
        let r = signed(seed + 3, s.samples());
        let analytic = gate_run(s, &params, &x, &r);
        let mut ws = GateWorkspace::new();
        let mut g = vec![0.0; s.samples()];
        let numeric_params = numeric_gradient(&params, |p| {
            gate_forward(s, p, &x, &mut g, &mut ws);
            project(&r, &g)
        });
        let numeric_x = numeric_gradient(&x, |xp| {
            gate_forward(s, &params, xp, &mut g, &mut ws);
            project(&r, &g)
        });
        assert_gradient(&format!("gate {s:?} params"), &analytic.grad_params, &numeric_params);
        assert_gradient(&format!("gate {s:?} input"), &analytic.grad_x, &numeric_x);
        assert!(analytic.y.iter().all(|&v| v > 0.0 && v < 1.0));
    }
}

#[test]
fn gate_forward_matches_its_definition() {
    let s = shape(2, 3, 8, 2, 3);
    let l = gate_layout(s.channels);
    let params = born_rows::<f64>(&l, s.envs, false, 31);
    let x = signed(32, s.len());
    let mut g = vec![0.0; s.samples()];
    gate_forward(s, &params, &x, &mut g, &mut GateWorkspace::new());
    let (c, hidden, plane, p) = (s.channels, gate_hidden(s.channels), s.h * s.w, l.param_count());
    let at = |name| l.tensor(name).unwrap().offset;
    for e in 0..s.envs {
        let row = &params[e * p..(e + 1) * p];
        for b in 0..s.batch {
            let image = &x[(e * s.batch + b) * c * plane..][..c * plane];
            let pooled: Vec<f64> =
                image.chunks(plane).map(|ch| ch.iter().sum::<f64>() / plane as f64).collect();
            let mut logit = row[at("fc2.bias")];
            for j in 0..hidden {
                let w = &row[at("fc1.weight") + j * c..][..c];
                let z = row[at("fc1.bias") + j] + w.iter().zip(&pooled).map(|(a, b)| a * b).sum::<f64>();
                logit += row[at("fc2.weight") + j] * z.max(0.0);
            }
            let expected = 1.0 / (1.0 + (-logit).exp());
            assert!((g[e * s.batch + b] - expected).abs() < 1e-14);
        }
    }
}

/// The seeds and the gate on f32 inputs, for the bit-for-bit checks.
fn all_runs(s: SeedShape, seed: u64) -> Vec<Run<f32>> {
    let x = to_f32(&uniform(seed, s.len(), -1.0, 2.0));
    let r = to_f32(&signed(seed + 1, s.len()));
    let mut runs: Vec<Run<f32>> = CnnBlueprint::ALL
        .into_iter()
        .map(|bp| {
            let params = to_f32(&random_rows(&layout(bp, s.channels), s.envs, seed + bp as u64));
            run(bp, s, &params, &x, &r)
        })
        .collect();
    let params = to_f32(&random_rows(&gate_layout(s.channels), s.envs, seed + 50));
    runs.push(gate_run(s, &params, &x, &r[..s.samples()]));
    runs
}

#[test]
fn env_in_a_gathered_batch_equals_env_alone_bit_for_bit() {
    for s in [shape(3, 2, 8, 6, 5), shape(3, 3, 16, 4, 4)] {
        let x = to_f32(&uniform(40, s.len(), -1.0, 2.0));
        let r = to_f32(&signed(41, s.len()));
        let one = SeedShape { envs: 1, ..s };
        let n = one.len();
        let check = |name: &str, batched: &Run<f32>, alone: &[Run<f32>], p: usize, out: usize| {
            for (e, single) in alone.iter().enumerate() {
                assert_eq!(bits(&batched.y[e * out..][..out]), bits(&single.y), "{name} output, env {e}");
                assert_eq!(
                    bits(&batched.grad_params[e * p..][..p]),
                    bits(&single.grad_params),
                    "{name} parameter gradient, env {e}"
                );
                assert_eq!(
                    bits(&batched.grad_x[e * n..][..n]),
                    bits(&single.grad_x),
                    "{name} input gradient, env {e}"
                );
            }
        };
        for bp in CnnBlueprint::ALL {
            let p = param_count(bp, s.channels);
            let params = to_f32(&random_rows(&layout(bp, s.channels), s.envs, 42));
            let batched = run(bp, s, &params, &x, &r);
            let alone: Vec<_> = (0..s.envs)
                .map(|e| run(bp, one, &params[e * p..][..p], &x[e * n..][..n], &r[e * n..][..n]))
                .collect();
            check(bp.name(), &batched, &alone, p, n);
        }
        let p = gate_param_count(s.channels);
        let params = to_f32(&random_rows(&gate_layout(s.channels), s.envs, 43));
        let grad_g = &r[..s.samples()];
        let batched = gate_run(s, &params, &x, grad_g);
        let alone: Vec<_> = (0..s.envs)
            .map(|e| {
                gate_run(one, &params[e * p..][..p], &x[e * n..][..n], &grad_g[e * s.batch..][..s.batch])
            })
            .collect();
        check("gate", &batched, &alone, p, s.batch);
    }
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let s = shape(2, 4, 16, 8, 8);
    let one = with_threads(1, || all_runs(s, 60));
    let two = with_threads(2, || all_runs(s, 60));
    for (i, (a, b)) in one.iter().zip(&two).enumerate() {
        assert_eq!(bits(&a.y), bits(&b.y), "module {i} output");
        assert_eq!(bits(&a.grad_params), bits(&b.grad_params), "module {i} parameter gradient");
        assert_eq!(bits(&a.grad_x), bits(&b.grad_x), "module {i} input gradient");
    }
}

#[test]
fn workspaces_stop_growing_after_the_first_step() {
    let big = shape(3, 2, 16, 4, 4);
    let small = shape(1, 2, 16, 4, 4);
    let x = to_f32(&signed(70, big.len()));
    let r = to_f32(&signed(71, big.len()));
    for bp in CnnBlueprint::ALL {
        let params = to_f32(&random_rows(&layout(bp, big.channels), big.envs, 72));
        let mut ws = Workspace::new();
        let mut y = vec![0.0f32; big.len()];
        let mut grad_params = vec![0.0f32; params.len()];
        let mut grad_x = vec![0.0f32; big.len()];
        let mut step = |s: SeedShape, ws: &mut Workspace<f32>| {
            let (n, p) = (s.len(), s.envs * param_count(bp, s.channels));
            forward(bp, s, &params[..p], &x[..n], &mut y[..n], ws);
            backward(bp, s, &x[..n], &r[..n], &mut grad_params[..p], Some(&mut grad_x[..n]), ws);
        };
        step(big, &mut ws);
        let capacity = ws.capacity();
        assert!(capacity > 0);
        step(big, &mut ws);
        step(small, &mut ws);
        step(big, &mut ws);
        assert_eq!(ws.capacity(), capacity, "{} workspace grew after the first step", bp.name());
    }
}

#[test]
#[should_panic(expected = "must follow a forward")]
fn backward_without_a_matching_forward_panics() {
    let s = shape(1, 1, 8, 2, 2);
    let mut ws = Workspace::<f64>::new();
    let params = random_rows(&layout(CnnBlueprint::ConvLight, 8), 1, 1);
    let x = vec![0.5; s.len()];
    let mut y = vec![0.0; s.len()];
    forward(CnnBlueprint::ConvLight, s, &params, &x, &mut y, &mut ws);
    let mut grads = vec![0.0; param_count(CnnBlueprint::ConvHeavy, 8)];
    backward(CnnBlueprint::ConvHeavy, s, &x, &y, &mut grads, None, &mut ws);
}

#[test]
fn rows_and_tensor_major_round_trip() {
    let l = layout(CnnBlueprint::ConvHeavy, 4);
    let envs = 3;
    let rows: Vec<f64> = (0..envs * l.param_count()).map(|i| i as f64).collect();
    let mut staged = vec![0.0; rows.len()];
    l.rows_to_tensors(envs, &rows, &mut staged);
    // Tensor 1 (norm1.weight) of env 2 sits at envs·offset + 2·len in the staged copy.
    let t = l.tensors()[1];
    assert_eq!(staged[envs * t.offset + 2 * t.len], rows[2 * l.param_count() + t.offset]);
    let mut back = vec![0.0; rows.len()];
    l.tensors_to_rows(envs, &staged, &mut back);
    assert_eq!(back, rows);
}

/// The blended forward equals the seed's forward, then `blend_add_forward` with the seed's input as the
/// host activation, bit for bit, for every blueprint (the conv seeds blend in their last pass, the others
/// in a separate one), with a different amplitude per env including the clamped ends; and the backward
/// that follows it is the one that follows the plain forward.
#[test]
fn blended_forward_is_forward_then_add_blend() {
    let s = shape(3, 4, 8, 5, 7);
    let x = to_f32(&test_input(70, s));
    let grad_y = to_f32(&signed(71, s.len()));
    let alpha = [0.25f32, 1.5, 0.7];
    let clamped: Vec<f32> = alpha.iter().map(|&a| crate::ops::real::clamp01(a)).collect();
    for bp in CnnBlueprint::ALL {
        let layout = layout(bp, s.channels);
        let params = to_f32(&random_rows(&layout, s.envs, 72));
        let plain = run(bp, s, &params, &x, &grad_y);
        let mut expected = vec![0.0f32; s.len()];
        let blend = crate::ops::BlendShape { envs: s.envs, batch: s.batch, features: s.channels * s.h * s.w };
        crate::ops::blend_add_forward(
            blend,
            &x,
            &plain.y,
            crate::ops::Amplitude::PerEnv(&alpha),
            &mut expected,
        );
        let moved = expected.iter().zip(&x).filter(|(y, x)| y != x).count();
        assert!(moved > s.len() / 4, "{bp:?}: the blend moves the output ({moved} of {})", s.len());

        let mut ws = Workspace::new();
        let mut y = vec![f32::NAN; s.len()];
        forward_blended_add(bp, s, &params, &x, &clamped, &mut y, &mut ws);
        assert_eq!(bits(&y), bits(&expected), "{bp:?}: blended output");
        let mut grad_params = vec![0.0f32; params.len()];
        let mut grad_x = vec![0.0f32; s.len()];
        backward(bp, s, &x, &grad_y, &mut grad_params, Some(&mut grad_x), &mut ws);
        assert_eq!(bits(&grad_params), bits(&plain.grad_params), "{bp:?}: parameter gradients");
        assert_eq!(bits(&grad_x), bits(&plain.grad_x), "{bp:?}: input gradient");
    }
}

/// With at least as many envs as threads a conv unit's backward runs per env a few images at a time
/// (the ReLU + norm backward of a run, then the conv's weight and input gradient from it in cache); with
/// fewer it runs op by op over the whole batch. Both give the same bits: 3 envs of 7 images at 32×32×8
/// are runs of 3, 3 and 1 images, and the pointwise unit of depthwise and bottleneck goes through it too.
#[test]
fn conv_unit_backward_in_runs_equals_the_op_by_op_backward() {
    let s = shape(3, 7, 8, 32, 32);
    let x = to_f32(&uniform(80, s.len(), -1.0, 2.0));
    let r = to_f32(&signed(81, s.len()));
    for bp in CnnBlueprint::ALL {
        let params = to_f32(&random_rows(&layout(bp, s.channels), s.envs, 82 + bp as u64));
        let in_runs = with_threads(1, || run(bp, s, &params, &x, &r));
        let op_by_op = with_threads(4, || run(bp, s, &params, &x, &r));
        let name = bp.name();
        assert_eq!(bits(&in_runs.y), bits(&op_by_op.y), "{name} output");
        assert_eq!(bits(&in_runs.grad_params), bits(&op_by_op.grad_params), "{name} parameter gradient");
        assert_eq!(bits(&in_runs.grad_x), bits(&op_by_op.grad_x), "{name} input gradient");
        let nonzero = in_runs.grad_params.iter().filter(|v| **v != 0.0).count();
        assert!(nonzero > in_runs.grad_params.len() / 2, "{name}: {nonzero} nonzero parameter gradients");
    }
}

/// Hand-derived: at 8 channels on 32×32 (1,024 positions), a 3×3 conv 8 → 8 is 9·1024·64 = 589,824
/// multiply-adds; the attention squeeze is 8 → 2 → 8; the bottleneck's width is max(8, 8/4) = 8.
#[test]
fn forward_macs_count_each_blueprints_convolutions_and_linears() {
    use CnnBlueprint::*;
    let macs = |bp| super::forward_macs(bp, 8, 32, 32);
    assert_eq!(macs(ConvSmall), 65_536);
    assert_eq!(macs(ConvLight), 589_824);
    assert_eq!(macs(ConvHeavy), 1_179_648);
    assert_eq!(macs(Attention), 32);
    assert_eq!(macs(Norm), 0);
    assert_eq!(macs(Depthwise), 73_728 + 65_536);
    assert_eq!(macs(Bottleneck), 65_536 + 589_824 + 65_536);
    // Not square: h·w positions.
    assert_eq!(super::forward_macs(ConvLight, 16, 8, 4), 9 * 32 * 256);
}
