//! The schema walk: TOML text to a [`Plan`], collecting every problem with its key path and line.
//! Checks that need the host (GPUs, users, files) live in [`super::check`].

use super::tree::{self, Kind, Lines, Node};
use super::units::{mib, parse_duration, parse_size};
use super::*;
use std::collections::HashMap;
use std::ops::Range;

/// The result of reading a plan: what could be read, and every problem found on the way.
/// Entries with problems are left out of `plan`, so later checks do not pile up on them.
pub struct Parsed {
    pub plan: Plan,
    pub problems: Vec<Problem>,
    /// Where each key path sits in the text, for problems found after parsing.
    pub spans: Spans,
}

/// Key path to location, so checks made after parsing still name a line.
pub struct Spans {
    lines: Lines,
    by_path: HashMap<String, Range<usize>>,
}

impl Spans {
    /// Builds a problem at `path`, located at the path itself or its nearest parent.
    pub fn problem(&self, path: &str, message: impl Into<String>) -> Problem {
        let mut key = path;
        let span = loop {
            if let Some(span) = self.by_path.get(key) {
                break Some(span);
            }
            match key.rfind(['.', '[']) {
                Some(i) => key = &key[..i],
                None => break None,
            }
        };
        let (line, column) = span.map(|s| self.lines.locate(s.start)).unwrap_or((0, 0));
        Problem { path: path.to_string(), line, column, message: message.into() }
    }
}

fn index_spans(node: &Node, path: &str, out: &mut HashMap<String, Range<usize>>) {
    out.insert(path.to_string(), node.span.clone());
    match &node.kind {
        Kind::Table(entries) => {
            for (key, child) in entries {
                let p = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                index_spans(child, &p, out);
            }
        }
        Kind::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                index_spans(child, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

pub fn parse(text: &str) -> Parsed {
    let mut ctx = Ctx { lines: Lines::new(text), problems: Vec::new() };
    let mut by_path = HashMap::new();
    let plan = match toml_edit::Document::parse(text) {
        Ok(doc) => {
            let root = tree::from_table(doc.as_table(), 0..0);
            index_spans(&root, "", &mut by_path);
            read_plan(&mut ctx, &root)
        }
        Err(e) => {
            let span = e.span().unwrap_or(0..0);
            let message = format!("not valid TOML: {}", e.message());
            ctx.error("", &span, message);
            Plan::default()
        }
    };
    Parsed { plan, problems: ctx.problems, spans: Spans { lines: ctx.lines, by_path } }
}

pub(super) struct Ctx {
    pub lines: Lines,
    pub problems: Vec<Problem>,
}

impl Ctx {
    pub fn error(&mut self, path: &str, span: &Range<usize>, message: impl Into<String>) {
        let (line, column) =
            if span.is_empty() && span.start == 0 && path.is_empty() { (0, 0) } else { self.lines.locate(span.start) };
        self.problems.push(Problem { path: path.to_string(), line, column, message: message.into() });
    }
}

/// The keys of one table, handed out one at a time; whatever is left is an unknown key.
struct Fields<'n> {
    path: String,
    entries: &'n [(String, Node)],
    taken: Vec<bool>,
}

impl<'n> Fields<'n> {
    fn of(ctx: &mut Ctx, path: &str, node: &'n Node) -> Option<Self> {
        match &node.kind {
            Kind::Table(entries) => Some(Fields { path: path.to_string(), entries, taken: vec![false; entries.len()] }),
            _ => {
                ctx.error(path, &node.span, format!("must be a table, not {}", node.type_name()));
                None
            }
        }
    }

    fn path(&self, key: &str) -> String {
        if self.path.is_empty() { key.to_string() } else { format!("{}.{key}", self.path) }
    }

    fn take(&mut self, key: &str) -> Option<(String, &'n Node)> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        self.taken[i] = true;
        Some((self.path(key), &self.entries[i].1))
    }

    fn required(&mut self, ctx: &mut Ctx, key: &str, span: &Range<usize>, hint: &str) -> Option<(String, &'n Node)> {
        let found = self.take(key);
        if found.is_none() {
            let path = self.path(key);
            ctx.error(&path, span, format!("{key} is required{hint}"));
        }
        found
    }

    fn finish(self, ctx: &mut Ctx, known: &[&str]) -> bool {
        let mut clean = true;
        for ((key, node), taken) in self.entries.iter().zip(&self.taken) {
            if !taken {
                clean = false;
                let path = if self.path.is_empty() { key.clone() } else { format!("{}.{key}", self.path) };
                ctx.error(&path, &node.span, format!("unknown key {key:?} (expected one of: {})", known.join(", ")));
            }
        }
        clean
    }
}

fn string(ctx: &mut Ctx, path: &str, node: &Node) -> Option<String> {
    match &node.kind {
        Kind::Str(s) => Some(s.clone()),
        _ => {
            ctx.error(path, &node.span, format!("must be a string, not {}", node.type_name()));
            None
        }
    }
}

fn integer(ctx: &mut Ctx, path: &str, node: &Node, range: std::ops::RangeInclusive<i64>) -> Option<i64> {
    match &node.kind {
        Kind::Int(i) if range.contains(i) => Some(*i),
        Kind::Int(i) => {
            ctx.error(
                path,
                &node.span,
                format!("{i} is out of range: must be from {} to {}", range.start(), range.end()),
            );
            None
        }
        _ => {
            ctx.error(path, &node.span, format!("must be an integer, not {}", node.type_name()));
            None
        }
    }
}

fn one_of<T>(ctx: &mut Ctx, path: &str, node: &Node, names: &[&str], parse: impl Fn(&str) -> Option<T>) -> Option<T> {
    let s = string(ctx, path, node)?;
    let parsed = parse(&s);
    if parsed.is_none() {
        ctx.error(path, &node.span, format!("{s:?} is not one of: {}", names.join(", ")));
    }
    parsed
}

fn size(ctx: &mut Ctx, path: &str, node: &Node) -> Option<u64> {
    let s = match &node.kind {
        Kind::Str(s) => s,
        Kind::Int(_) | Kind::Float(_) => {
            ctx.error(
                path,
                &node.span,
                "must be a size string with a unit, e.g. \"6GiB\" (a bare number is ambiguous)",
            );
            return None;
        }
        _ => {
            ctx.error(path, &node.span, format!("must be a size string, e.g. \"6GiB\", not {}", node.type_name()));
            return None;
        }
    };
    parse_size(s).map_err(|e| ctx.error(path, &node.span, e)).ok()
}

fn duration(ctx: &mut Ctx, path: &str, node: &Node) -> Option<Duration> {
    let s = string(ctx, path, node)?;
    parse_duration(&s).map_err(|e| ctx.error(path, &node.span, e)).ok()
}

fn tables<'n>(ctx: &mut Ctx, path: &str, node: &'n Node, hint: &str) -> Vec<(String, &'n Node)> {
    match &node.kind {
        Kind::Array(items) => items.iter().enumerate().map(|(i, n)| (format!("{path}[{i}]"), n)).collect(),
        _ => {
            ctx.error(path, &node.span, format!("must be an array of tables ({hint}), not {}", node.type_name()));
            Vec::new()
        }
    }
}

const PLAN_KEYS: &[&str] = &["version", "gpus", "models"];

fn read_plan(ctx: &mut Ctx, root: &Node) -> Plan {
    let mut plan = Plan::default();
    let Some(mut fields) = Fields::of(ctx, "", root) else { return plan };
    match fields.take("version") {
        Some((path, node)) => {
            if let Some(v) = integer(ctx, &path, node, i64::MIN..=i64::MAX)
                && v != 1
            {
                ctx.error(&path, &node.span, format!("version {v} is not supported: this agent reads version = 1"));
            }
        }
        None => ctx.error("version", &(0..0), "version is required: start the plan with version = 1"),
    }
    if let Some((path, node)) = fields.take("gpus") {
        for (i, (path, node)) in tables(ctx, &path, node, "[[gpus]]").into_iter().enumerate() {
            match read_gpu_entry(ctx, &path, node, i) {
                Some(entry) => plan.gpus.push(entry),
                None => plan.gpus_incomplete = true,
            }
        }
    }
    if let Some((path, node)) = fields.take("models") {
        for (i, (path, node)) in tables(ctx, &path, node, "[[models]]").into_iter().enumerate() {
            if let Some(model) = read_model(ctx, &path, node, i) {
                plan.models.push(model);
            }
        }
    }
    fields.finish(ctx, PLAN_KEYS);
    plan
}

const GPU_KEYS: &[&str] = &["select", "sharing", "mig", "mps", "timeslice"];

fn read_gpu_entry(ctx: &mut Ctx, path: &str, node: &Node, index: usize) -> Option<GpuEntry> {
    let before = ctx.problems.len();
    let mut f = Fields::of(ctx, path, node)?;
    let select = f
        .required(ctx, "select", &node.span, ": an index, a list \"0,2\", a range \"4-7\", a GPU-... UUID or \"all\"")
        .and_then(|(p, n)| read_selector(ctx, &p, n));
    let sharing = f
        .required(ctx, "sharing", &node.span, &format!(" (one of: {})", Sharing::NAMES.join(", ")))
        .and_then(|(p, n)| one_of(ctx, &p, n, Sharing::NAMES, Sharing::parse));
    let mig = f.take("mig").map(|(p, n)| (p.clone(), n, read_mig_list(ctx, &p, n)));
    let mps = f.take("mps").map(|(p, n)| (p.clone(), n, read_mps_defaults(ctx, &p, n)));
    let timeslice = f.take("timeslice").map(|(p, n)| {
        let names = &["default", "short", "medium", "long"];
        let t = one_of(ctx, &p, n, names, |s| {
            Some(match s {
                "default" => Timeslice::Default,
                "short" => Timeslice::Short,
                "medium" => Timeslice::Medium,
                "long" => Timeslice::Long,
                _ => return None,
            })
        });
        (p, n, t)
    });
    f.finish(ctx, GPU_KEYS);
    // Keys that only make sense with one sharing mode.
    if let Some(sharing) = sharing {
        let misplaced = [
            (mig.as_ref().map(|(p, n, _)| (p, n)), Sharing::Mig, "mig"),
            (mps.as_ref().map(|(p, n, _)| (p, n)), Sharing::Mps, "mps"),
            (timeslice.as_ref().map(|(p, n, _)| (p, n)), Sharing::TimeSlicing, "timeslice"),
        ];
        for (found, wanted, key) in misplaced {
            if let Some((p, n)) = found
                && sharing != wanted
            {
                ctx.error(
                    p,
                    &n.span,
                    format!("{key} is only valid with sharing = {:?}, not {:?}", wanted.as_str(), sharing.as_str()),
                );
            }
        }
    }
    // An entry whose selector and sharing read is kept even when other keys are bad, so the
    // checks against the host still run on it; `broken` says to trust nothing else about it.
    Some(GpuEntry {
        index,
        select: select?,
        sharing: sharing?,
        mig_broken: mig.as_ref().is_some_and(|(_, _, m)| m.is_none()),
        mig: mig.and_then(|(_, _, m)| m).unwrap_or_default(),
        mps: mps.and_then(|(_, _, m)| m),
        timeslice: timeslice.and_then(|(_, _, t)| t),
        broken: ctx.problems.len() > before,
    })
}

fn read_selector(ctx: &mut Ctx, path: &str, node: &Node) -> Option<Selector> {
    let text = match &node.kind {
        Kind::Int(i) if *i >= 0 => return Some(Selector::Indices(vec![*i as u32])),
        Kind::Str(s) => s.trim().to_string(),
        _ => {
            ctx.error(
                path,
                &node.span,
                format!(
                    "must be a string such as \"0\", \"0,2\", \"4-7\", \"GPU-...\" or \"all\", not {}",
                    node.type_name()
                ),
            );
            return None;
        }
    };
    match parse_selector(&text) {
        Ok(s) => Some(s),
        Err(e) => {
            ctx.error(path, &node.span, e);
            None
        }
    }
}

/// More GPU indices than any host has; a selector past it is a mistake (and would be expensive to
/// expand).
pub const MAX_GPUS: u32 = 1024;

/// `all`, a `GPU-` UUID, or a comma list of indices and `A-B` ranges.
pub fn parse_selector(text: &str) -> Result<Selector, String> {
    if text == "all" {
        return Ok(Selector::All);
    }
    if text.starts_with("GPU-") {
        return Ok(Selector::Uuid(text.to_string()));
    }
    let bad = || {
        format!(
            "{text:?} is not a GPU selector: use an index \"0\", a list \"0,2\", a range \"4-7\", a GPU-... UUID or \"all\""
        )
    };
    let mut indices = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for part in text.split(',').map(str::trim) {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.trim(), hi.trim()),
            None => (part, part),
        };
        let lo: u32 = lo.parse().map_err(|_| bad())?;
        let hi: u32 = hi.parse().map_err(|_| bad())?;
        if lo > hi {
            return Err(format!("{text:?}: range {lo}-{hi} runs backwards"));
        }
        if hi >= MAX_GPUS {
            return Err(format!("{text:?}: GPU {hi} is past the {MAX_GPUS} GPUs a host can have"));
        }
        for i in lo..=hi {
            if !seen.insert(i) {
                return Err(format!("{text:?} names GPU {i} twice"));
            }
            indices.push(i);
        }
    }
    Ok(Selector::Indices(indices))
}

fn read_mig_list(ctx: &mut Ctx, path: &str, node: &Node) -> Option<Vec<MigInstance>> {
    let Kind::Array(items) = &node.kind else {
        ctx.error(
            path,
            &node.span,
            format!(
                "must be an array of profiles such as [\"3g.71gb\", {{ profile = \"1g.18gb\", start = 6 }}], not {}",
                node.type_name()
            ),
        );
        return None;
    };
    let before = ctx.problems.len();
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let p = format!("{path}[{i}]");
        match &item.kind {
            Kind::Str(s) => match parse_mig_item(s) {
                Ok(m) => out.push(m),
                Err(e) => ctx.error(&p, &item.span, e),
            },
            Kind::Table(_) => {
                let Some(mut f) = Fields::of(ctx, &p, item) else { continue };
                let profile = f
                    .required(ctx, "profile", &item.span, ", e.g. profile = \"1g.18gb\"")
                    .and_then(|(pp, n)| string(ctx, &pp, n));
                let start = f.take("start").and_then(|(pp, n)| integer(ctx, &pp, n, 0..=15)).map(|s| s as u32);
                let mps = f
                    .take("sharing")
                    .and_then(|(pp, n)| {
                        one_of(ctx, &pp, n, &["time-slicing", "mps"], |s| match s {
                            "time-slicing" => Some(false),
                            "mps" => Some(true),
                            _ => None,
                        })
                    })
                    .unwrap_or(false);
                f.finish(ctx, &["profile", "start", "sharing"]);
                if let Some(profile) = profile {
                    out.push(MigInstance { profile, start, mps });
                }
            }
            _ => ctx.error(&p, &item.span, format!("must be a profile name or a table, not {}", item.type_name())),
        }
    }
    (ctx.problems.len() == before).then_some(out)
}

/// `PROFILE` or `PROFILE@START`, as `gpuctl partition set` also takes them.
pub fn parse_mig_item(text: &str) -> Result<MigInstance, String> {
    // `:mps` runs an MPS daemon on the instance, as `sharing = "mps"` does in a table item.
    let (text, mps) = match text.strip_suffix(":mps") {
        Some(rest) => (rest, true),
        None => (text, false),
    };
    let (profile, start) = match text.split_once('@') {
        Some((p, s)) => {
            let start = s.parse().map_err(|_| format!("{text:?}: start {s:?} is not a slot number"))?;
            (p, Some(start))
        }
        None => (text, None),
    };
    if profile.is_empty() {
        return Err(format!("{text:?}: missing profile name"));
    }
    if profile.contains(':') {
        return Err(format!("{text:?}: the only suffix a profile takes is \":mps\""));
    }
    Ok(MigInstance { profile: profile.to_string(), start, mps })
}

fn read_mps_defaults(ctx: &mut Ctx, path: &str, node: &Node) -> Option<MpsDefaults> {
    let before = ctx.problems.len();
    let mut f = Fields::of(ctx, path, node)?;
    let active_thread_percentage =
        f.take("active_thread_percentage").and_then(|(p, n)| integer(ctx, &p, n, 1..=100)).map(|v| v as u32);
    let pinned_memory_limit = f.take("pinned_memory_limit").and_then(|(p, n)| size(ctx, &p, n));
    let allow_compute_oversubscription = f
        .take("allow_compute_oversubscription")
        .and_then(|(p, n)| match n.kind {
            Kind::Bool(b) => Some(b),
            _ => {
                ctx.error(&p, &n.span, format!("must be true or false, not {}", n.type_name()));
                None
            }
        })
        .unwrap_or(false);
    f.finish(ctx, &["active_thread_percentage", "pinned_memory_limit", "allow_compute_oversubscription"]);
    (ctx.problems.len() == before).then_some(MpsDefaults {
        active_thread_percentage,
        pinned_memory_limit,
        allow_compute_oversubscription,
    })
}

const MODEL_KEYS: &[&str] = &[
    "name",
    "command",
    "isolation",
    "memory",
    "compute",
    "replicas",
    "gpu",
    "user",
    "working_dir",
    "env",
    "restart",
    "health",
    "limits",
    "stop_timeout",
];

/// Environment names the agent sets itself; a plan may not override them.
pub const RESERVED_ENV: &[&str] = &["CUDA_VISIBLE_DEVICES", "GPU_AGENT_", "CUDA_MPS_"];

fn read_model(ctx: &mut Ctx, path: &str, node: &Node, index: usize) -> Option<Model> {
    let mut f = Fields::of(ctx, path, node)?;
    let name = f.required(ctx, "name", &node.span, "").and_then(|(p, n)| {
        let s = string(ctx, &p, n)?;
        let valid = !s.is_empty()
            && s.len() <= 63
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-');
        if !valid {
            ctx.error(
                &p,
                &n.span,
                format!(
                    "{s:?} is not a valid model name: use 1 to 63 of a-z, 0-9 and '-', not starting or ending with '-'"
                ),
            );
            return None;
        }
        Some(s)
    });
    let command = f.required(ctx, "command", &node.span, ": an argv array such as [\"/usr/bin/python3\", \"serve.py\"]").and_then(|(p, n)| {
        let Kind::Array(items) = &n.kind else {
            ctx.error(&p, &n.span, format!("must be an argv array such as [\"/usr/bin/python3\", \"serve.py\"], not {} (commands never go through a shell)", n.type_name()));
            return None;
        };
        if items.is_empty() {
            ctx.error(&p, &n.span, "must name a program: the array is empty");
            return None;
        }
        let args: Vec<Option<String>> = items.iter().enumerate().map(|(i, a)| string(ctx, &format!("{p}[{i}]"), a)).collect();
        let args: Option<Vec<String>> = args.into_iter().collect();
        let args = args?;
        if let Some(i) = args.iter().position(|a| a.contains('\0')) {
            ctx.error(&format!("{p}[{i}]"), &items[i].span, "contains a NUL byte, which no argument can hold");
            return None;
        }
        if !args[0].starts_with('/') {
            ctx.error(&format!("{p}[0]"), &items[0].span, format!("{:?} is not an absolute path: name the program by its full path, e.g. \"/usr/bin/python3\"", args[0]));
            return None;
        }
        Some(args)
    });
    let isolation = f
        .take("isolation")
        .map(|(p, n)| one_of(ctx, &p, n, Isolation::NAMES, Isolation::parse))
        .unwrap_or(Some(Isolation::Auto));
    let memory = f
        .required(ctx, "memory", &node.span, ": the model's GPU memory budget, e.g. memory = \"6GiB\"")
        .and_then(|(p, n)| {
            let bytes = size(ctx, &p, n)?;
            if bytes < 1 << 20 {
                ctx.error(&p, &n.span, "a GPU memory budget under 1 MiB cannot hold even a CUDA context");
                return None;
            }
            Some(bytes)
        });
    let compute = f.take("compute").map(|(p, n)| integer(ctx, &p, n, 1..=100).map(|c| c as u32));
    let replicas = f.take("replicas").map(|(p, n)| integer(ctx, &p, n, 0..=1024).map(|r| r as u32)).unwrap_or(Some(1));
    let gpu = f.take("gpu").map(|(p, n)| match &n.kind {
        Kind::Int(i) if *i >= 0 => Some(GpuRef::Index(*i as u32)),
        Kind::Str(s) if s.starts_with("GPU-") => Some(GpuRef::Uuid(s.clone())),
        Kind::Str(s) if s.parse::<u32>().is_ok() => Some(GpuRef::Index(s.parse().unwrap_or_default())),
        _ => {
            ctx.error(&p, &n.span, "must be one GPU: an index such as \"1\" or a GPU-... UUID");
            None
        }
    });
    let user = f.take("user").map(|(p, n)| string(ctx, &p, n));
    let working_dir = f.take("working_dir").map(|(p, n)| {
        let s = string(ctx, &p, n)?;
        if !s.starts_with('/') {
            ctx.error(&p, &n.span, format!("{s:?} is not an absolute path"));
            return None;
        }
        Some(PathBuf::from(s))
    });
    let env = f.take("env").map(|(p, n)| read_env(ctx, &p, n));
    let restart = f
        .take("restart")
        .map(|(p, n)| {
            one_of(ctx, &p, n, Restart::NAMES, |s| match s {
                "always" => Some(Restart::Always),
                "on-failure" => Some(Restart::OnFailure),
                "never" => Some(Restart::Never),
                _ => None,
            })
        })
        .unwrap_or(Some(Restart::Always));
    let health = f.take("health").map(|(p, n)| read_health(ctx, &p, n));
    let limits = f.take("limits").map(|(p, n)| read_limits(ctx, &p, n));
    let stop_timeout =
        f.take("stop_timeout").map(|(p, n)| duration(ctx, &p, n)).unwrap_or(Some(Duration::from_secs(10)));
    f.finish(ctx, MODEL_KEYS);
    // Keep the model even when keys are bad, with placeholders, so every other check still runs.
    let mut broken = std::collections::BTreeSet::new();
    let mut mark = |key: &'static str, ok: bool| {
        if !ok {
            broken.insert(key);
        }
    };
    mark("name", name.is_some());
    mark("command", command.is_some());
    mark("memory", memory.is_some());
    mark("isolation", isolation.is_some());
    mark("compute", !matches!(compute, Some(None)));
    mark("replicas", replicas.is_some());
    mark("gpu", !matches!(gpu, Some(None)));
    mark("user", !matches!(user, Some(None)));
    mark("working_dir", !matches!(working_dir, Some(None)));
    mark("env", !matches!(env, Some(None)));
    mark("restart", restart.is_some());
    mark("health", !matches!(health, Some(None)));
    mark("limits", !matches!(limits, Some(None)));
    mark("stop_timeout", stop_timeout.is_some());
    Some(Model {
        index,
        name: name.unwrap_or_default(),
        command: command.unwrap_or_default(),
        isolation: isolation.unwrap_or(Isolation::Auto),
        memory_mib: memory.map(mib).unwrap_or(0),
        compute: compute.flatten(),
        replicas: replicas.unwrap_or(0),
        gpu: gpu.flatten(),
        user: user.flatten(),
        working_dir: working_dir.flatten(),
        env: env.flatten().unwrap_or_default(),
        restart: restart.unwrap_or(Restart::Never),
        health: health.flatten(),
        limits: limits.flatten().unwrap_or_default(),
        stop_timeout: stop_timeout.unwrap_or(Duration::from_secs(10)),
        broken,
    })
}

fn read_env(ctx: &mut Ctx, path: &str, node: &Node) -> Option<BTreeMap<String, String>> {
    let Kind::Table(entries) = &node.kind else {
        ctx.error(
            path,
            &node.span,
            format!("must be a table of strings such as {{ HF_HOME = \"/var/cache/hf\" }}, not {}", node.type_name()),
        );
        return None;
    };
    let mut env = BTreeMap::new();
    for (key, value) in entries {
        let p = format!("{path}.{key}");
        let valid_name = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            ctx.error(&p, &value.span, format!("{key:?} is not a valid environment variable name"));
            continue;
        }
        if RESERVED_ENV.iter().any(|r| if r.ends_with('_') { key.starts_with(r) } else { key == r }) {
            ctx.error(&p, &value.span, format!("{key} is set by the agent for each worker and cannot be overridden"));
            continue;
        }
        if let Some(v) = string(ctx, &p, value) {
            if v.contains('\0') {
                ctx.error(&p, &value.span, "contains a NUL byte");
                continue;
            }
            env.insert(key.clone(), v);
        }
    }
    Some(env)
}

fn read_health(ctx: &mut Ctx, path: &str, node: &Node) -> Option<Health> {
    let before = ctx.problems.len();
    let mut f = Fields::of(ctx, path, node)?;
    let http = f.take("http").and_then(|(p, n)| {
        let s = string(ctx, &p, n)?;
        if !s.starts_with("http://") {
            ctx.error(&p, &n.span, format!("{s:?} is not an http:// URL"));
        }
        Some((s, n.span.clone()))
    });
    let tcp = f.take("tcp").and_then(|(p, n)| {
        let s = string(ctx, &p, n)?;
        if s.rsplit_once(':').and_then(|(_, port)| port.parse::<u16>().ok()).is_none() {
            ctx.error(&p, &n.span, format!("{s:?} is not HOST:PORT"));
        }
        Some(s)
    });
    let interval = f.take("interval").and_then(|(p, n)| duration(ctx, &p, n)).unwrap_or(Duration::from_secs(5));
    let timeout = f.take("timeout").and_then(|(p, n)| duration(ctx, &p, n)).unwrap_or(Duration::from_secs(2));
    let failure_threshold =
        f.take("failure_threshold").and_then(|(p, n)| integer(ctx, &p, n, 1..=100)).unwrap_or(3) as u32;
    let start_timeout =
        f.take("start_timeout").and_then(|(p, n)| duration(ctx, &p, n)).unwrap_or(Duration::from_secs(300));
    f.finish(ctx, &["http", "tcp", "interval", "timeout", "failure_threshold", "start_timeout"]);
    let probe = match (http, tcp) {
        (Some((url, _)), None) => HealthProbe::Http(url),
        (None, Some(addr)) => HealthProbe::Tcp(addr),
        (Some((_, span)), Some(_)) => {
            ctx.error(path, &span, "give either http or tcp, not both");
            return None;
        }
        (None, None) => {
            ctx.error(
                path,
                &node.span,
                "needs a probe: http = \"http://127.0.0.1:8001/healthz\" or tcp = \"127.0.0.1:8001\"",
            );
            return None;
        }
    };
    (ctx.problems.len() == before).then_some(Health { probe, interval, timeout, failure_threshold, start_timeout })
}

fn read_limits(ctx: &mut Ctx, path: &str, node: &Node) -> Option<Limits> {
    let before = ctx.problems.len();
    let mut f = Fields::of(ctx, path, node)?;
    let memory = f.take("memory").and_then(|(p, n)| size(ctx, &p, n));
    let cpu = f.take("cpu").and_then(|(p, n)| match n.kind {
        // Bounded so the cgroup quota (cpu x 100 ms period) stays within what the kernel takes
        // (at least 1 ms).
        Kind::Float(v) if (0.01..=4096.0).contains(&v) => Some(v),
        Kind::Int(v) if (1..=4096).contains(&v) => Some(v as f64),
        _ => {
            ctx.error(&p, &n.span, "must be a number of CPUs from 0.01 to 4096, e.g. 2.0 or 0.5");
            None
        }
    });
    let pids = f.take("pids").and_then(|(p, n)| integer(ctx, &p, n, 1..=4_194_304)).map(|v| v as u64);
    f.finish(ctx, &["memory", "cpu", "pids"]);
    (ctx.problems.len() == before).then_some(Limits { memory, cpu, pids })
}
