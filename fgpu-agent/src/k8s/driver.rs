//! The DRA driver's node side: prepare a claim (fetch it, read what it consumes and which pods
//! it is for, write its CDI spec, checkpoint it, put the limits on the pods' cgroups through
//! the agent) and unprepare it. A pod's limit is the sum of the claims prepared for it, set
//! on the pod's cgroup, so all its containers share one budget (hierarchical limits), and
//! bound to the cgroup's life. A pod whose cgroup does not exist yet is limited as soon as it
//! appears ([`Driver::reconcile`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{Context, Result};
use bytes::Bytes;
use fgpu_common::proto::Kind;
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::checkpoint::{Checkpoint, Prepared};
use super::claim::{self, Plan};
use super::podcgroup;
use crate::api::{Limit, LimitSetRequest, PodName, TargetRequest};
use crate::cdi::spec;

/// What the driver needs to know about the node.
#[derive(Debug, Clone)]
pub struct Config {
    pub driver: String,
    /// The agent's admin socket.
    pub admin_socket: PathBuf,
    /// The cgroup v2 mount, and the cgroup (relative to it) that holds `kubepods*`.
    pub cgroup_mount: PathBuf,
    pub cgroup_parent: String,
    pub cdi_dir: PathBuf,
    /// The CDI spec's common part (shim, containers' socket, preload), per GPU device name.
    pub spec_inputs: spec::Inputs,
    /// fgpu's device names (`gpu-<index>`) and their GPUs.
    pub gpus: BTreeMap<String, spec::Gpu>,
    /// Each GPU's memory in bytes, by device name (what the ResourceSlice publishes).
    pub memory: BTreeMap<String, u64>,
}

pub struct Driver {
    pub cfg: Config,
    pub client: Option<kube::Client>,
    state: tokio::sync::Mutex<State>,
}

struct State {
    ckpt: Checkpoint,
    /// Pods whose limit is on their cgroup now: pod UID -> (cgroup, limit).
    applied: BTreeMap<String, (String, Limit)>,
    /// Pods with a limit whose cgroup was not found: since when, and whether that was said.
    missing: BTreeMap<String, (std::time::Instant, bool)>,
}

/// A pod's cgroup still missing this long after its claim was prepared is said at warn,
/// with where it was looked for (a kubelet cgroupRoot fgpu was not told of).
const MISSING_WARN: std::time::Duration = std::time::Duration::from_secs(30);

/// The kind of fgpu's per-claim CDI devices: `<driver>/claim=<claim UID>`.
pub fn cdi_kind(driver: &str) -> String {
    format!("{driver}/claim")
}

impl Driver {
    pub fn new(cfg: Config, client: Option<kube::Client>, ckpt: Checkpoint) -> Self {
        Self {
            cfg,
            client,
            state: tokio::sync::Mutex::new(State {
                ckpt,
                applied: BTreeMap::new(),
                missing: BTreeMap::new(),
            }),
        }
    }

    async fn fetch(&self, namespace: &str, name: &str) -> Result<ResourceClaim> {
        let client = self
            .client
            .clone()
            .context("no API server configured (run in a pod, or give --kubeconfig)")?;
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(client, namespace);
        api.get(name).await.with_context(|| {
            format!("getting ResourceClaim {namespace}/{name} from the API server")
        })
    }

    /// Prepares one claim: its CDI ids, or why not. Idempotent.
    pub async fn prepare(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<Prepared>> {
        {
            let mut st = self.state.lock().await;
            if let Some(p) = st.ckpt.claims.get(uid).cloned() {
                // Prepared before (perhaps before a restart): the same answer, limits put back.
                for pod in &p.plan.pods {
                    self.ensure_pod(&mut st, pod).await?;
                }
                return Ok(Some(p));
            }
        }
        let claim = self.fetch(namespace, name).await?;
        let Some(plan) = claim::plan(&claim, &self.cfg.driver, uid)? else {
            return Ok(None);
        };
        let gpu = self.cfg.gpus.get(&plan.device).with_context(|| {
            format!(
                "the claim was allocated device {}, which this node does not have",
                plan.device
            )
        })?;
        let spec_file = self
            .cfg
            .cdi_dir
            .join(format!("{}-claim_{uid}.json", self.cfg.driver));
        let cdi_ids = vec![format!("{}={uid}", cdi_kind(&self.cfg.driver))];
        let json = claim_spec(&self.cfg, &plan, gpu)?;
        crate::cdi::generate::write_file(&spec_file, &json)?;
        let prepared = Prepared {
            plan,
            cdi_ids,
            spec_file,
        };
        let mut st = self.state.lock().await;
        st.ckpt.claims.insert(uid.to_string(), prepared.clone());
        let held = match st.ckpt.save() {
            Ok(()) => self.ensure_pods(&mut st, &prepared.plan.pods).await,
            Err(err) => Err(err),
        };
        if let Err(err) = held {
            // A limit that cannot be held fails the prepare (the kubelet shows the error and
            // retries): the pod does not start without it, and nothing of the claim is kept.
            self.forget(&mut st, uid, &prepared).await;
            return Err(err);
        }
        tracing::info!(
            claim = %format!("{namespace}/{name}"), uid, device = %prepared.plan.device,
            memory = ?prepared.plan.memory_bytes, compute = ?prepared.plan.compute_pct,
            park_after_ms = ?prepared.plan.park_after_ms, pods = ?prepared.plan.pods,
            "claim prepared"
        );
        Ok(Some(prepared))
    }

    /// Every pod of `pods` gets its limit; the first that cannot stops the rest.
    async fn ensure_pods(&self, st: &mut State, pods: &[String]) -> Result<()> {
        for pod in pods {
            self.ensure_pod(st, pod).await?;
        }
        Ok(())
    }

    /// Undoes a prepare that failed: the claim leaves the checkpoint, its CDI spec goes, and
    /// its pods get back the limits of their other claims.
    async fn forget(&self, st: &mut State, uid: &str, p: &Prepared) {
        st.ckpt.claims.remove(uid);
        if let Err(err) = st.ckpt.save() {
            tracing::warn!(uid, "cannot save the checkpoint: {err:#}");
        }
        match std::fs::remove_file(&p.spec_file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(uid, "removing {}: {e}", p.spec_file.display()),
        }
        for pod in &p.plan.pods {
            if let Err(err) = self.ensure_pod(st, pod).await {
                tracing::warn!(pod, "cannot put back the pod's limit: {err:#}");
            }
        }
    }

    /// Unprepares one claim. Idempotent: a claim it does not know is done already.
    pub async fn unprepare(&self, uid: &str) -> Result<()> {
        let mut st = self.state.lock().await;
        let Some(p) = st.ckpt.claims.remove(uid) else {
            return Ok(());
        };
        match std::fs::remove_file(&p.spec_file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", p.spec_file.display())),
        }
        st.ckpt.save()?;
        for pod in &p.plan.pods {
            self.ensure_pod(&mut st, pod).await?;
        }
        tracing::info!(uid, "claim unprepared");
        Ok(())
    }

    /// Every pod with prepared claims gets its limit, once its cgroup exists; a limit set
    /// before is set again every `reassert` call (the agent may have restarted).
    pub async fn reconcile(&self, reassert: bool) {
        let mut st = self.state.lock().await;
        let pods: BTreeSet<String> = st
            .ckpt
            .claims
            .values()
            .flat_map(|p| p.plan.pods.iter().cloned())
            .collect();
        for pod in pods {
            let gone = st.applied.get(&pod).is_some_and(|(cg, _)| {
                !self
                    .cfg
                    .cgroup_mount
                    .join(cg.trim_start_matches('/'))
                    .is_dir()
            });
            if gone {
                st.applied.remove(&pod);
            }
            if reassert || !st.applied.contains_key(&pod) {
                if reassert {
                    st.applied.remove(&pod);
                }
                if let Err(err) = self.ensure_pod(&mut st, &pod).await {
                    tracing::warn!(pod, "cannot limit the pod: {err:#}");
                }
            }
        }
    }

    /// Pods that started sharing a claim after it was prepared here. The kubelet calls
    /// NodePrepareResources once per claim and node: for a claim it has prepared already it
    /// only records the new pod (pkg/kubelet/cm/dra/manager.go, `prepareResources`: a claim
    /// found in its claim-info cache is not sent to the plugin again). So each prepared
    /// claim's `status.reservedFor` is read again here; a pod found there for the first time
    /// gets the limit the others have (each pod is held to the claim's capacity on its own:
    /// pods sharing one claim may together use that many times it, which is logged). A
    /// claim the API server no longer has, or cannot give now, keeps its pods.
    pub async fn refresh_sharers(&self) {
        let claims: Vec<(String, String, String)> = {
            let st = self.state.lock().await;
            st.ckpt
                .claims
                .iter()
                .map(|(uid, p)| (uid.clone(), p.plan.namespace.clone(), p.plan.name.clone()))
                .collect()
        };
        for (uid, namespace, name) in claims {
            let Ok(claim) = self.fetch(&namespace, &name).await else {
                continue;
            };
            if claim.metadata.uid.as_deref() != Some(uid.as_str()) {
                continue; // another claim of the same name by now
            }
            let Ok(Some(plan)) = claim::plan(&claim, &self.cfg.driver, &uid) else {
                continue;
            };
            let mut st = self.state.lock().await;
            let Some(p) = st.ckpt.claims.get_mut(&uid) else {
                continue; // unprepared meanwhile
            };
            let joined: Vec<String> = plan
                .pods
                .iter()
                .filter(|x| !p.plan.pods.contains(x))
                .cloned()
                .collect();
            if joined.is_empty() {
                continue;
            }
            p.plan.pods.extend(joined.iter().cloned());
            p.plan.pod_names.extend(plan.pod_names);
            let sharers = p.plan.pods.len();
            if let Err(err) = st.ckpt.save() {
                tracing::warn!(claim = %format!("{namespace}/{name}"), "cannot save the checkpoint: {err:#}");
            }
            for pod in &joined {
                tracing::warn!(
                    claim = %format!("{namespace}/{name}"),
                    pod,
                    sharers,
                    "a pod joined a prepared claim: it is limited to the claim's capacity as \
                     the others are, each on its own (together they may use {sharers} times \
                     it)"
                );
                if let Err(err) = self.ensure_pod(&mut st, pod).await {
                    tracing::warn!(pod, "cannot limit the pod: {err:#}");
                }
            }
        }
    }

    /// The pod's limit: on each GPU its claims were allocated on, the sum of those claims'
    /// capacities there (per-GPU values, by the GPU's UUID); on any other GPU the pod can
    /// reach, the sum of all its claims up to the largest such GPU (the plain value: no more
    /// than it was given in all, where the node exposes GPUs the scheduler did not allocate
    /// it; never more than a GPU holds). A claim without a
    /// memory figure is its whole GPU: no memory limit there (and no plain one). `None`: no
    /// claims left.
    fn pod_limit(&self, st: &State, pod: &str) -> Option<Limit> {
        let plans: Vec<&Plan> = st
            .ckpt
            .claims
            .values()
            .map(|p| &p.plan)
            .filter(|p| p.pods.iter().any(|x| x == pod))
            .collect();
        pod_limit(&self.cfg.gpus, &self.cfg.memory, &plans)
    }

    async fn ensure_pod(&self, st: &mut State, pod: &str) -> Result<()> {
        let want = self.pod_limit(st, pod);
        let found = podcgroup::find(&self.cfg.cgroup_mount, &self.cfg.cgroup_parent, pod);
        match (want, found) {
            (Some(limit), Some(cg)) => {
                st.missing.remove(pod);
                if st.applied.get(pod) == Some(&(cg.clone(), limit.clone())) {
                    return Ok(());
                }
                // The agent merges per-GPU values into what the cgroup has: GPUs the pod's
                // claims no longer name lose theirs (its plain values are always set anew).
                let clear_gpus = st
                    .applied
                    .get(pod)
                    .filter(|(was, _)| *was == cg)
                    .map(|(_, old)| {
                        old.memory_gpus
                            .keys()
                            .chain(old.compute_gpus.keys())
                            .filter(|u| !limit.names_gpu(u))
                            .cloned()
                            .collect::<BTreeSet<_>>()
                            .into_iter()
                            .collect()
                    })
                    .unwrap_or_default();
                let req = LimitSetRequest {
                    target: cg.clone(),
                    limit: limit.clone(),
                    until_cgroup_removed: true,
                    clear_gpus,
                    pod: pod_name(&st.ckpt, pod),
                    ..LimitSetRequest::default()
                };
                // No fallback: a limit the agent refuses leaves the pod unlimited, so the
                // error goes to the caller (a prepare fails; the reconciler says it).
                self.ask(Kind::LimitSet, serde_json::to_vec(&req)?)
                    .await
                    .with_context(|| format!("setting pod {pod}'s limit on {cg}"))?;
                tracing::info!(pod, cgroup = %cg, memory = ?limit.memory_bytes, compute = ?limit.compute_pct, park_after_ms = ?limit.park_after_ms, memory_gpus = ?limit.memory_gpus, compute_gpus = ?limit.compute_gpus, "pod limited");
                st.applied.insert(pod.to_string(), (cg, limit));
            }
            (Some(_), None) => {
                st.applied.remove(pod);
                let now = std::time::Instant::now();
                let (since, said) = st.missing.entry(pod.to_string()).or_insert_with(|| {
                    tracing::info!(
                        pod,
                        "the pod's cgroup does not exist yet: limited when it appears"
                    );
                    (now, false)
                });
                if !*said && now.duration_since(*since) >= MISSING_WARN {
                    *said = true;
                    tracing::warn!(
                        pod,
                        cgroup_parent = %self.cfg.cgroup_parent,
                        tried = ?fgpu_common::cgroup::naming::pod_cgroups(&self.cfg.cgroup_parent, pod),
                        "the pod's cgroup is still not found {} s after its claim was prepared: \
                         its GPU limit is not applied. If the kubelet runs with --cgroup-root \
                         (kind: /kubelet), give the plugin --cgroup-parent (chart: \
                         kubeletCgroupRoot)",
                        MISSING_WARN.as_secs()
                    );
                }
            }
            (None, Some(cg)) => {
                st.applied.remove(pod);
                st.missing.remove(pod);
                let req = TargetRequest { target: cg.clone() };
                if let Err(err) = self.ask(Kind::LimitRemove, serde_json::to_vec(&req)?).await {
                    tracing::debug!(pod, "removing the limit on {cg}: {err:#}");
                }
            }
            (None, None) => {
                st.applied.remove(pod);
                st.missing.remove(pod);
            }
        }
        Ok(())
    }

    /// One call to the agent. The client is a blocking socket call (a 10 s read timeout), so
    /// it runs on tokio's blocking pool: a busy or hung agent then holds the state lock (the
    /// driver's calls wait their turn) but no runtime thread. Made on a runtime thread, as
    /// it was, it stalled the plugin (issue 26): with one thread, both gRPC servers; with two
    /// workers too, as the other worker, parked on a condition variable, was not woken to
    /// drive I/O and timers (no connection accepted, GetInfo unanswered). `block_in_place`
    /// is not enough either: the reconciler runs on the thread that accepts both servers'
    /// connections, which it would block. Test: e2e_kubernetes_pod.rs,
    /// `privileged_a_hung_agent_does_not_stall_the_plugins_registration`.
    async fn ask(&self, kind: Kind, body: Vec<u8>) -> Result<Bytes> {
        let socket = self.cfg.admin_socket.clone();
        tokio::task::spawn_blocking(move || {
            crate::cli::client::request(&socket, kind, Bytes::from(body), Kind::LimitReply)
        })
        .await
        .context("the call to the agent")?
    }
}

/// The namespace and name of `pod`, from the claims prepared for it (the claim's namespace,
/// the pod's name from its `status.reservedFor`), for the agent's status report.
fn pod_name(ckpt: &Checkpoint, pod: &str) -> Option<PodName> {
    ckpt.claims.values().find_map(|p| {
        let name = p.plan.pod_names.get(pod)?;
        Some(PodName {
            namespace: p.plan.namespace.clone(),
            name: name.clone(),
        })
    })
}

/// [`Driver::pod_limit`] of the claims `plans`, `gpus` being fgpu's device names and GPUs and
/// `memory` their sizes (by device name).
///
/// Every value is one a GPU can hold, whatever the claims add up to: a GPU's own value is the
/// sum of the pod's claims there, and the plain value, which the agent applies to each GPU
/// without one of its own, is the sum of all the claims capped at the largest such GPU (at
/// the largest GPU of the node where the claims cover every GPU and it applies to none). A
/// tensor-parallel pod with 12 GiB on each of two 16 GiB GPUs asked 24 GiB on every GPU,
/// which the agent refuses as larger than the device.
fn pod_limit(
    gpus: &BTreeMap<String, spec::Gpu>,
    memory: &BTreeMap<String, u64>,
    plans: &[&Plan],
) -> Option<Limit> {
    if plans.is_empty() {
        return None;
    }
    let size_of = |uuid: &str| {
        gpus.iter()
            .find(|(_, g)| g.uuid == uuid)
            .and_then(|(name, _)| memory.get(name).copied())
    };
    let mut memory_gpus = BTreeMap::new();
    let mut compute_gpus = BTreeMap::new();
    let mut uuids: Vec<&str> = plans
        .iter()
        .filter_map(|p| gpus.get(&p.device).map(|g| g.uuid.as_str()))
        .collect();
    uuids.sort_unstable();
    uuids.dedup();
    for &uuid in &uuids {
        let here: Vec<&&Plan> = plans
            .iter()
            .filter(|p| gpus.get(&p.device).is_some_and(|g| g.uuid == uuid))
            .collect();
        if let Some(m) = here
            .iter()
            .try_fold(0u64, |acc, p| p.memory_bytes.map(|m| acc.saturating_add(m)))
        {
            // Not capped: the scheduler keeps a GPU's claims within it, so a larger sum is
            // refused by the agent and fails the prepare rather than held as the whole GPU.
            memory_gpus.insert(uuid.to_string(), m);
        }
        if let Some(c) = here
            .iter()
            .try_fold(0u32, |acc, p| p.compute_pct.map(|c| acc + u32::from(c)))
            .filter(|c| *c > 0 && *c < 100)
        {
            compute_gpus.insert(uuid.to_string(), c as u8);
        }
    }
    // The plain memory value applies to the GPUs of the node the pod has no claim on: no
    // more than the largest of them holds (where the claims cover the node it applies to
    // none, and is held to the largest GPU all the same).
    let others: Vec<&spec::Gpu> = gpus
        .values()
        .filter(|g| !uuids.contains(&g.uuid.as_str()))
        .collect();
    let pool = if others.is_empty() {
        gpus.values().collect()
    } else {
        others
    };
    let largest = pool.iter().filter_map(|g| size_of(&g.uuid)).max();
    let memory = plans
        .iter()
        .try_fold(0u64, |acc, p| p.memory_bytes.map(|m| acc.saturating_add(m)))
        .map(|m| largest.map_or(m, |size| m.min(size)));
    let compute = plans
        .iter()
        .try_fold(0u32, |acc, p| p.compute_pct.map(|c| acc + u32::from(c)))
        // 0: no share of its own; 100 or more: the whole GPU, nothing to hold.
        .filter(|c| *c > 0 && *c < 100)
        .map(|c| c as u8);
    // Parking moves the pod's memory on every GPU, so a pod is parkable when one of its
    // claims asks for it, after the longest `parkAfter` its claims give (none parks it
    // sooner than it asked). A claim without one leaves the pod's cgroup inheriting. The
    // agent keeps a field a request leaves unset, so a value once set stays on the pod's
    // cgroup (which goes with the pod) even if its parkable claim were unprepared before
    // the others; a kubelet unprepares a claim only once its last pod is gone.
    let park_after_ms = plans.iter().filter_map(|p| p.park_after_ms).max();
    Some(Limit {
        memory_bytes: memory,
        memory_gpus,
        compute_pct: compute,
        compute_gpus,
        compute_cap_pct: None,
        park_after_ms,
        ..Limit::default()
    })
}

/// The claim's CDI spec: one device named after the claim UID, with the shim, the
/// containers' socket and preload of fgpu's node spec, and the claim's GPU. No hook: the
/// limit is held on the pod's cgroup by the driver, not taken from the environment.
fn claim_spec(cfg: &Config, plan: &Plan, gpu: &spec::Gpu) -> Result<Vec<u8>> {
    let mut inputs = cfg.spec_inputs.clone();
    inputs.kind = cdi_kind(&cfg.driver);
    inputs.gpus = vec![gpu.clone()];
    let mut s = spec::build(&inputs);
    s.container_edits.hooks.clear();
    let mut edits = s
        .devices
        .iter()
        .find(|d| d.name == gpu.uuid)
        .map(|d| d.container_edits.clone())
        .unwrap_or_default();
    edits
        .env
        .push(format!("FGPU_CLAIM={}/{}", plan.namespace, plan.name));
    s.devices = vec![spec::Device {
        name: plan.uid.clone(),
        container_edits: edits,
    }];
    let mut json = serde_json::to_vec_pretty(&s)?;
    json.push(b'\n');
    Ok(json)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(uid: &str, device: &str, memory: Option<u64>, compute: Option<u8>) -> Plan {
        Plan {
            uid: uid.into(),
            namespace: "team-a".into(),
            name: uid.into(),
            pool: "node-1".into(),
            device: device.into(),
            requests: vec!["gpu".into()],
            memory_bytes: memory,
            compute_pct: compute,
            pods: vec!["pod-1".into()],
            pod_names: BTreeMap::new(),
            park_after_ms: None,
        }
    }

    fn gpus() -> BTreeMap<String, spec::Gpu> {
        (0..3)
            .map(|i| {
                let gpu = spec::Gpu {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    minor: i,
                };
                (format!("gpu-{i}"), gpu)
            })
            .collect()
    }

    const GIB: u64 = 1 << 30;

    /// Every GPU of [`gpus`] this size.
    fn sizes(each: u64) -> BTreeMap<String, u64> {
        gpus().into_keys().map(|name| (name, each)).collect()
    }

    #[test]
    fn claims_adding_up_past_one_gpu_give_values_each_gpu_can_hold() {
        // Two 16 GiB GPUs, 12 GiB claimed on each: 12 GiB per GPU, and a plain value (which
        // applies to no GPU here) no larger than a GPU; it was 24 GiB, refused by the agent.
        let two: BTreeMap<_, _> = gpus().into_iter().take(2).collect();
        let sizes2: BTreeMap<_, _> = sizes(16 * GIB).into_iter().take(2).collect();
        let a = plan("a", "gpu-0", Some(12 * GIB), Some(60));
        let b = plan("b", "gpu-1", Some(12 * GIB), Some(60));
        let l = pod_limit(&two, &sizes2, &[&a, &b]).unwrap();
        assert_eq!(
            l.memory_gpus,
            BTreeMap::from([("GPU-0".into(), 12 * GIB), ("GPU-1".into(), 12 * GIB)])
        );
        assert_eq!(l.memory_bytes, Some(16 * GIB), "no larger than a GPU");
        // A third GPU without claims: the sum, but no more than that GPU holds.
        let l = pod_limit(&gpus(), &sizes(16 * GIB), &[&a, &b]).unwrap();
        assert_eq!(l.memory_bytes, Some(16 * GIB));
        assert_eq!(l.memory_on("GPU-2"), Some(16 * GIB));
        assert_eq!(
            l.compute_pct, None,
            "120 %: the whole GPU, no share to hold"
        );
        // Unknown sizes (no NVML in the plugin): the sum, as the agent can judge it.
        let l = pod_limit(&gpus(), &BTreeMap::new(), &[&a, &b]).unwrap();
        assert_eq!(l.memory_bytes, Some(24 * GIB));
    }

    #[test]
    fn a_pods_name_comes_from_its_claims() {
        const UID: &str = "0c3d6f1e-2b4a-4c8e-9f00-00000000000a";
        let dir = std::env::temp_dir().join(format!("fgpu-podname-{}", std::process::id()));
        let mut ckpt = Checkpoint::load(&dir.join("kubelet-plugin-fgpu.io.json")).unwrap();
        let json = claim::tests::claim_json("c1", "claim-1", "8Gi", "30", &[UID]);
        let claim = serde_json::from_str(&json).unwrap();
        let plan = claim::plan(&claim, "fgpu.io", "c1").unwrap().unwrap();
        let prepared = Prepared {
            plan,
            cdi_ids: vec![],
            spec_file: dir.join("spec.json"),
        };
        ckpt.claims.insert("c1".into(), prepared);
        let want = PodName {
            namespace: "team-a".into(),
            name: format!("pod-{UID}"),
        };
        assert_eq!(pod_name(&ckpt, UID), Some(want));
        assert_eq!(
            pod_name(&ckpt, "11111111-2222-3333-4444-555555555555"),
            None
        );
        // A pod whose name the claim does not give (not an object name): none sent.
        let p = &mut ckpt.claims.get_mut("c1").unwrap().plan;
        p.pod_names.clear();
        assert_eq!(pod_name(&ckpt, UID), None);
    }

    #[test]
    fn each_gpu_gets_its_own_claims_and_the_rest_the_sum() {
        let a = plan("a", "gpu-0", Some(8 * GIB), Some(30));
        let b = plan("b", "gpu-1", Some(4 * GIB), Some(20));
        let c = plan("c", "gpu-1", Some(2 * GIB), Some(10));
        let l = pod_limit(&gpus(), &sizes(16 * GIB), &[&a, &b, &c]).unwrap();
        assert_eq!(l.memory_gpus.get("GPU-0"), Some(&(8 * GIB)));
        assert_eq!(l.memory_gpus.get("GPU-1"), Some(&(6 * GIB)));
        assert_eq!(l.memory_gpus.get("GPU-2"), None);
        assert_eq!(
            l.memory_bytes,
            Some(14 * GIB),
            "elsewhere: no more than in all"
        );
        assert_eq!(l.memory_on("GPU-2"), Some(14 * GIB));
        assert_eq!(l.compute_gpus.get("GPU-0"), Some(&30));
        assert_eq!(l.compute_gpus.get("GPU-1"), Some(&30));
        assert_eq!(l.compute_pct, Some(60));
        assert_eq!(l.park_after_ms, None, "no claim asked for parking");
        assert_eq!(pod_limit(&gpus(), &sizes(16 * GIB), &[]), None);
    }

    #[test]
    fn a_pod_is_parkable_after_the_longest_park_after_of_its_claims() {
        let mut a = plan("a", "gpu-0", Some(8 * GIB), Some(30));
        a.park_after_ms = Some(30_000);
        let l = pod_limit(&gpus(), &sizes(16 * GIB), &[&a]).unwrap();
        assert_eq!(l.park_after_ms, Some(30_000));
        assert_eq!(l.memory_bytes, Some(8 * GIB), "the rest as before");
        let mut b = plan("b", "gpu-1", Some(4 * GIB), Some(20));
        b.park_after_ms = Some(120_000);
        let c = plan("c", "gpu-1", Some(2 * GIB), None);
        let l = pod_limit(&gpus(), &sizes(16 * GIB), &[&a, &b, &c]).unwrap();
        assert_eq!(l.park_after_ms, Some(120_000));
    }

    #[test]
    fn a_whole_gpu_claim_lifts_that_gpus_memory_and_the_plain_one() {
        let a = plan("a", "gpu-0", Some(8 * GIB), Some(30));
        let whole = plan("w", "gpu-1", None, None);
        let l = pod_limit(&gpus(), &sizes(16 * GIB), &[&a, &whole]).unwrap();
        assert_eq!(
            l.memory_gpus,
            BTreeMap::from([("GPU-0".to_string(), 8 * GIB)])
        );
        assert_eq!(l.memory_bytes, None);
        assert_eq!(l.memory_on("GPU-1"), None);
        assert_eq!(l.compute_gpus, BTreeMap::from([("GPU-0".to_string(), 30)]));
        assert_eq!(l.compute_pct, None);
    }
}
