//! Slot ids `r<row>c<col>` and the canonical slot order (spec kasmina §6.4, §8.1).

use esper_components::{SlotConfig, SlotId, SlotIdError};

#[test]
fn parse_and_display_round_trip() {
    for s in ["r0c0", "r1c2", "r0c12", "r10c3"] {
        assert_eq!(s.parse::<SlotId>().unwrap().to_string(), s);
    }
    assert_eq!("r1c2".parse::<SlotId>().unwrap(), SlotId::new(1, 2));
}

#[test]
fn malformed_and_legacy_ids_are_rejected() {
    for bad in
        ["", "r0", "c0", "r0c", "rc0", "R0C0", "r0c0 ", " r0c0", "r-1c0", "r+1c0", "r0c0c1", "x0c0", "r999c0"]
    {
        assert!(matches!(bad.parse::<SlotId>(), Err(SlotIdError::Malformed(_))), "{bad:?}");
    }
    for legacy in ["early", "mid", "late"] {
        let err = legacy.parse::<SlotId>().unwrap_err();
        assert!(matches!(err, SlotIdError::Legacy(_)));
        assert!(err.to_string().contains("r<row>c<col>"));
    }
}

#[test]
fn canonical_order_is_row_major_whatever_the_input_order() {
    let config = SlotConfig::parse_list("r1c0,r0c2,r0c0,r1c1,r0c1").unwrap();
    let names: Vec<String> = config.ids().iter().map(ToString::to_string).collect();
    assert_eq!(names, ["r0c0", "r0c1", "r0c2", "r1c0", "r1c1"]);
    assert_eq!(config.index_of(SlotId::new(1, 0)), Some(3));
    assert_eq!(config.index_of(SlotId::new(2, 0)), None);
    assert_eq!(SlotConfig::default_three(), SlotConfig::parse_list("r0c2, r0c1, r0c0").unwrap());
}

#[test]
fn slot_lists_must_be_non_empty_and_unique() {
    assert_eq!(SlotConfig::parse_list(""), Err(SlotIdError::Empty));
    assert_eq!(SlotConfig::parse_list(" , "), Err(SlotIdError::Empty));
    assert_eq!(SlotConfig::parse_list("r0c1,r0c0,r0c1"), Err(SlotIdError::Duplicate(SlotId::new(0, 1))));
    assert!(matches!(SlotConfig::parse_list("r0c0,,r0c1"), Err(SlotIdError::Malformed(_))));
    let eleven: Vec<SlotId> = (0..11).map(|c| SlotId::new(0, c)).collect();
    assert_eq!(SlotConfig::new(eleven), Err(SlotIdError::TooMany(11)));
}
