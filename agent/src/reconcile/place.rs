//! Placement of model replicas onto devices: whole GPUs and MIG instances. Deterministic, and
//! stable across applies (a replica that runs where the plan still allows it stays there).

use super::{Layouts, WorkerKey};
use crate::inventory::Inventory;
use crate::plan::check::Desired;
use crate::plan::units::human_mib;
use crate::plan::{GpuRef, Isolation, Model, Sharing};
use std::collections::BTreeMap;

/// A device a replica was placed on.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    pub key: WorkerKey,
    pub gpu: u32,
    /// The tier the replica runs under (never `auto`).
    pub isolation: Isolation,
    /// `PROFILE@START` of its MIG instance; None for a whole GPU.
    pub instance: Option<String>,
    /// The MPS daemon it is a client of (`mps` tier).
    pub mps_daemon: Option<String>,
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

/// Where a replica can go: a whole GPU or one MIG instance on it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct RoomKey {
    gpu: u32,
    /// (start, profile) of a MIG instance; None for the whole GPU.
    instance: Option<(u32, String)>,
}

impl RoomKey {
    fn instance_label(&self) -> Option<String> {
        self.instance.as_ref().map(|(start, profile)| format!("{profile}@{start}"))
    }

    /// Name of the MPS daemon serving this device: `gpu1`, or `gpu0-1g.18gb@6` for an instance.
    pub fn daemon_name(&self) -> String {
        match self.instance_label() {
            Some(i) => format!("gpu{}-{i}", self.gpu),
            None => format!("gpu{}", self.gpu),
        }
    }

    fn label(&self) -> String {
        match self.instance_label() {
            Some(i) => format!("GPU {} {i}", self.gpu),
            None => format!("GPU {}", self.gpu),
        }
    }
}

/// Room left on one device while placing.
#[derive(Debug, Clone)]
struct Room {
    /// How the device is shared: exclusive (whole GPU), time-slicing or mps.
    sharing: Sharing,
    total_mib: u64,
    free_mib: u64,
    workers: u32,
    /// Taken whole by a `mig`-tier replica.
    closed: bool,
    /// Replicas placed here, per model, to spread a model's replicas over devices.
    per_model: BTreeMap<String, u32>,
    /// MPS: the sum of the clients' `compute` shares may not pass this (None: the plan allows
    /// oversubscription).
    compute_cap: Option<u32>,
    compute_used: u32,
    /// MPS: one server per uid at a time, so one run-as user per device.
    user: Option<Option<String>>,
}

impl Room {
    fn new(sharing: Sharing, total_mib: u64) -> Room {
        Room {
            sharing,
            total_mib,
            free_mib: total_mib,
            workers: 0,
            closed: false,
            per_model: BTreeMap::new(),
            compute_cap: Some(100),
            compute_used: 0,
            user: None,
        }
    }

    /// Why an MPS device cannot take this model, if it cannot.
    fn mps_conflict(&self, model: &Model) -> Option<String> {
        if self.sharing != Sharing::Mps {
            return None;
        }
        if let Some(user) = &self.user
            && user != &model.user
        {
            let show = |u: &Option<String>| u.clone().unwrap_or_else(|| "the default user".into());
            return Some(format!("serves {} (one MPS server per uid)", show(user)));
        }
        let want = model.compute.unwrap_or(0);
        match self.compute_cap {
            Some(cap) if self.compute_used + want > cap => {
                Some(format!("has {}% of its compute left (shares may not sum past 100%)", cap - self.compute_used))
            }
            _ => None,
        }
    }

    fn fits(&self, key: &RoomKey, model: &Model) -> bool {
        match tier(key, self, model.isolation) {
            None => false,
            Some(Isolation::Exclusive | Isolation::Mig) => self.workers == 0 && model.memory_mib <= self.total_mib,
            Some(Isolation::Mps) => {
                !self.closed && model.memory_mib <= self.free_mib && self.mps_conflict(model).is_none()
            }
            Some(_) => !self.closed && model.memory_mib <= self.free_mib,
        }
    }

    fn take(&mut self, model: &Model, isolation: Isolation) {
        self.workers += 1;
        self.closed |= matches!(isolation, Isolation::Exclusive | Isolation::Mig);
        self.free_mib = self.free_mib.saturating_sub(model.memory_mib);
        *self.per_model.entry(model.name.clone()).or_default() += 1;
        if isolation == Isolation::Mps {
            self.compute_used += model.compute.unwrap_or(0);
            self.user = Some(model.user.clone());
        }
    }
}

/// The tier a replica of `isolation` gets in this room, or None when the room cannot host it.
fn tier(key: &RoomKey, room: &Room, isolation: Isolation) -> Option<Isolation> {
    let whole = key.instance.is_none();
    match (isolation, room.sharing) {
        (Isolation::Exclusive | Isolation::Auto, Sharing::Exclusive) if whole => Some(Isolation::Exclusive),
        (Isolation::TimeSlicing | Isolation::Auto, Sharing::TimeSlicing) => Some(Isolation::TimeSlicing),
        (Isolation::Mps | Isolation::Auto, Sharing::Mps) => Some(Isolation::Mps),
        (Isolation::Mig, Sharing::TimeSlicing) if !whole => Some(Isolation::Mig),
        _ => None,
    }
}

/// Preference among rooms that fit, smaller is better: shared devices before whole ones (the
/// cheapest tier that fits); for `mig`, the smallest instance; then the device with the fewest
/// replicas of this model (one device's fault does not take them all); then GPU and start order.
fn preference(key: &RoomKey, room: &Room, model: &Model) -> (u8, u64, u32, RoomKey) {
    let rank = match tier(key, room, model.isolation) {
        Some(Isolation::TimeSlicing | Isolation::Mps) => 0,
        Some(Isolation::Mig) => 1,
        _ => 2,
    };
    let size = if model.isolation == Isolation::Mig { room.total_mib } else { 0 };
    (rank, size, room.per_model.get(&model.name).copied().unwrap_or(0), key.clone())
}

fn rooms(desired: &Desired, inventory: &Inventory, layouts: &Layouts) -> BTreeMap<RoomKey, Room> {
    let mut rooms = BTreeMap::new();
    for (index, d) in &desired.gpus {
        let Some(gpu) = inventory.gpu(*index) else { continue };
        if d.sharing == Sharing::Mig {
            for planned in layouts.get(index).map(Vec::as_slice).unwrap_or_default() {
                let sharing =
                    if d.mig.get(planned.want).is_some_and(|m| m.mps) { Sharing::Mps } else { Sharing::TimeSlicing };
                let key = RoomKey { gpu: *index, instance: Some((planned.start, planned.profile.clone())) };
                rooms.insert(key, Room::new(sharing, planned.memory_mib));
            }
        } else {
            let mut room = Room::new(d.sharing, gpu.memory_total_mib);
            if d.mps.is_some_and(|m| m.allow_compute_oversubscription) {
                room.compute_cap = None;
            }
            rooms.insert(RoomKey { gpu: *index, instance: None }, room);
        }
    }
    rooms
}

/// Places every replica of every model. `keep` maps replicas that run now to their device
/// (GPU and instance); they are placed first, where they are, if that device still suits them.
pub fn place(
    desired: &Desired,
    inventory: &Inventory,
    layouts: &Layouts,
    keep: &BTreeMap<WorkerKey, (u32, Option<String>)>,
) -> Placement {
    let mut rooms = rooms(desired, inventory, layouts);
    let mut out = Placement::default();
    let mut pending = Vec::new();
    for model in &desired.models {
        for replica in 0..model.replicas {
            let key = WorkerKey { model: model.name.clone(), replica };
            let kept = keep.get(&key).and_then(|(gpu, instance)| {
                rooms.keys().find(|k| k.gpu == *gpu && k.instance_label() == *instance).cloned()
            });
            match kept.filter(|room| allowed(model, inventory, room.gpu) && rooms[room].fits(room, model)) {
                Some(room_key) => {
                    let room = rooms.get_mut(&room_key).expect("found above");
                    let isolation = tier(&room_key, room, model.isolation).expect("fits");
                    room.take(model, isolation);
                    out.assignments.push(assignment(key, &room_key, isolation));
                }
                None => pending.push((model, key)),
            }
        }
    }
    for (model, key) in pending {
        let candidates: Vec<&RoomKey> = rooms
            .iter()
            .filter(|(k, r)| allowed(model, inventory, k.gpu) && tier(k, r, model.isolation).is_some())
            .map(|(k, _)| k)
            .collect();
        let best = candidates
            .iter()
            .filter(|k| rooms[**k].fits(k, model))
            .min_by_key(|k| preference(k, &rooms[**k], model))
            .map(|k| (*k).clone());
        match best {
            Some(room_key) => {
                let room = rooms.get_mut(&room_key).expect("candidate exists");
                let isolation = tier(&room_key, room, model.isolation).expect("fits");
                room.take(model, isolation);
                out.assignments.push(assignment(key, &room_key, isolation));
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

fn assignment(key: WorkerKey, room: &RoomKey, isolation: Isolation) -> Assignment {
    Assignment {
        key,
        gpu: room.gpu,
        isolation,
        instance: room.instance_label(),
        mps_daemon: (isolation == Isolation::Mps).then(|| room.daemon_name()),
    }
}

fn allowed(model: &Model, inventory: &Inventory, gpu: u32) -> bool {
    match &model.gpu {
        None => true,
        Some(GpuRef::Index(i)) => *i == gpu,
        Some(GpuRef::Uuid(u)) => inventory.gpu(gpu).is_some_and(|g| &g.uuid == u),
    }
}

fn why_unplaced(model: &Model, candidates: &[&RoomKey], rooms: &BTreeMap<RoomKey, Room>) -> String {
    if candidates.is_empty() {
        return "no device in the plan can host its isolation tier".to_string();
    }
    let states: Vec<String> = candidates
        .iter()
        .map(|key| {
            let room = &rooms[*key];
            if let Some(conflict) = room.mps_conflict(model) {
                format!("{} {conflict}", key.label())
            } else if room.closed {
                format!("{} already runs a worker alone", key.label())
            } else if model.isolation == Isolation::Mig || room.sharing == Sharing::Exclusive {
                if room.workers > 0 {
                    format!("{} is in use", key.label())
                } else {
                    format!("{} holds {}", key.label(), human_mib(room.total_mib))
                }
            } else {
                format!("{} has {} free", key.label(), human_mib(room.free_mib))
            }
        })
        .collect();
    format!("needs {}; {}", human_mib(model.memory_mib), states.join(", "))
}
