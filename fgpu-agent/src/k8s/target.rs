//! `pod:` TARGETs for the CLI (`fgpu limit set pod:NAMESPACE/NAME`, `pod:UID`), resolved here
//! to the pod's cgroup before the request goes to the agent: `pod:UID` by the kubelet's cgroup
//! names, `pod:NAMESPACE/NAME` by asking the API server for the pod's UID (in a pod: its
//! service account; else $KUBECONFIG or ~/.kube/config; `FGPU_API_SERVER=URL` for a plain
//! URL such as `kubectl proxy`'s). `FGPU_KUBEPODS_PARENT` names the cgroup holding kubepods
//! (default the root). Other TARGETs pass through unchanged.

use anyhow::{Context, Result, bail};

use super::podcgroup;

pub fn resolve(target: &str) -> Result<String> {
    let Some(pod) = target.trim().strip_prefix("pod:") else {
        return Ok(target.to_string());
    };
    let uid = match pod.split_once('/') {
        None if fgpu_common::cgroup::naming::is_pod_uid(pod) => pod.to_string(),
        None => bail!("'{target}': give pod:NAMESPACE/NAME or pod:UID"),
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            pod_uid(ns, name).with_context(|| format!("'{target}': finding the pod"))?
        }
        Some(_) => bail!("'{target}': give pod:NAMESPACE/NAME or pod:UID"),
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mount = fgpu_common::cgroup::cgroup2_mount(&mountinfo)
        .context("no cgroup v2 hierarchy is mounted")?;
    let parent = std::env::var("FGPU_KUBEPODS_PARENT").unwrap_or_else(|_| "/".into());
    podcgroup::find(&mount, &parent, &uid).with_context(|| {
        format!(
            "'{target}': pod {uid} has no cgroup on this node (not running here? looked under {} for the \
             systemd and cgroupfs layouts)",
            mount.join(parent.trim_start_matches('/')).display()
        )
    })
}

fn pod_uid(namespace: &str, name: &str) -> Result<String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = match std::env::var("FGPU_API_SERVER") {
            Ok(url) => kube::Client::try_from(super::config_for(url.parse::<http::Uri>()?))?,
            Err(_) => kube::Client::try_default()
                .await
                .context("no API server (set FGPU_API_SERVER or KUBECONFIG)")?,
        };
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(client, namespace);
        let pod = pods.get(name).await?;
        pod.metadata.uid.context("the pod has no UID")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(resolve("/kubepods.slice").unwrap(), "/kubepods.slice");
        assert_eq!(resolve("pid:1").unwrap(), "pid:1");
        for bad in ["pod:", "pod:x", "pod:/name", "pod:ns/", "pod:a/b/c"] {
            assert!(
                resolve(bad)
                    .unwrap_err()
                    .to_string()
                    .contains("pod:NAMESPACE/NAME"),
                "{bad}"
            );
        }
        let err = format!(
            "{:#}",
            resolve("pod:0c3d6f1e-2b4a-4c8e-9f00-999999999999").unwrap_err()
        );
        assert!(err.contains("no cgroup on this node"), "{err}");
    }
}
