//! The unit tests of [`super`]: the drain's stages, its deadline, and writers stopped mid-write.
use std::sync::{Arc, Mutex};

use super::*;

type Log = Arc<Mutex<Vec<&'static str>>>;

fn say(log: &Log, what: &'static str) {
    log.lock().unwrap().push(what);
}

#[tokio::test(start_paused = true)]
async fn tasks_that_end_when_told_are_all_reported_finished_at_once() {
    let stop = CancellationToken::new();
    let mut tasks = TaskSet::new(&stop);
    for stage in Stage::ALL {
        let token = tasks.token(stage);
        tasks.spawn(stage, format!("{stage:?}"), async move {
            token.cancelled().await
        });
    }
    let started = Instant::now();
    let drained = tasks.drain(Duration::from_secs(5)).await;
    assert_eq!(
        drained.finished,
        vec!["Controllers", "Writers", "Caches", "Lease"]
    );
    assert!(drained.unfinished.is_empty());
    assert_eq!(started.elapsed(), Duration::ZERO);
    // Drained once: a second drain waits for nothing.
    assert_eq!(
        tasks.drain(Duration::from_secs(5)).await,
        Drained::default()
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_that_ignores_its_stop_is_named_at_the_deadline() {
    let stop = CancellationToken::new();
    let mut tasks = TaskSet::new(&stop);
    tasks.spawn(Stage::Writers, "stuck", std::future::pending::<()>());
    let token = tasks.token(Stage::Caches);
    tasks.spawn(Stage::Caches, "hub", async move { token.cancelled().await });
    let started = Instant::now();
    let drained = tasks.drain(Duration::from_secs(5)).await;
    assert_eq!(drained.unfinished, vec!["stuck"]);
    assert_eq!(drained.finished, vec!["hub"]);
    // One deadline for the whole drain; the stage after it is not held up further by a task that ends.
    assert_eq!(started.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn stages_are_told_to_stop_one_after_the_other() {
    let stop = CancellationToken::new();
    let mut tasks = TaskSet::new(&stop);
    let log: Log = Arc::default();
    {
        let (token, log) = (tasks.token(Stage::Controllers), log.clone());
        tasks.spawn(Stage::Controllers, "controller", async move {
            token.cancelled().await;
            // The reconcile under way needs 2 s more.
            tokio::time::sleep(Duration::from_secs(2)).await;
            say(&log, "controller done");
        });
    }
    {
        let (token, log) = (tasks.token(Stage::Writers), log.clone());
        tasks.spawn(Stage::Writers, "renewal", async move {
            token.cancelled().await;
            say(&log, "writer told");
            tokio::time::sleep(Duration::from_secs(1)).await;
            say(&log, "writer done");
        });
    }
    {
        let (token, log) = (tasks.token(Stage::Caches), log.clone());
        tasks.spawn(Stage::Caches, "informer", async move {
            token.cancelled().await;
            say(&log, "cache told");
        });
    }
    // The process's stop reaches the controllers alone.
    stop.cancel();
    tokio::task::yield_now().await;
    assert!(tasks.token(Stage::Controllers).is_cancelled());
    assert!(!tasks.token(Stage::Writers).is_cancelled());
    assert!(!tasks.token(Stage::Caches).is_cancelled());
    let drained = tasks.drain(Duration::from_secs(8)).await;
    assert_eq!(
        *log.lock().unwrap(),
        vec![
            "controller done",
            "writer told",
            "writer done",
            "cache told"
        ]
    );
    assert_eq!(drained.finished, vec!["controller", "renewal", "informer"]);
    assert!(drained.unfinished.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_stage_after_the_deadline_still_gets_its_floor() {
    let stop = CancellationToken::new();
    let mut tasks = TaskSet::new(&stop);
    tasks.spawn(
        Stage::Controllers,
        "slow controller",
        std::future::pending::<()>(),
    );
    let token = tasks.token(Stage::Writers);
    tasks.spawn(Stage::Writers, "crl", async move {
        token.cancelled().await;
        tokio::time::sleep(STAGE_FLOOR / 2).await;
    });
    let drained = tasks.drain(Duration::from_secs(1)).await;
    assert_eq!(drained.unfinished, vec!["slow controller"]);
    assert_eq!(drained.finished, vec!["crl"]);
}

#[tokio::test(start_paused = true)]
async fn a_result_is_handed_back_once_its_task_ends() {
    let mut tasks = TaskSet::new(&CancellationToken::new());
    let rx = tasks.spawn_with_result(Stage::Controllers, "rejoin target", async { Some(7) });
    let drained = tasks.drain(Duration::from_secs(1)).await;
    assert_eq!(drained.finished, vec!["rejoin target"]);
    assert_eq!(rx.await.ok().flatten(), Some(7));
}

/// A writer stopped by the agent's drain in the middle of a write: the drain waits for it, and the file
/// is the old one while it writes and the new one after, never part of one.
#[tokio::test]
async fn a_stop_in_the_middle_of_a_write_waits_for_it_and_tears_no_file() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("server.crt");
    crate::files::write_atomic(&path, b"old certificate\n", 0o644).unwrap();
    let (half, half_rx) = std::sync::mpsc::channel();
    let go = Arc::new(tokio::sync::Notify::new());
    let mut tasks = TaskSet::new(&CancellationToken::new());
    {
        let (path, go) = (path.clone(), go.clone());
        let handle = tokio::runtime::Handle::current();
        tasks.spawn(Stage::Writers, "renewal", async move {
            let written = tokio::task::spawn_blocking(move || {
                crate::files::write_atomic_with(&path, 0o644, |f| {
                    f.write_all(b"new ")?;
                    half.send(()).unwrap();
                    // The test holds the writer here until the drain has begun.
                    handle.block_on(go.notified());
                    f.write_all(b"certificate\n")
                })
            })
            .await;
            written.unwrap().unwrap();
        });
    }
    tokio::task::spawn_blocking(move || half_rx.recv().unwrap())
        .await
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"old certificate\n");
    let release = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(std::fs::read(&path).unwrap(), b"old certificate\n");
        go.notify_one();
    };
    let (drained, ()) = tokio::join!(tasks.drain(Duration::from_secs(5)), release);
    assert_eq!(drained.finished, vec!["renewal"]);
    assert!(drained.unfinished.is_empty());
    assert_eq!(std::fs::read(&path).unwrap(), b"new certificate\n");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("server.crt")]);
}

/// The revocation list's keeper, stopped while it writes: the drain reports it finished and the list
/// on disk is whole.
#[tokio::test]
async fn the_crl_keeper_stopped_at_once_leaves_a_whole_list() {
    use hostlet_api::objects::NodeCertificates;
    use hostlet_runtime::informer::Object;
    use hostlet_runtime::store::{Event, Writer};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("revoked.crl");
    let ca = crate::pki::ClusterCa::generate().unwrap();
    let mut w: Writer<String, Object<NodeCertificates>> = Writer::new();
    let revoked = NodeCertificates {
        revoked: vec!["0a".into(), "0b".into()],
        ..Default::default()
    };
    w.apply_all([
        Event::Init,
        Event::InitApply(
            "/hostlet/certs/w1".to_string(),
            Arc::new(Object::fresh("/hostlet/certs/w1", Ok(revoked))),
        ),
        Event::InitDone,
    ]);
    let revocations = crate::pki::Revocations::new(w.store());
    let mut tasks = TaskSet::new(&CancellationToken::new());
    let token = tasks.token(Stage::Writers);
    tasks.spawn(
        Stage::Writers,
        "revocation list",
        crate::pki::keep_crl(revocations, Arc::new(ca.clone()), path.clone(), token),
    );
    // Let the keeper begin its write, then stop it.
    tokio::task::yield_now().await;
    let drained = tasks.drain(Duration::from_secs(5)).await;
    assert_eq!(drained.finished, vec!["revocation list"]);
    assert!(drained.unfinished.is_empty());
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("revoked.crl")]);
    let pem = std::fs::read_to_string(&path).unwrap();
    assert!(
        pem.starts_with("-----BEGIN X509 CRL-----")
            && pem.trim_end().ends_with("-----END X509 CRL-----"),
        "{pem}"
    );
}
