//! Host presets and their injection points (spec kasmina §6.1, §6.3, §8.1).

use esper_components::{SlotConfig, SlotId, TaskPreset};

#[test]
fn host_parameter_counts_match_the_spec() {
    let expected = [
        ("cifar_baseline", 6_418),
        ("cifar_multichannel", 6_418),
        ("cifar_scale", 99_922),
        ("cifar_deep_multichannel", 99_922),
        ("cifar_impaired", 77),
        ("cifar_minimal", 164),
        ("cifar_postpool", 24_346),
        ("cifar_highres", 24_346),
        ("cifar_deep_impaired", 1_140),
    ];
    for (name, params) in expected {
        let preset = TaskPreset::from_name(name).unwrap();
        assert_eq!(preset.name(), name);
        assert_eq!(preset.host().param_count(), params, "{name}");
    }
    assert_eq!(TaskPreset::from_name("tinystories"), None);
}

#[test]
fn cnn_three_block_host_has_six_points_in_canonical_order() {
    let host = TaskPreset::CifarBaseline.host();
    let points = host.injection_points();
    let ids: Vec<String> = points.iter().map(|p| p.id.to_string()).collect();
    assert_eq!(ids, ["r0c0", "r0c1", "r0c2", "r1c0", "r1c1", "r1c2"]);
    let orders: Vec<u32> = points.iter().map(|p| p.order).collect();
    assert_eq!(orders, [0, 1, 2, 3, 4, 5], "spec order is row-major");
    let shapes: Vec<(u32, u32)> = points.iter().map(|p| (p.channels, p.size)).collect();
    assert_eq!(shapes, [(8, 32), (16, 16), (32, 8), (8, 16), (16, 8), (32, 4)]);
    let exec: Vec<String> = host.execution_order().iter().map(ToString::to_string).collect();
    assert_eq!(exec, ["r0c0", "r1c0", "r0c1", "r1c1", "r0c2", "r1c2"], "forward order interleaves");
}

#[test]
fn scale_spatial_sizes_and_minimal_has_no_post_pool_points() {
    let scale = TaskPreset::CifarScale.host();
    let sizes: Vec<u32> =
        scale.execution_order().iter().map(|&id| scale.injection_point(id).unwrap().size).collect();
    assert_eq!(sizes, [32, 16, 16, 8, 8, 4, 4, 2, 2, 1]);
    let minimal = TaskPreset::CifarMinimal.host();
    let points = minimal.injection_points();
    assert_eq!(points.len(), 3);
    assert!(points.iter().all(|p| p.id.row == 0 && p.size == 32));
}

#[test]
fn enabled_slots_must_exist_on_the_host() {
    let host = TaskPreset::CifarMinimal.host();
    assert!(host.slot_config(&SlotConfig::default_three()).is_ok());
    let err = host.slot_config(&SlotConfig::parse_list("r0c0,r1c0").unwrap()).unwrap_err();
    assert_eq!(err.id, SlotId::new(1, 0));
    assert_eq!(err.to_string(), "slot r1c0 is not an injection point of this host (it has r0c0, r0c1, r0c2)");
}
