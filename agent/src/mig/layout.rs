//! Placing a wanted MIG layout on one GPU.
//!
//! The search is exhaustive (a GPU has at most 8 memory slices and 7 instances, so it is cheap)
//! and deterministic. Among the layouts that place every wanted instance it picks, in order:
//! 1. the one that keeps the most existing instances where they are (fewest destroys);
//! 2. the one whose free slices can still take the largest profiles (no stranded 3g or 4g space);
//! 3. the lowest starts.

use crate::inventory::{GpuInstance, Profile};
use std::collections::BTreeMap;

/// One wanted instance: a profile name and, optionally, where it must start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    pub profile: String,
    pub start: Option<u32>,
}

/// One instance of the resulting layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// Index into the wanted list.
    pub want: usize,
    pub profile_id: u32,
    pub profile: String,
    pub start: u32,
    pub size: u32,
    pub memory_mib: u64,
    /// The GPU instance id when an existing instance is kept.
    pub existing: Option<u32>,
}

/// What is wrong with a wanted layout. `want` indexes the wanted list when one entry is at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutError {
    pub want: Option<usize>,
    pub message: String,
}

struct Item<'p> {
    want: usize,
    profile: &'p Profile,
    start: Option<u32>,
}

/// Compute slices of the GPU: the full-width profile's (7, or 4 on an A30).
fn compute_slices(profiles: &[Profile]) -> u32 {
    profiles.iter().map(|p| p.slices).max().unwrap_or(0)
}

fn mask(start: u32, size: u32) -> u32 {
    ((1u32 << size) - 1) << start
}

fn is_media(p: &Profile) -> bool {
    p.name.ends_with("+me")
}

/// Checks `wants` against the GPU's `profiles` and places them, keeping `existing` instances
/// where it can. Every problem is reported; on success the layout is sorted by start.
pub fn plan_layout(
    gpu_name: &str,
    profiles: &[Profile],
    existing: &[GpuInstance],
    wants: &[Want],
) -> Result<Vec<Planned>, Vec<LayoutError>> {
    let mut errors = Vec::new();
    let mut items = Vec::new();
    for (i, w) in wants.iter().enumerate() {
        match profiles.iter().find(|p| p.name == w.profile) {
            None => {
                let known: Vec<&str> = profiles.iter().map(|p| p.name.as_str()).collect();
                let known = if known.is_empty() {
                    "it has no MIG profiles".into()
                } else {
                    format!("its profiles: {}", known.join(", "))
                };
                errors.push(LayoutError {
                    want: Some(i),
                    message: format!("profile {:?} does not exist on {gpu_name}; {known}", w.profile),
                });
            }
            Some(profile) => {
                if let Some(start) = w.start
                    && !profile.placements.iter().any(|p| p.start == start)
                {
                    let starts: Vec<String> = profile.placements.iter().map(|p| p.start.to_string()).collect();
                    errors.push(LayoutError {
                        want: Some(i),
                        message: format!(
                            "{}@{start} is not a valid placement: {} starts at {}",
                            w.profile,
                            w.profile,
                            starts.join(", ")
                        ),
                    });
                    continue;
                }
                items.push(Item { want: i, profile, start: w.start });
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for item in &items {
        *counts.entry(&item.profile.name).or_default() += 1;
    }
    let suggestion = || suggest(profiles, &items);
    let media: Vec<&str> = counts.iter().filter(|(n, _)| n.ends_with("+me")).map(|(n, _)| *n).collect();
    let media_count: usize = items.iter().filter(|i| is_media(i.profile)).count();
    if media_count > 1 {
        errors.push(LayoutError {
            want: None,
            message: format!(
                "{} asks for {media_count} media-extension (+me) instances, but a GPU has one media extension; {}",
                media.join(" and "),
                suggestion()
            ),
        });
    }
    for (name, count) in &counts {
        let profile = profiles.iter().find(|p| p.name == *name).expect("resolved above");
        if *count as u32 > profile.max && !(is_media(profile) && media_count > 1) {
            errors.push(LayoutError {
                want: None,
                message: format!(
                    "{count} x {name} requested, but {gpu_name} takes at most {}; {}",
                    profile.max,
                    suggestion()
                ),
            });
        }
    }
    let explicit: Vec<&Item> = items.iter().filter(|i| i.start.is_some()).collect();
    for (a, x) in explicit.iter().enumerate() {
        for y in &explicit[a + 1..] {
            let (xs, ys) = (x.start.unwrap_or(0), y.start.unwrap_or(0));
            if mask(xs, x.profile.placements[0].size) & mask(ys, y.profile.placements[0].size) != 0 {
                errors.push(LayoutError {
                    want: Some(y.want),
                    message: format!("{}@{ys} overlaps {}@{xs}", y.profile.name, x.profile.name,),
                });
            }
        }
    }
    let slices: u32 = items.iter().map(|i| i.profile.slices).sum();
    if slices > compute_slices(profiles) {
        errors.push(LayoutError {
            want: None,
            message: format!(
                "the layout needs {slices} compute slices and {gpu_name} has {}; {}",
                compute_slices(profiles),
                suggestion()
            ),
        });
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    match search(profiles, existing, &items) {
        Some(layout) => Ok(layout),
        None => {
            let names: Vec<String> = wants.iter().map(want_text).collect();
            Err(vec![LayoutError {
                want: None,
                message: format!("{} cannot be placed together on {gpu_name}; {}", names.join(" "), suggestion()),
            }])
        }
    }
}

fn want_text(w: &Want) -> String {
    match w.start {
        Some(s) => format!("{}@{s}", w.profile),
        None => w.profile.clone(),
    }
}

/// "a layout that fits: ...": the wanted instances, largest first, each kept if the set still places.
fn suggest(profiles: &[Profile], items: &[Item]) -> String {
    let mut order: Vec<&Item> = items.iter().collect();
    order.sort_by_key(|i| {
        (std::cmp::Reverse(i.profile.placements[0].size), std::cmp::Reverse(i.profile.slices), i.want)
    });
    let mut chosen: Vec<Item> = Vec::new();
    for item in order {
        let mut trial: Vec<Item> =
            chosen.iter().map(|c| Item { want: c.want, profile: c.profile, start: c.start }).collect();
        trial.push(Item { want: item.want, profile: item.profile, start: item.start });
        let media = trial.iter().filter(|i| is_media(i.profile)).count();
        let over_max = trial.iter().filter(|i| i.profile.name == item.profile.name).count() as u32 > item.profile.max;
        let slices: u32 = trial.iter().map(|i| i.profile.slices).sum();
        if media <= 1 && !over_max && slices <= compute_slices(profiles) && search(profiles, &[], &trial).is_some() {
            chosen = trial;
        }
    }
    if chosen.is_empty() {
        return "no subset of it fits".to_string();
    }
    chosen.sort_by_key(|i| i.want);
    let names: Vec<String> =
        chosen.iter().map(|i| want_text(&Want { profile: i.profile.name.clone(), start: i.start })).collect();
    format!("a layout that fits: {}", names.join(" "))
}

/// Score of a finished layout; larger is better.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Score {
    kept: usize,
    room: Vec<u32>,
    /// Lower starts are better, so they are stored negated through `Reverse`.
    starts: std::cmp::Reverse<Vec<u32>>,
}

/// How many more of each profile (largest first) could still be added to a free mask.
fn room(profiles: &[Profile], used: u32, slices_left: u32, counts: &BTreeMap<u32, u32>) -> Vec<u32> {
    let mut order: Vec<&Profile> = profiles.iter().collect();
    order.sort_by_key(|p| {
        (std::cmp::Reverse(p.placements.first().map(|pl| pl.size).unwrap_or(0)), std::cmp::Reverse(p.slices), p.id)
    });
    order
        .iter()
        .map(|p| {
            // Greedy from the lowest start: how many copies fit on their own.
            let (mut mask_used, mut left, mut n) = (used, slices_left, 0u32);
            let room_for = p.max.saturating_sub(counts.get(&p.id).copied().unwrap_or(0));
            for pl in &p.placements {
                let m = mask(pl.start, pl.size);
                if n < room_for && mask_used & m == 0 && left >= p.slices {
                    mask_used |= m;
                    left -= p.slices;
                    n += 1;
                }
            }
            n
        })
        .collect()
}

/// The exhaustive search: every placement of every item, largest first.
struct Search<'a, 'p> {
    order: Vec<&'a Item<'p>>,
    profiles: &'a [Profile],
    existing: &'a [GpuInstance],
    total_slices: u32,
    starts: Vec<u32>,
    best: Option<(Score, Vec<u32>)>,
}

impl Search<'_, '_> {
    fn score(&self, used: u32) -> Score {
        let kept = self
            .order
            .iter()
            .zip(self.starts.iter())
            .filter(|(i, s)| self.existing.iter().any(|e| e.profile_id == i.profile.id && e.start == **s))
            .count();
        let slices: u32 = self.order.iter().map(|i| i.profile.slices).sum();
        let mut counts = BTreeMap::new();
        for i in &self.order {
            *counts.entry(i.profile.id).or_insert(0) += 1;
        }
        let mut by_want: Vec<(usize, u32)> =
            self.order.iter().zip(self.starts.iter()).map(|(i, s)| (i.want, *s)).collect();
        by_want.sort();
        Score {
            kept,
            room: room(self.profiles, used, self.total_slices.saturating_sub(slices), &counts),
            starts: std::cmp::Reverse(by_want.iter().map(|(_, s)| *s).collect()),
        }
    }

    fn go(&mut self, k: usize, used: u32) {
        if k == self.order.len() {
            let score = self.score(used);
            if self.best.as_ref().is_none_or(|(b, _)| score > *b) {
                self.best = Some((score, self.starts.clone()));
            }
            return;
        }
        let item = self.order[k];
        // Identical profiles without a start go in increasing start order: no symmetric repeats.
        let prev = k.checked_sub(1).map(|p| self.order[p]);
        let floor = prev
            .filter(|p| p.profile.id == item.profile.id && item.start.is_none() && p.start.is_none())
            .map(|_| self.starts[k - 1]);
        for pl in &item.profile.placements {
            if item.start.is_some_and(|s| s != pl.start) || floor.is_some_and(|f| pl.start <= f) {
                continue;
            }
            let m = mask(pl.start, pl.size);
            if used & m == 0 {
                self.starts[k] = pl.start;
                self.go(k + 1, used | m);
            }
        }
    }
}

fn search(profiles: &[Profile], existing: &[GpuInstance], items: &[Item]) -> Option<Vec<Planned>> {
    let mut order: Vec<&Item> = items.iter().collect();
    order.sort_by_key(|i| (std::cmp::Reverse(i.profile.placements[0].size), i.profile.id, i.start.is_none(), i.want));
    let n = order.len();
    let mut search =
        Search { order, profiles, existing, total_slices: compute_slices(profiles), starts: vec![0; n], best: None };
    search.go(0, 0);
    let (_, starts) = search.best?;
    let mut taken: Vec<u32> = Vec::new();
    let mut out: Vec<Planned> = search
        .order
        .iter()
        .zip(starts)
        .map(|(item, start)| {
            let existing = existing
                .iter()
                .find(|e| e.profile_id == item.profile.id && e.start == start && !taken.contains(&e.id))
                .map(|e| e.id);
            taken.extend(existing);
            Planned {
                want: item.want,
                profile_id: item.profile.id,
                profile: item.profile.name.clone(),
                start,
                size: item.profile.placements[0].size,
                memory_mib: item.profile.memory_mib,
                existing,
            }
        })
        .collect();
    out.sort_by_key(|p| p.start);
    Some(out)
}

#[cfg(test)]
mod tests;
