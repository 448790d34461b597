//! Slot ids `r<row>c<col>` and the canonical slot order (spec kasmina §6.4).

use bevy_ecs::resource::Resource;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Most slots any host preset exposes (5 blocks × 2 rows).
pub const MAX_SLOTS: usize = 10;

/// An injection point: row 0 = after block `col` before its pool, row 1 = after pool `col`.
/// Ordering is the canonical (row, col) order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SlotId {
    pub row: u8,
    pub col: u8,
}

impl SlotId {
    pub const fn new(row: u8, col: u8) -> Self {
        Self { row, col }
    }
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}c{}", self.row, self.col)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotIdError {
    Malformed(String),
    Legacy(String),
    Empty,
    Duplicate(SlotId),
    TooMany(usize),
}

impl fmt::Display for SlotIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(s) => write!(f, "slot id '{s}' is not of the form r<row>c<col> (e.g. r0c1)"),
            Self::Legacy(s) => write!(
                f,
                "slot id '{s}' is a retired legacy name; use r<row>c<col> (early=r0c0, mid=r0c1, late=r0c2)"
            ),
            Self::Empty => write!(f, "the slot list is empty: give at least one slot id"),
            Self::Duplicate(id) => write!(f, "slot id {id} is listed twice"),
            Self::TooMany(n) => write!(f, "{n} slots given; at most {MAX_SLOTS} are supported"),
        }
    }
}

impl std::error::Error for SlotIdError {}

impl FromStr for SlotId {
    type Err = SlotIdError;
    /// Parses `^r(\d+)c(\d+)$` exactly (no whitespace, no sign).
    fn from_str(s: &str) -> Result<Self, SlotIdError> {
        if matches!(s, "early" | "mid" | "late") {
            return Err(SlotIdError::Legacy(s.to_string()));
        }
        let malformed = || SlotIdError::Malformed(s.to_string());
        let rest = s.strip_prefix('r').ok_or_else(malformed)?;
        let (row, col) = rest.split_once('c').ok_or_else(malformed)?;
        let digits = |d: &str| -> Result<u8, SlotIdError> {
            if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
                return Err(malformed());
            }
            d.parse::<u8>().map_err(|_| malformed())
        };
        Ok(SlotId::new(digits(row)?, digits(col)?))
    }
}

/// The enabled slots in canonical order. The index of a slot here is its slot-head index and its
/// `SlotIndex` component; it never depends on the order the user listed the slots in.
#[derive(Resource, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotConfig {
    ids: Vec<SlotId>,
}

impl SlotConfig {
    /// Validates (non-empty, unique, at most [`MAX_SLOTS`]) and sorts by (row, col).
    pub fn new(ids: impl IntoIterator<Item = SlotId>) -> Result<Self, SlotIdError> {
        let mut ids: Vec<SlotId> = ids.into_iter().collect();
        if ids.is_empty() {
            return Err(SlotIdError::Empty);
        }
        ids.sort();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(SlotIdError::Duplicate(w[0]));
        }
        if ids.len() > MAX_SLOTS {
            return Err(SlotIdError::TooMany(ids.len()));
        }
        Ok(Self { ids })
    }

    /// Parses a comma-separated list such as `r0c0,r0c1,r0c2`.
    pub fn parse_list(list: &str) -> Result<Self, SlotIdError> {
        let parts: Vec<&str> = list.split(',').map(str::trim).collect();
        if parts.iter().all(|p| p.is_empty()) {
            return Err(SlotIdError::Empty);
        }
        let ids = parts.into_iter().map(SlotId::from_str).collect::<Result<Vec<_>, _>>()?;
        Self::new(ids)
    }

    /// The reference's standard three slots: r0c0, r0c1, r0c2.
    pub fn default_three() -> Self {
        Self { ids: vec![SlotId::new(0, 0), SlotId::new(0, 1), SlotId::new(0, 2)] }
    }

    pub fn ids(&self) -> &[SlotId] {
        &self.ids
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn index_of(&self, id: SlotId) -> Option<usize> {
        self.ids.iter().position(|&s| s == id)
    }
}
