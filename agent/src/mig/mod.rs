//! MIG layouts: checking a wanted set of instances against a product's profiles and placement
//! rules, and placing it next to the instances that exist ([`layout`]). Pure: no I/O.

pub mod layout;

pub use layout::{LayoutError, Planned, Want, plan_layout};
