//! Placement of model replicas onto GPUs: deterministic, and stable across applies (a replica
//! that runs where the plan still allows it stays there).

use super::{WorkerKey, tier_on};
use crate::inventory::Inventory;
use crate::plan::check::{Desired, hosts};
use crate::plan::units::human_mib;
use crate::plan::{GpuRef, Isolation, Model, Sharing};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    pub key: WorkerKey,
    pub gpu: u32,
    pub isolation: Isolation,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Unplaced {
    pub model: String,
    pub replica: u32,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct Placement {
    pub assignments: Vec<Assignment>,
    pub unplaced: Vec<Unplaced>,
}

/// Room left on one GPU while placing.
#[derive(Debug, Clone)]
struct Room {
    sharing: Sharing,
    total_mib: u64,
    free_mib: u64,
    workers: u32,
    /// Replicas placed here, per model, to spread a model's replicas over GPUs.
    per_model: BTreeMap<String, u32>,
}

impl Room {
    fn fits(&self, model: &Model) -> bool {
        match self.sharing {
            Sharing::Exclusive => self.workers == 0 && model.memory_mib <= self.total_mib,
            _ => model.memory_mib <= self.free_mib,
        }
    }

    fn take(&mut self, model: &Model) {
        self.workers += 1;
        *self.per_model.entry(model.name.clone()).or_default() += 1;
        self.free_mib = self.free_mib.saturating_sub(model.memory_mib);
    }
}

/// Places every replica of every model. `keep` maps replicas that run now to their GPU; they are
/// placed first, where they are, if that GPU still suits them.
pub fn place(desired: &Desired, inventory: &Inventory, keep: &BTreeMap<WorkerKey, u32>) -> Placement {
    let mut rooms: BTreeMap<u32, Room> = desired
        .gpus
        .iter()
        .filter_map(|(index, d)| {
            let gpu = inventory.gpu(*index)?;
            let total = gpu.memory_total_mib;
            Some((
                *index,
                Room { sharing: d.sharing, total_mib: total, free_mib: total, workers: 0, per_model: BTreeMap::new() },
            ))
        })
        .collect();
    let mut out = Placement::default();
    let mut pending = Vec::new();
    for model in &desired.models {
        for replica in 0..model.replicas {
            let key = WorkerKey { model: model.name.clone(), replica };
            let kept = keep.get(&key).copied().filter(|gpu| {
                allowed(model, inventory, *gpu)
                    && rooms.get(gpu).is_some_and(|r| hosts(model.isolation, r.sharing) && r.fits(model))
            });
            match kept {
                Some(gpu) => {
                    let room = rooms.get_mut(&gpu).expect("checked above");
                    room.take(model);
                    out.assignments.push(Assignment { key, gpu, isolation: tier_on(room.sharing) });
                }
                None => pending.push((model, key)),
            }
        }
    }
    for (model, key) in pending {
        // Auto prefers a shared GPU (the cheapest tier that fits), then a whole one. Among equals,
        // the GPU with the fewest replicas of this model, so one GPU's fault does not take them
        // all; then the lowest index, so placement is deterministic.
        let mut candidates: Vec<u32> = rooms
            .iter()
            .filter(|(gpu, room)| allowed(model, inventory, **gpu) && hosts(model.isolation, room.sharing))
            .map(|(gpu, _)| *gpu)
            .collect();
        candidates.sort_by_key(|gpu| {
            let room = &rooms[gpu];
            (room.sharing == Sharing::Exclusive, room.per_model.get(&model.name).copied().unwrap_or(0), *gpu)
        });
        match candidates.iter().find(|gpu| rooms[*gpu].fits(model)) {
            Some(&gpu) => {
                let room = rooms.get_mut(&gpu).expect("candidate exists");
                room.take(model);
                out.assignments.push(Assignment { key, gpu, isolation: tier_on(room.sharing) });
            }
            None => {
                let reason = why_unplaced(model, &candidates, &rooms);
                out.unplaced.push(Unplaced { model: key.model, replica: key.replica, reason });
            }
        }
    }
    out.assignments.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

fn allowed(model: &Model, inventory: &Inventory, gpu: u32) -> bool {
    match &model.gpu {
        None => true,
        Some(GpuRef::Index(i)) => *i == gpu,
        Some(GpuRef::Uuid(u)) => inventory.gpu(gpu).is_some_and(|g| &g.uuid == u),
    }
}

fn why_unplaced(model: &Model, candidates: &[u32], rooms: &BTreeMap<u32, Room>) -> String {
    if candidates.is_empty() {
        return "no GPU in the plan can host its isolation tier".to_string();
    }
    let states: Vec<String> = candidates
        .iter()
        .map(|gpu| {
            let room = &rooms[gpu];
            match room.sharing {
                Sharing::Exclusive => format!("GPU {gpu} already runs a worker"),
                _ => format!("GPU {gpu} has {} free", human_mib(room.free_mib)),
            }
        })
        .collect();
    format!("needs {}; {}", human_mib(model.memory_mib), states.join(", "))
}
