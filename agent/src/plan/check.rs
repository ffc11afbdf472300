//! Checks of a parsed plan against the live inventory and the host: selectors that match no GPU,
//! profiles the product lacks, budgets no device can hold, missing programs and users. The result
//! is the resolved desired state the reconciler works from.

use super::parse::Spans;
use super::units::human_mib;
use super::*;
use crate::inventory::{Gpu, Inventory};
use crate::mig::{Want, plan_layout};
use crate::settings::WorkerPolicy;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The desired state of the GPUs a plan manages, keyed by GPU index.
#[derive(Debug, Clone, Default)]
pub struct Desired {
    pub gpus: BTreeMap<u32, DesiredGpu>,
    pub models: Vec<Model>,
    /// Replicas with no room may stay unplaced (not running) instead of refusing the plan: while
    /// GPUs are drained, the plan's full size may not fit.
    pub tolerate_unplaced: bool,
    /// Start workers that are held down (stopped by the operator, given up after a crash loop,
    /// stopped over budget). Only an operator's own `apply -f` asks for that; an apply made for
    /// something else (agent start, partition, drain) leaves them as they are.
    pub start_held: bool,
}

#[derive(Debug, Clone)]
pub struct DesiredGpu {
    /// Index of the `[[gpus]]` entry that selects this GPU.
    pub entry: usize,
    pub sharing: Sharing,
    pub mig: Vec<MigInstance>,
    pub mps: Option<MpsDefaults>,
    pub timeslice: Option<Timeslice>,
}

/// Sharing modes this version of the agent can apply. The plan format knows them all, so a plan
/// written for a later version is read and checked fully, then refused with a clear reason.
const APPLICABLE: &[Sharing] = &[Sharing::Exclusive, Sharing::TimeSlicing, Sharing::Mig, Sharing::Mps];

pub fn check(plan: &Plan, spans: &Spans, inventory: &Inventory, policy: &WorkerPolicy) -> (Desired, Vec<Problem>) {
    let mut problems = Vec::new();
    let gpus = check_gpus(plan, spans, inventory, &mut problems);
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for model in &plan.models {
        let at = |key: &str| format!("models[{}].{key}", model.index);
        if !model.name.is_empty() {
            if let Some(first) = names.get(model.name.as_str()) {
                problems.push(
                    spans.problem(&at("name"), format!("duplicate model name {:?} (also models[{first}])", model.name)),
                );
            } else {
                names.insert(&model.name, model.index);
            }
        }
        check_model(model, spans, inventory, &gpus, plan.gpus_incomplete, policy, &mut problems);
    }
    // `select = "all"` over identical GPUs would say the same thing once per GPU.
    let mut seen = std::collections::BTreeSet::new();
    problems.retain(|p| seen.insert((p.path.clone(), p.message.clone())));
    (Desired { gpus, models: plan.models.clone(), tolerate_unplaced: false, start_held: true }, problems)
}

fn check_gpus(
    plan: &Plan,
    spans: &Spans,
    inventory: &Inventory,
    problems: &mut Vec<Problem>,
) -> BTreeMap<u32, DesiredGpu> {
    let mut out: BTreeMap<u32, DesiredGpu> = BTreeMap::new();
    let host_range = match inventory.gpus.len() {
        0 => "this host has no GPUs".to_string(),
        1 => "this host has GPU 0 only".to_string(),
        n => format!("this host has GPUs 0-{}", n - 1),
    };
    for entry in &plan.gpus {
        let select_path = format!("gpus[{}].select", entry.index);
        let selected: Vec<&Gpu> = match &entry.select {
            Selector::All => inventory.gpus.iter().collect(),
            Selector::Uuid(uuid) => match inventory.gpu_by_uuid(uuid) {
                Some(gpu) => vec![gpu],
                None => {
                    problems.push(spans.problem(&select_path, format!("no GPU has UUID {uuid}")));
                    continue;
                }
            },
            Selector::Indices(indices) => {
                for u in inventory.unavailable.iter().filter(|u| indices.contains(&u.index)) {
                    problems.push(spans.problem(&select_path, format!("GPU {} is unavailable: {}", u.index, u.error)));
                }
                let missing: Vec<String> = indices
                    .iter()
                    .filter(|i| inventory.gpu(**i).is_none() && !inventory.unavailable.iter().any(|u| u.index == **i))
                    .map(u32::to_string)
                    .collect();
                if !missing.is_empty() {
                    let what = if missing.len() == 1 { "GPU {} does not exist" } else { "GPUs {} do not exist" };
                    let what = what.replace("{}", &missing.join(", "));
                    problems.push(spans.problem(&select_path, format!("{what}: {host_range}")));
                    continue;
                }
                indices.iter().filter_map(|i| inventory.gpu(*i)).collect()
            }
        };
        if selected.is_empty() {
            problems.push(spans.problem(&select_path, format!("selects no GPU: {host_range}")));
        }
        let sharing_path = format!("gpus[{}].sharing", entry.index);
        if !APPLICABLE.contains(&entry.sharing) {
            problems.push(spans.problem(
                &sharing_path,
                format!(
                    "sharing = {:?} is valid plan syntax, but this agent version applies only {}",
                    entry.sharing.as_str(),
                    APPLICABLE.iter().map(|s| format!("{:?}", s.as_str())).collect::<Vec<_>>().join(" and ")
                ),
            ));
        }
        if entry.timeslice.is_some() {
            problems.push(spans.problem(
                &format!("gpus[{}].timeslice", entry.index),
                "setting the time-slice length is not available in this agent version: remove timeslice to leave it as it is",
            ));
        }
        for gpu in &selected {
            if entry.sharing == Sharing::Mig && !entry.mig_broken {
                if gpu.profiles.is_empty() {
                    problems.push(
                        spans.problem(&sharing_path, format!("GPU {} ({}) does not support MIG", gpu.index, gpu.name)),
                    );
                } else {
                    let wants: Vec<Want> =
                        entry.mig.iter().map(|m| Want { profile: m.profile.clone(), start: m.start }).collect();
                    // The product's name only, so identical GPUs give identical (deduplicated) problems.
                    let name = gpu.name.clone();
                    if let Err(errors) = plan_layout(&name, &gpu.profiles, &gpu.instances, &wants) {
                        for e in errors {
                            let path = match e.want {
                                Some(w) => format!("gpus[{}].mig[{w}]", entry.index),
                                None => format!("gpus[{}].mig", entry.index),
                            };
                            problems.push(spans.problem(&path, e.message));
                        }
                    }
                }
            }
            if let Some(previous) = out.get(&gpu.index) {
                problems.push(spans.problem(
                    &select_path,
                    format!("GPU {} is already selected by gpus[{}]", gpu.index, previous.entry),
                ));
                continue;
            }
            out.insert(
                gpu.index,
                DesiredGpu {
                    entry: entry.index,
                    sharing: entry.sharing,
                    mig: entry.mig.clone(),
                    mps: entry.mps,
                    timeslice: entry.timeslice,
                },
            );
        }
    }
    out
}

/// Which GPU sharing modes can host a worker of this isolation tier. A `mig` GPU hosts `mig`
/// workers (an instance each), `time-slicing` ones (sharing an instance) and `mps` ones (in an
/// instance with `sharing = "mps"`; placement checks that one exists).
pub fn hosts(isolation: Isolation, sharing: Sharing) -> bool {
    match isolation {
        Isolation::Exclusive => sharing == Sharing::Exclusive,
        Isolation::TimeSlicing => matches!(sharing, Sharing::TimeSlicing | Sharing::Mig),
        Isolation::Mps => matches!(sharing, Sharing::Mps | Sharing::Mig),
        Isolation::Mig => sharing == Sharing::Mig,
        Isolation::Auto => true,
    }
}

/// The most memory one worker of this tier could get on this GPU.
fn capacity_mib(gpu: &Gpu, desired: &DesiredGpu, isolation: Isolation) -> u64 {
    if desired.sharing == Sharing::Mig || isolation == Isolation::Mig {
        gpu.profiles
            .iter()
            .filter(|p| desired.mig.iter().any(|m| m.profile == p.name))
            .map(|p| p.memory_mib)
            .max()
            .unwrap_or(0)
    } else {
        gpu.memory_total_mib
    }
}

fn check_model(
    model: &Model,
    spans: &Spans,
    inventory: &Inventory,
    gpus: &BTreeMap<u32, DesiredGpu>,
    gpus_incomplete: bool,
    policy: &WorkerPolicy,
    problems: &mut Vec<Problem>,
) {
    let broken = |key: &str| model.broken.contains(key);
    let at = |key: &str| format!("models[{}].{key}", model.index);
    // Where the model could run: its pinned GPU, or every managed GPU whose sharing hosts its tier.
    let mut candidates: Vec<(&Gpu, &DesiredGpu)> = Vec::new();
    // Where the model can run is unknowable when its tier, its pin or a GPU entry is unreadable.
    let placeable = !gpus_incomplete && !broken("isolation") && !broken("gpu");
    match &model.gpu {
        _ if !placeable => {}
        Some(pin) => {
            let found = match pin {
                GpuRef::Index(i) => inventory.gpu(*i),
                GpuRef::Uuid(u) => inventory.gpu_by_uuid(u),
            };
            let label = match pin {
                GpuRef::Index(i) => format!("GPU {i}"),
                GpuRef::Uuid(u) => u.clone(),
            };
            match found {
                None => problems.push(spans.problem(&at("gpu"), format!("{label} does not exist on this host"))),
                Some(gpu) => match gpus.get(&gpu.index) {
                    None => problems.push(spans.problem(
                        &at("gpu"),
                        format!(
                            "GPU {} is not selected by any [[gpus]] entry, so the plan does not say how to share it",
                            gpu.index
                        ),
                    )),
                    Some(d) if !hosts(model.isolation, d.sharing) => problems.push(spans.problem(
                        &at("isolation"),
                        format!(
                            "isolation {:?} cannot run on GPU {}, which gpus[{}] shares as {:?}",
                            model.isolation.as_str(),
                            gpu.index,
                            d.entry,
                            d.sharing.as_str()
                        ),
                    )),
                    Some(d) => candidates.push((gpu, d)),
                },
            }
        }
        None => {
            candidates = gpus
                .iter()
                .filter(|(_, d)| hosts(model.isolation, d.sharing))
                .filter_map(|(i, d)| inventory.gpu(*i).map(|g| (g, d)))
                .collect();
            if candidates.is_empty() && model.replicas > 0 && !broken("replicas") {
                let need = match model.isolation {
                    Isolation::Auto => "a GPU selected by a [[gpus]] entry".to_string(),
                    other => format!(
                        "a GPU with sharing = {:?}",
                        match other {
                            Isolation::TimeSlicing => "time-slicing",
                            Isolation::Mps => "mps",
                            Isolation::Mig => "mig",
                            _ => "exclusive",
                        }
                    ),
                };
                problems.push(spans.problem(
                    &at("isolation"),
                    format!("isolation {:?} needs {need}, and this plan has none", model.isolation.as_str()),
                ));
            }
        }
    }
    if let Some((gpu, desired)) =
        candidates.iter().filter(|_| !broken("memory")).max_by_key(|(g, d)| capacity_mib(g, d, model.isolation))
    {
        let largest = capacity_mib(gpu, desired, model.isolation);
        if model.memory_mib > largest {
            problems.push(spans.problem(
                &at("memory"),
                format!(
                    "{} is more than any device this model can use holds (largest: {} on GPU {}, {})",
                    human_mib(model.memory_mib),
                    human_mib(largest),
                    gpu.index,
                    gpu.name
                ),
            ));
        }
    }
    if model.compute.is_some() && !broken("isolation") && !matches!(model.isolation, Isolation::Mps | Isolation::Auto) {
        problems.push(spans.problem(
            &at("compute"),
            format!(
                "compute caps an MPS client's share of SMs; it has no effect with isolation {:?}",
                model.isolation.as_str()
            ),
        ));
    }
    let identity =
        if broken("user") { None } else { check_user(model.user.as_deref(), &at("user"), spans, policy, problems) };
    if let Some(id) = &identity {
        if let Some(program) = model.command.first() {
            check_access(Path::new(program), Access::Execute, id, &at("command[0]"), spans, problems);
        }
        if let Some(dir) = &model.working_dir {
            check_access(dir, Access::Enter, id, &at("working_dir"), spans, problems);
        }
    }
}

/// Who a worker would run as: what file permissions are checked against.
pub struct Identity {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

#[derive(Clone, Copy, PartialEq)]
enum Access {
    /// A program: a regular file the user may execute.
    Execute,
    /// A working directory: a directory the user may enter.
    Enter,
}

/// Whether `id` has permission `bit` (0o4 read, 0o1 execute/search) on a file with this metadata.
fn permits(meta: &std::fs::Metadata, id: &Identity, bit: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let mode = meta.mode();
    if id.uid == 0 {
        // Root may search any directory and execute a file with any execute bit set.
        return meta.is_dir() || mode & 0o111 != 0;
    }
    let shift = if meta.uid() == id.uid {
        6
    } else if meta.gid() == id.gid || id.groups.contains(&meta.gid()) {
        3
    } else {
        0
    };
    mode & (bit << shift) != 0
}

/// Checks that `id` can reach `target` (search permission on every directory above it) and
/// execute it or enter it, as the worker will have to.
fn check_access(target: &Path, access: Access, id: &Identity, path: &str, spans: &Spans, problems: &mut Vec<Problem>) {
    let shown = target.display();
    let meta = match std::fs::metadata(target) {
        Ok(m) => m,
        Err(e) => return problems.push(spans.problem(path, format!("{shown}: {e}"))),
    };
    let kind_ok = match access {
        Access::Execute => meta.is_file(),
        Access::Enter => meta.is_dir(),
    };
    if !kind_ok {
        let want = if access == Access::Execute { "a file" } else { "a directory" };
        return problems.push(spans.problem(path, format!("{shown} is not {want}")));
    }
    for dir in target.ancestors().skip(1) {
        if let Ok(m) = std::fs::metadata(dir)
            && !permits(&m, id, 0o1)
        {
            return problems.push(spans.problem(
                path,
                format!("user {} cannot reach {shown}: no search permission on {}", id.name, dir.display()),
            ));
        }
    }
    if meta.permissions().mode() & 0o111 == 0 && access == Access::Execute {
        return problems.push(spans.problem(path, format!("{shown} is not executable")));
    }
    if !permits(&meta, id, 0o1) {
        let verb = if access == Access::Execute { "execute" } else { "enter" };
        problems.push(spans.problem(path, format!("user {} may not {verb} {shown}", id.name)));
    }
}

/// Resolves the worker's run-as user (the model's, or the agent's default) and checks the agent
/// may run workers as it. None when the user is unusable (a problem says why).
fn check_user(
    user: Option<&str>,
    path: &str,
    spans: &Spans,
    policy: &WorkerPolicy,
    problems: &mut Vec<Problem>,
) -> Option<Identity> {
    let euid = nix::unistd::geteuid();
    let Some(name) = user.or(policy.default_user.as_deref()) else {
        // No user at all: the worker runs as the agent itself.
        let groups = nix::unistd::getgroups().unwrap_or_default().iter().map(|g| g.as_raw()).collect();
        let name = nix::unistd::User::from_uid(euid).ok().flatten().map(|u| u.name).unwrap_or_else(|| euid.to_string());
        return Some(Identity { name, uid: euid.as_raw(), gid: nix::unistd::getegid().as_raw(), groups });
    };
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) => {
            if u.uid.is_root() && !policy.allow_root {
                problems.push(spans.problem(path, format!("{name} is root: workers run as root only when the agent's settings say allow_root_workers = true")));
                return None;
            }
            if !euid.is_root() && u.uid != euid {
                problems.push(spans.problem(
                    path,
                    format!("the agent runs as uid {euid}, not root, so it cannot run workers as {name}"),
                ));
                return None;
            }
            let cname = std::ffi::CString::new(name).ok()?;
            let groups =
                nix::unistd::getgrouplist(&cname, u.gid).unwrap_or_default().iter().map(|g| g.as_raw()).collect();
            Some(Identity { name: name.to_string(), uid: u.uid.as_raw(), gid: u.gid.as_raw(), groups })
        }
        Ok(None) => {
            let origin = if user.is_some() { "" } else { " (the agent's default_user)" };
            problems.push(spans.problem(path, format!("user {name:?}{origin} does not exist on this host")));
            None
        }
        Err(e) => {
            problems.push(spans.problem(path, format!("cannot look up user {name:?}: {e}")));
            None
        }
    }
}
