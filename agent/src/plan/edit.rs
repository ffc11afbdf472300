//! Editing the stored plan for `gpuctl partition set|clear`: one GPU's entry gets the new MIG
//! layout, and the result is an ordinary plan that goes through the ordinary apply. The plan thus
//! stays the one source of truth, and the next `gpuctl apply` of an older plan undoes the change.

use super::parse::parse_selector;
use super::{Problem, Selector};
use crate::inventory::Inventory;
use toml_edit::{Array, ArrayOfTables, DocumentMut, Item, Table, value};

fn problem(message: String) -> Problem {
    Problem { path: String::new(), line: 0, column: 0, message }
}

/// Returns `stored` (or an empty plan) with GPU `gpu` set to `sharing = "mig"` and `layout`, or,
/// when `layout` is None, to `sharing = "time-slicing"` with MIG off. An entry that selects this
/// GPU among others is narrowed to the others; comments and formatting elsewhere are kept.
pub fn set_partition(
    stored: Option<&str>,
    inventory: &Inventory,
    gpu: u32,
    layout: Option<&[String]>,
) -> Result<String, Problem> {
    let mut doc: DocumentMut = stored
        .unwrap_or("version = 1\n")
        .parse()
        .map_err(|e| problem(format!("the stored plan does not parse any more: {e}")))?;
    let entries = doc
        .entry("gpus")
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()))
        .as_array_of_tables_mut()
        .ok_or_else(|| problem("the stored plan's gpus is not an array of tables".into()))?;
    let mut target: Option<usize> = None;
    for (i, table) in entries.iter_mut().enumerate() {
        let selected = selected(table, inventory);
        if !selected.contains(&gpu) {
            continue;
        }
        if selected.len() == 1 {
            target = Some(i);
        } else {
            let rest: Vec<String> = selected.iter().filter(|g| **g != gpu).map(u32::to_string).collect();
            table.insert("select", value(rest.join(",")));
        }
    }
    let table = match target {
        Some(i) => entries.get_mut(i).expect("index from iteration"),
        None => {
            let mut t = Table::new();
            t.insert("select", value(gpu.to_string()));
            entries.push(t);
            entries.get_mut(entries.len() - 1).expect("just pushed")
        }
    };
    for key in ["mig", "mps", "timeslice"] {
        table.remove(key);
    }
    match layout {
        Some(items) => {
            table.insert("sharing", value("mig"));
            let mut array = Array::new();
            for item in items {
                array.push(item.as_str());
            }
            table.insert("mig", value(array));
        }
        None => {
            table.insert("sharing", value("time-slicing"));
        }
    }
    Ok(doc.to_string())
}

fn selected(table: &Table, inventory: &Inventory) -> Vec<u32> {
    let text = match table.get("select") {
        Some(Item::Value(toml_edit::Value::String(s))) => s.value().clone(),
        Some(Item::Value(toml_edit::Value::Integer(i))) => i.value().to_string(),
        _ => return Vec::new(),
    };
    match parse_selector(text.trim()) {
        Ok(Selector::All) => inventory.gpus.iter().map(|g| g.index).collect(),
        Ok(Selector::Indices(v)) => v,
        Ok(Selector::Uuid(u)) => inventory.gpu_by_uuid(&u).map(|g| vec![g.index]).unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{ComputeMode, Gpu};

    fn inventory(n: u32) -> Inventory {
        let gpu = |index| Gpu {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H200".into(),
            pci_device_id: 0,
            pci_bus_id: String::new(),
            memory_total_mib: 0,
            memory_used_mib: 0,
            mig_current: false,
            mig_pending: false,
            compute_mode: ComputeMode::Default,
            sm_count: 0,
            minor: None,
            profiles: vec![],
            instances: vec![],
            processes: vec![],
        };
        Inventory { driver_version: String::new(), gpus: (0..n).map(gpu).collect(), unavailable: vec![] }
    }

    #[test]
    fn edits() {
        let layout = ["3g.71gb".to_string(), "1g.18gb@6".to_string()];
        // (stored plan, GPU, layout, plan afterwards)
        type Case<'a> = (Option<&'a str>, u32, Option<&'a [String]>, &'a str);
        let cases: [Case; 4] = [
            (
                None,
                1,
                Some(&layout),
                "version = 1\n\n[[gpus]]\nselect = \"1\"\nsharing = \"mig\"\nmig = [\"3g.71gb\", \"1g.18gb@6\"]\n",
            ),
            (
                Some("version = 1\n# keep me\n[[gpus]]\nselect = \"0-2\"\nsharing = \"time-slicing\"\n"),
                1,
                Some(&layout),
                "version = 1\n# keep me\n[[gpus]]\nselect = \"0,2\"\nsharing = \"time-slicing\"\n\n[[gpus]]\nselect = \"1\"\nsharing = \"mig\"\nmig = [\"3g.71gb\", \"1g.18gb@6\"]\n",
            ),
            (
                Some("version = 1\n[[gpus]]\nselect = \"1\"\nsharing = \"mig\"\nmig = [\"7g.141gb\"]\n"),
                1,
                Some(&layout),
                "version = 1\n[[gpus]]\nselect = \"1\"\nsharing = \"mig\"\nmig = [\"3g.71gb\", \"1g.18gb@6\"]\n",
            ),
            (
                Some("version = 1\n[[gpus]]\nselect = \"GPU-1\"\nsharing = \"mig\"\nmig = [\"7g.141gb\"]\n"),
                1,
                None,
                "version = 1\n[[gpus]]\nselect = \"GPU-1\"\nsharing = \"time-slicing\"\n",
            ),
        ];
        for (stored, gpu, layout, want) in cases {
            assert_eq!(set_partition(stored, &inventory(3), gpu, layout).unwrap(), want, "{stored:?}");
        }
    }
}
