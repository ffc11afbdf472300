//! The gRPC layer: each handler converts the request, calls one `Agent::do_*`, and converts the
//! answer. Only this module knows protobuf types; [`status`] is the one mapping of errors to codes.

use crate::executor::Progress;
use crate::inventory::Gpu;
use crate::reconcile::Step;
use crate::service::{Agent, AgentError, ApplyProgress, GpuView, PlanInput};
use crate::store::{WorkerRecord, WorkerState};
use gpu_agent_proto::v1 as pb;
use pb::agent_server::Agent as AgentRpc;
use prost::Message;
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

pub struct Rpc {
    pub agent: Arc<Agent>,
}

/// The one place that turns agent errors into gRPC status codes.
pub fn status(err: AgentError) -> Status {
    match err {
        AgentError::InvalidPlan(problems) => {
            let details = pb::PlanProblems {
                problems: problems
                    .iter()
                    .map(|p| pb::PlanProblem {
                        path: p.path.clone(),
                        line: p.line,
                        column: p.column,
                        message: p.message.clone(),
                    })
                    .collect(),
            };
            let text = problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n");
            Status::with_details(
                tonic::Code::InvalidArgument,
                format!("invalid plan:\n{text}"),
                details.encode_to_vec().into(),
            )
        }
        AgentError::NotFound(m) => Status::not_found(m),
        AgentError::Refused(reasons) => {
            Status::failed_precondition(format!("refused, nothing was changed:\n{}", reasons.join("\n")))
        }
        AgentError::Driver(e) => Status::unavailable(e.to_string()),
        AgentError::Store(e) => Status::internal(e.to_string()),
        AgentError::Internal(m) => Status::internal(m),
    }
}

pub fn gpu_pb(view: &GpuView, owners: &std::collections::BTreeMap<u32, crate::reconcile::WorkerKey>) -> pb::Gpu {
    let g = &view.gpu;
    pb::Gpu {
        index: g.index,
        uuid: g.uuid.clone(),
        name: g.name.clone(),
        pci_device_id: g.pci_device_id,
        pci_bus_id: g.pci_bus_id.clone(),
        memory_total_mib: g.memory_total_mib,
        memory_used_mib: g.memory_used_mib,
        mig_current: g.mig_current,
        mig_pending: g.mig_pending,
        compute_mode: g.compute_mode.as_str().to_string(),
        sharing: view.sharing.clone().unwrap_or_default(),
        instances: g
            .instances
            .iter()
            .map(|i| pb::GpuInstance {
                id: i.id,
                profile: i.profile.clone(),
                profile_id: i.profile_id,
                start: i.start,
                size: i.size,
                uuid: i.uuid.clone().unwrap_or_default(),
                memory_mib: i.memory_mib,
            })
            .collect(),
        processes: g
            .processes
            .iter()
            .map(|p| pb::GpuProcess {
                pid: p.pid,
                used_mib: p.used_mib,
                gpu_instance_id: p.gpu_instance_id,
                mps_client: p.mps_client,
                model: owners.get(&p.pid).map(|k| k.model.clone()).unwrap_or_default(),
                replica: owners.get(&p.pid).map(|k| k.replica),
            })
            .collect(),
        sm_count: g.sm_count,
        error: String::new(),
        memory_slices: g
            .profiles
            .iter()
            .flat_map(|p| p.placements.iter().map(|pl| pl.start + pl.size))
            .max()
            .unwrap_or(0),
    }
}

fn profiles_pb(gpu: &Gpu) -> pb::ListProfilesReply {
    pb::ListProfilesReply {
        gpu_index: gpu.index,
        gpu_name: gpu.name.clone(),
        profiles: gpu
            .profiles
            .iter()
            .map(|p| pb::Profile {
                id: p.id,
                name: p.name.clone(),
                memory_mib: p.memory_mib,
                sm: p.sm,
                max: p.max,
                placements: p.placements.iter().map(|pl| pb::Placement { start: pl.start, size: pl.size }).collect(),
                slices: p.slices,
                copy_engines: p.copy_engines,
                decoders: p.decoders,
                encoders: p.encoders,
                jpegs: p.jpegs,
                ofas: p.ofas,
                nvml_index: p.nvml_index,
            })
            .collect(),
    }
}

pub fn step_pb(step: &Step) -> pb::Step {
    let mut out = pb::Step {
        action: step.action().to_string(),
        gpu: step.gpu(),
        reason: step.reason().to_string(),
        ..Default::default()
    };
    match step {
        Step::StartWorker { spec, .. } => {
            out.model = spec.key.model.clone();
            out.replica = Some(spec.key.replica);
            out.device = spec.device.clone();
            out.isolation = spec.isolation.clone();
            out.mps_daemon = spec.mps_daemon.clone().unwrap_or_default();
            if let Some((profile, start)) = spec.instance.as_deref().and_then(|i| i.split_once('@')) {
                out.profile = profile.to_string();
                out.start = start.parse().ok();
            }
        }
        Step::StopWorker { key, device, pid, .. } => {
            out.model = key.model.clone();
            out.replica = Some(key.replica);
            out.pid = *pid;
            out.device = device.clone();
        }
        Step::CreateGpuInstance { profile, start, .. } | Step::DestroyGpuInstance { profile, start, .. } => {
            out.profile = profile.clone();
            out.start = Some(*start);
        }
        Step::EnableMig { .. } | Step::DisableMig { .. } => {}
        Step::StartMps { daemon, .. } => {
            out.mps_daemon = daemon.name.clone();
            out.device = daemon.device.clone();
            if let Some((profile, start)) = daemon.instance.as_deref().and_then(|i| i.split_once('@')) {
                out.profile = profile.to_string();
                out.start = start.parse().ok();
            }
        }
        Step::StopMps { name, .. } => out.mps_daemon = name.clone(),
    }
    out
}

fn worker_pb(r: &WorkerRecord, used: &std::collections::HashMap<crate::reconcile::WorkerKey, u64>) -> pb::Worker {
    pb::Worker {
        model: r.spec.key.model.clone(),
        replica: r.spec.key.replica,
        pid: r.pid.unwrap_or(0),
        state: r.state.as_str().to_string(),
        restarts: r.restarts,
        device: r.spec.device.clone(),
        isolation: r.spec.isolation.clone(),
        gpu: r.spec.gpu,
        memory_budget_mib: r.spec.memory_mib,
        gpu_memory_used_mib: used.get(&r.spec.key).copied().unwrap_or(0),
        last_exit: r.last_exit.clone().unwrap_or_default(),
        log_tail: r.log_tail.clone().unwrap_or_default(),
        started_at_unix: r.started_at_unix,
    }
}

type ApplyStream = Pin<Box<dyn Stream<Item = Result<pb::ApplyEvent, Status>> + Send>>;

fn event(e: pb::apply_event::Event) -> Result<pb::ApplyEvent, Status> {
    Ok(pb::ApplyEvent { event: Some(e) })
}

fn progress_event(p: ApplyProgress) -> pb::apply_event::Event {
    use pb::apply_event::Event;
    match p {
        ApplyProgress::Plan(steps) => Event::Plan(pb::DiffReply { steps: steps.iter().map(step_pb).collect() }),
        ApplyProgress::Step(Progress::Started { index, step }) => {
            Event::Started(pb::StepStarted { index: index as u32, step: Some(step_pb(&step)) })
        }
        ApplyProgress::Step(Progress::Finished { index, step, result, millis }) => Event::Finished(pb::StepFinished {
            index: index as u32,
            step: Some(step_pb(&step)),
            ok: result.is_ok(),
            error: result.err().unwrap_or_default(),
            millis,
        }),
        ApplyProgress::Step(Progress::RolledBack { action, result }) => {
            Event::RolledBack(pb::RolledBack { action, ok: result.is_ok(), error: result.err().unwrap_or_default() })
        }
    }
}

/// Apply (or dry-run) a plan and stream its progress. The plan is checked before the stream
/// starts, so a bad or refused plan is a plain status and nothing changed.
async fn stream_apply(
    agent: &Arc<Agent>,
    source: String,
    input: PlanInput,
    dry_run: bool,
    drain: bool,
) -> Result<ApplyStream, Status> {
    let prepared = match agent.prepare_input(&input).await {
        Ok(p) => p,
        Err(e) => {
            if !dry_run {
                agent.record_rejected(&source, &e);
            }
            return Err(status(e));
        }
    };
    let refusals = agent.refusals(&prepared, drain);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    if dry_run {
        let steps: Vec<_> = prepared.steps.iter().map(step_pb).collect();
        let n = steps.len() as u32;
        let message = if refusals.is_empty() {
            format!("dry run: {n} step(s), nothing changed")
        } else {
            format!("dry run: {n} step(s), nothing changed; applying would be refused: {}", refusals.join("; "))
        };
        let _ = tx.send(event(pb::apply_event::Event::Plan(pb::DiffReply { steps })));
        let _ = tx.send(event(pb::apply_event::Event::Done(pb::ApplyDone {
            ok: refusals.is_empty(),
            steps: n,
            failed: 0,
            message,
            dry_run: true,
            rolled_back: false,
        })));
    } else {
        if !refusals.is_empty() {
            let err = AgentError::Refused(refusals);
            agent.record_rejected(&source, &err);
            return Err(status(err));
        }
        let agent = Arc::clone(agent);
        tokio::spawn(async move {
            // The apply runs to the end even if the client goes away.
            let result = agent.do_apply(input, drain, |p| drop(tx.send(event(progress_event(p))))).await;
            match result {
                Ok(o) => drop(tx.send(event(pb::apply_event::Event::Done(pb::ApplyDone {
                    ok: o.failed == 0,
                    steps: o.steps as u32,
                    failed: o.failed as u32,
                    message: o.summary(),
                    dry_run: false,
                    rolled_back: o.rolled_back.is_some(),
                })))),
                Err(e) => {
                    agent.record_rejected(&source, &e);
                    let _ = tx.send(Err(status(e)));
                }
            }
        });
    }
    Ok(Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)))
}

#[tonic::async_trait]
impl AgentRpc for Rpc {
    async fn status(&self, _: Request<pb::StatusRequest>) -> Result<Response<pb::StatusReply>, Status> {
        let view = self.agent.do_status().await.map_err(status)?;
        let count = |s: WorkerState| view.workers.iter().filter(|w| w.state == s).count() as u32;
        let gpus = view
            .gpus
            .iter()
            .map(|g| pb::GpuSummary {
                index: g.gpu.index,
                uuid: g.gpu.uuid.clone(),
                name: g.gpu.name.clone(),
                sharing: g.sharing.clone().unwrap_or_default(),
                mig_current: g.gpu.mig_current,
                mig_pending: g.gpu.mig_pending,
                mig_instances: g.gpu.instances.len() as u32,
                workers: view.workers.iter().filter(|w| w.spec.gpu == g.gpu.index && w.state.active()).count() as u32,
                memory_total_mib: g.gpu.memory_total_mib,
                memory_used_mib: g.gpu.memory_used_mib,
                drained: view.state.drained.contains(&g.gpu.index),
            })
            .collect();
        let settings = &self.agent.settings;
        Ok(Response::new(pb::StatusReply {
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            driver_version: view.driver_version,
            simulated: settings.simulate.clone().unwrap_or_default(),
            read_only_gpus: settings.read_only_gpus,
            gpus,
            workers: Some(pb::WorkerCounts {
                total: view.workers.len() as u32,
                running: count(WorkerState::Running),
                starting: count(WorkerState::Starting),
                stopped: count(WorkerState::Stopped),
                failed: count(WorkerState::Failed),
                stopping: count(WorkerState::Stopping),
                backoff: count(WorkerState::Backoff),
            }),
            last_apply: view.state.last_apply.map(|a| pb::LastApply {
                at_unix: a.at_unix,
                ok: a.ok,
                source: a.source,
                steps: a.steps,
                message: a.message,
            }),
            state_dir: settings.state_dir.display().to_string(),
            uptime_seconds: view.uptime_secs,
            mps_daemons: self
                .agent
                .do_mps()
                .into_iter()
                .map(|d| pb::MpsDaemon {
                    name: d.spec.name,
                    gpu: d.spec.gpu,
                    device: d.spec.device,
                    pid: d.pid.unwrap_or(0),
                    state: d.state,
                    restarts: d.restarts,
                    last_error: d.last_error.unwrap_or_default(),
                    active_thread_percentage: d.spec.active_thread_percentage,
                    pinned_limit_mib: d.spec.pinned_limit_mib,
                })
                .collect(),
        }))
    }

    async fn list_gpus(&self, _: Request<pb::ListGpusRequest>) -> Result<Response<pb::ListGpusReply>, Status> {
        let (gpus, unavailable) = self.agent.do_gpus().await.map_err(status)?;
        let pids: Vec<u32> = gpus.iter().flat_map(|g| g.gpu.processes.iter().map(|p| p.pid)).collect();
        let owners = self.agent.owners(&pids);
        let mut list: Vec<pb::Gpu> = gpus.iter().map(|g| gpu_pb(g, &owners)).collect();
        list.extend(unavailable.into_iter().map(|u| pb::Gpu { index: u.index, error: u.error, ..Default::default() }));
        list.sort_by_key(|g| g.index);
        Ok(Response::new(pb::ListGpusReply { gpus: list }))
    }

    async fn list_profiles(
        &self,
        req: Request<pb::ListProfilesRequest>,
    ) -> Result<Response<pb::ListProfilesReply>, Status> {
        let gpu = self.agent.do_profiles(&req.into_inner().gpu).await.map_err(status)?;
        Ok(Response::new(profiles_pb(&gpu)))
    }

    async fn diff(&self, req: Request<pb::PlanRequest>) -> Result<Response<pb::DiffReply>, Status> {
        let req = req.into_inner();
        let prepared = self.agent.prepare(&req.plan_toml, &req.source).await.map_err(status)?;
        Ok(Response::new(pb::DiffReply { steps: prepared.steps.iter().map(step_pb).collect() }))
    }

    type ApplyStream = ApplyStream;

    async fn apply(&self, req: Request<pb::PlanRequest>) -> Result<Response<Self::ApplyStream>, Status> {
        let req = req.into_inner();
        let input = PlanInput::Text { text: req.plan_toml.clone(), source: req.source.clone() };
        stream_apply(&self.agent, req.source, input, req.dry_run, req.drain).await.map(Response::new)
    }

    type PartitionStream = ApplyStream;

    async fn partition(&self, req: Request<pb::PartitionRequest>) -> Result<Response<Self::PartitionStream>, Status> {
        let req = req.into_inner();
        let layout = (!req.clear).then_some(req.profiles.as_slice());
        // Checked (and shown, for a dry run) against the stored plan now; applied against the
        // stored plan as it is when the apply holds the lock.
        let source = match layout {
            Some(items) => format!("gpuctl partition set {} {}", req.gpu, items.join(" ")),
            None => format!("gpuctl partition clear {}", req.gpu),
        };
        let input = PlanInput::Partition { gpu: req.gpu.clone(), layout: layout.map(<[String]>::to_vec) };
        stream_apply(&self.agent, source, input, req.dry_run, req.drain).await.map(Response::new)
    }

    type LogsStream = Pin<Box<dyn Stream<Item = Result<pb::LogChunk, Status>> + Send>>;

    async fn logs(&self, req: Request<pb::LogsRequest>) -> Result<Response<Self::LogsStream>, Status> {
        let req = req.into_inner();
        let files = self.agent.log_files(&req.model, req.replica).map_err(status)?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let mut offsets = Vec::new();
            for (replica, path) in &files {
                let (data, end) = crate::logs::tail(path, req.tail as usize).unwrap_or_default();
                offsets.push(crate::logs::Cursor::at(path, end));
                if !data.is_empty() && tx.send(Ok(pb::LogChunk { replica: *replica, data })).await.is_err() {
                    return;
                }
            }
            if !req.follow {
                return;
            }
            // Follow: new output as it comes, until the client goes away.
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                for ((replica, path), offset) in files.iter().zip(offsets.iter_mut()) {
                    let Ok(data) = crate::logs::read_new(path, offset) else { continue };
                    if !data.is_empty() && tx.send(Ok(pb::LogChunk { replica: *replica, data })).await.is_err() {
                        return;
                    }
                }
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    type DrainStream = ApplyStream;

    async fn drain(&self, req: Request<pb::DrainRequest>) -> Result<Response<Self::DrainStream>, Status> {
        let req = req.into_inner();
        let verb = if req.undrain { "undrain" } else { "drain" };
        let source = format!("gpuctl {verb} {}", req.gpu);
        let input = PlanInput::Drain { gpu: req.gpu, drain: !req.undrain };
        // Draining stops the GPU's workers by definition: the apply drains.
        stream_apply(&self.agent, source, input, false, true).await.map(Response::new)
    }

    async fn model_action(
        &self,
        req: Request<pb::ModelActionRequest>,
    ) -> Result<Response<pb::ModelActionReply>, Status> {
        let req = req.into_inner();
        let done = self.agent.do_model_action(&req.model, &req.action).await.map_err(status)?;
        Ok(Response::new(pb::ModelActionReply { done }))
    }

    async fn list_workers(&self, _: Request<pb::ListWorkersRequest>) -> Result<Response<pb::ListWorkersReply>, Status> {
        let records = self.agent.do_workers();
        // Real GPU memory per worker: every process of the driver's lists that is the worker's
        // own or runs in its session (its children).
        let processes: Vec<(u32, u64)> = match self.agent.inventory().await {
            Ok(inv) => inv.gpus.iter().flat_map(|g| g.processes.iter().map(|p| (p.pid, p.used_mib))).collect(),
            Err(_) => Vec::new(),
        };
        let owners = self.agent.owners(&processes.iter().map(|(pid, _)| *pid).collect::<Vec<_>>());
        let mut used: std::collections::HashMap<crate::reconcile::WorkerKey, u64> = Default::default();
        for (pid, mib) in processes {
            if let Some(key) = owners.get(&pid) {
                *used.entry(key.clone()).or_default() += mib;
            }
        }
        Ok(Response::new(pb::ListWorkersReply { workers: records.iter().map(|r| worker_pb(r, &used)).collect() }))
    }

    async fn list_events(&self, _: Request<pb::ListEventsRequest>) -> Result<Response<pb::ListEventsReply>, Status> {
        let events = self
            .agent
            .do_events()
            .into_iter()
            .map(|e| pb::Event {
                at_unix_ms: e.at_unix_ms,
                level: format!("{:?}", e.level).to_lowercase(),
                kind: e.kind.to_string(),
                message: e.message,
                model: e.model.unwrap_or_default(),
                gpu: e.gpu,
            })
            .collect();
        Ok(Response::new(pb::ListEventsReply { events }))
    }
}
