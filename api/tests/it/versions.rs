//! `GET /kubernetes-versions`: every release the API offers, the default first, with what a
//! node of each runs and where each download comes from — the catalog's pinned URL and digest,
//! or upstream with none. Operators only.

use exk8s_api_types::KubernetesVersionView;

use crate::app::{Backend, both_backends, spawn_with, test_config};

const DIGEST: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

async fn offered_releases_name_their_components_and_downloads(backend: Backend) {
    let catalog = exk8s_api::render::ArtifactCatalog::parse(&format!(
        "[[artifact]]\nname = \"kubelet\"\nversion = \"v1.34.6\"\n\
         url = \"https://mirror.example/kubelet-v1.34.6\"\nsha256 = \"{DIGEST}\"\n"
    ))
    .unwrap();
    let config = exk8s_api::app::ApiConfig {
        artifacts: catalog,
        ..test_config()
    };
    let app = spawn_with(backend, config, None).await;

    let answer = app.get("/kubernetes-versions").send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let offered: Vec<KubernetesVersionView> = answer.json().await.unwrap();
    let releases: Vec<(&str, bool)> = offered
        .iter()
        .map(|o| (o.version.as_str(), o.default))
        .collect();
    assert_eq!(releases, [("v1.35.3", true), ("v1.34.6", false)]);
    let download = |release: usize, name: &str| {
        offered[release]
            .downloads
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("{name} of {}", offered[release].version))
    };
    let pinned = download(1, "kubelet");
    assert_eq!(pinned.url, "https://mirror.example/kubelet-v1.34.6");
    assert_eq!(pinned.sha256.as_deref(), Some(DIGEST));
    let upstream = download(0, "kubelet");
    assert_eq!(
        upstream.url,
        "https://dl.k8s.io/release/v1.35.3/bin/linux/amd64/kubelet"
    );
    assert_eq!(upstream.sha256, None);
    assert_eq!(download(0, "etcd").version, offered[0].etcd);
    for name in ["etcd", "etcdctl", "kubelet", "kubectl", "helm"] {
        download(0, name);
    }

    let anonymous = reqwest::get(format!("{}/kubernetes-versions", app.url))
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
}

both_backends!(offered_releases_name_their_components_and_downloads);
