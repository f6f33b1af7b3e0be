//! The URL and file manifest sources against a real HTTP server on loopback and a real directory.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use hostlet_api::validation::SourceKind;
use hostlet_controllers::sources::url::{fetch, UrlSourceConfig};
use hostlet_controllers::sources::{file, url, Merger};
use tokio_util::sync::CancellationToken;

const POD_A: &str = "version: v1beta1\nid: url-a\ncontainers: [{name: c, image: busybox}]\n";

type Answer = Arc<Mutex<(StatusCode, String)>>;

static HITS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

async fn serve(answer: Answer) -> (String, CancellationToken) {
    let app = Router::new().route(
        "/pods",
        get(move |headers: axum::http::HeaderMap| {
            let answer = answer.clone();
            async move {
                HITS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if headers.get("x-token").map(|v| v.as_bytes()) != Some(b"secret") {
                    return (StatusCode::FORBIDDEN, "no token".to_string());
                }
                answer.lock().unwrap().clone()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { s.cancelled().await })
            .await
            .unwrap();
    });
    (format!("http://{addr}/pods"), stop)
}

fn cfg(url: &str) -> UrlSourceConfig {
    let mut c = UrlSourceConfig::new(url);
    c.headers = vec!["X-Token: secret".into()];
    c.period = Duration::from_millis(200);
    c.timeout = Duration::from_secs(2);
    c
}

#[tokio::test]
async fn every_bad_answer_is_an_error_naming_the_url() {
    let answer: Answer = Arc::new(Mutex::new((StatusCode::OK, POD_A.into())));
    let (url, stop) = serve(answer.clone()).await;
    let client = reqwest::Client::new();
    assert_eq!(fetch(&client, &cfg(&url)).await.unwrap().len(), 1);
    *answer.lock().unwrap() = (StatusCode::OK, "[]".into());
    assert_eq!(
        fetch(&client, &cfg(&url)).await.unwrap().len(),
        0,
        "an empty list is a valid empty set"
    );
    for (status, body, needle) in [
        (StatusCode::INTERNAL_SERVER_ERROR, "boom".to_string(), "500"),
        (
            StatusCode::OK,
            "<html><body>Not here</body></html>".to_string(),
            "expected a manifest",
        ),
        (
            StatusCode::OK,
            POD_A.replace("version: v1beta1\n", ""),
            "blank version",
        ),
    ] {
        *answer.lock().unwrap() = (status, body);
        let e = fetch(&client, &cfg(&url)).await.unwrap_err();
        assert!(e.contains(&url) && e.contains(needle), "{e}");
    }
    let mut no_header = cfg(&url);
    no_header.headers.clear();
    assert!(fetch(&client, &no_header)
        .await
        .unwrap_err()
        .contains("403"));
    stop.cancel();
    let down = fetch(&client, &cfg("http://127.0.0.1:9/pods"))
        .await
        .unwrap_err();
    assert!(down.contains("127.0.0.1:9"), "{down}");
}

#[tokio::test]
async fn url_errors_keep_the_last_good_set() {
    let answer: Answer = Arc::new(Mutex::new((StatusCode::OK, POD_A.into())));
    let (url, _stop) = serve(answer.clone()).await;
    let (merger, sink) = Merger::new(vec![SourceKind::Url]);
    let merged = merger.merged();
    let shutdown = CancellationToken::new();
    tokio::spawn(merger.run(shutdown.clone()));
    tokio::spawn(url::run(cfg(&url), sink, None, shutdown.clone()));
    merged.wait_all_synced().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while merged.store.get(&"url-a".to_string()).is_none() {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    *answer.lock().unwrap() = (StatusCode::INTERNAL_SERVER_ERROR, "down".into());
    // Wait for three failed polls.
    let seen = HITS.load(std::sync::atomic::Ordering::SeqCst);
    while HITS.load(std::sync::atomic::Ordering::SeqCst) < seen + 3 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        merged.store.get(&"url-a".to_string()).is_some(),
        "last good set kept through errors"
    );
    *answer.lock().unwrap() = (StatusCode::OK, "[]".into());
    while merged.store.get(&"url-a".to_string()).is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "an empty list takes the pods down"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
}

#[tokio::test]
async fn editor_style_save_applies_exactly_one_update() {
    let dir = tempfile::tempdir().unwrap();
    let (merger, sink) = Merger::new(vec![SourceKind::File]);
    let merged = merger.merged();
    let mut changes = merged.store.subscribe();
    let shutdown = CancellationToken::new();
    tokio::spawn(merger.run(shutdown.clone()));
    tokio::spawn(file::run(
        dir.path().to_path_buf(),
        sink,
        None,
        shutdown.clone(),
    ));
    merged.wait_all_synced().await;

    // Write a swap file and a temp file, then rename the temp file into place, as editors do.
    std::fs::write(dir.path().join(".web.yaml.swp"), b"garbage").unwrap();
    let tmp = dir.path().join("web.yaml.tmp");
    std::fs::write(&tmp, POD_A.replace("url-a", "web")).unwrap();
    std::fs::rename(&tmp, dir.path().join("web.yaml")).unwrap();

    let batch = tokio::time::timeout(Duration::from_secs(10), changes.next_batch())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(batch, vec!["web".to_string()]);
    // Nothing else arrives: the swap file and the temp file were ignored, the rename read once.
    assert!(
        tokio::time::timeout(Duration::from_millis(800), changes.next_batch())
            .await
            .is_err()
    );
    assert_eq!(
        merged
            .store
            .get(&"web".to_string())
            .unwrap()
            .manifest
            .containers[0]
            .image,
        "busybox"
    );
    assert!(merged.rejected().is_empty(), "{:?}", merged.rejected());
    shutdown.cancel();
}

#[tokio::test]
async fn an_answer_over_the_size_cap_is_refused_and_the_last_good_set_kept() {
    let answer: Answer = Arc::new(Mutex::new((StatusCode::OK, POD_A.into())));
    let (url, _stop) = serve(answer.clone()).await;
    let mut capped = cfg(&url);
    capped.max_bytes = 4096;
    let (merger, sink) = Merger::new(vec![SourceKind::Url]);
    let merged = merger.merged();
    let shutdown = CancellationToken::new();
    tokio::spawn(merger.run(shutdown.clone()));
    tokio::spawn(url::run(capped.clone(), sink, None, shutdown.clone()));
    merged.wait_all_synced().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while merged.store.get(&"url-a".to_string()).is_none() {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A valid answer padded past the cap: refused whole, not read.
    let big = format!("{POD_A}# {}\n", "x".repeat(8192));
    *answer.lock().unwrap() = (StatusCode::OK, big);
    let e = fetch(&reqwest::Client::new(), &capped).await.unwrap_err();
    assert!(
        e.contains("--manifest-url-max-bytes") && e.contains(&url),
        "{e}"
    );
    let seen = HITS.load(std::sync::atomic::Ordering::SeqCst);
    while HITS.load(std::sync::atomic::Ordering::SeqCst) < seen + 3 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        merged.store.get(&"url-a".to_string()).is_some(),
        "last good set kept when the answer is too big"
    );
    // Under the default cap the same answer is read.
    let mut roomy = capped.clone();
    roomy.max_bytes = hostlet_controllers::sources::url::DEFAULT_MAX_BYTES;
    assert_eq!(
        fetch(&reqwest::Client::new(), &roomy).await.unwrap().len(),
        1
    );
    shutdown.cancel();
}
