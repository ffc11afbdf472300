//! Table and JSON rendering.

use comfy_table::presets::NOTHING;
use comfy_table::{ContentArrangement, Table};
use serde::Serialize;
use std::io::Write;

pub fn json(out: &mut dyn Write, value: &impl Serialize) -> std::io::Result<()> {
    writeln!(out, "{}", serde_json::to_string_pretty(value).expect("views serialize"))
}

/// A borderless table with a header row, as kubectl prints them.
pub fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut t = Table::new();
    t.load_preset(NOTHING).set_content_arrangement(ContentArrangement::Disabled).set_header(header.to_vec());
    for row in rows {
        t.add_row(row);
    }
    // comfy-table pads each cell with a leading space; strip it so columns start at the margin.
    t.to_string()
        .lines()
        .map(|l| l.strip_prefix(' ').unwrap_or(l).trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn mib(mib: u64) -> String {
    if mib >= 1024 { format!("{:.1} GiB", mib as f64 / 1024.0) } else { format!("{mib} MiB") }
}
