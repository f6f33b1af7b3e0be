//! Clients of the cluster from the root namespace: reads and a steady writer.

use super::*;

/// A Kubernetes v1 Pod that sleeps: one app container beside the infra one.
pub const SLEEPER: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: sleeper}\nspec:\n  containers:\n  - name: main\n    image: busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [sleep, \"86400\"]\n";

/// A client for the cluster from the root namespace, with a host's client certificate.
pub struct Client {
    pub rt: tokio::runtime::Runtime,
    tls: hostlet_runtime::TlsFiles,
}

impl Client {
    pub fn new(via: &Host) -> Client {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("tokio: {e}"));
        // Copies: a rejoin may issue the host's certificates again; the CA stays.
        let dir = via.dir.join("test-client-tls");
        let _ = std::fs::create_dir_all(&dir);
        for f in ["ca.crt", "client.crt", "client.key"] {
            std::fs::copy(via.tls_file(f), dir.join(f))
                .unwrap_or_else(|e| panic!("{}: {e}", via.tls_file(f).display()));
        }
        Client {
            rt,
            tls: hostlet_runtime::TlsFiles {
                ca: dir.join("ca.crt"),
                cert: dir.join("client.crt"),
                key: dir.join("client.key"),
            },
        }
    }

    pub fn config(&self, endpoints: &[String], timeout: Duration) -> hostlet_runtime::EtcdConfig {
        let mut c =
            hostlet_runtime::EtcdConfig::new(endpoints.iter().cloned()).with_tls(self.tls.clone());
        c.connect_timeout = timeout;
        c.request_timeout = timeout;
        c
    }

    /// A client of exactly these endpoints.
    pub fn connect(&self, endpoints: &[String], timeout: Duration) -> hostlet_runtime::Etcd {
        let cfg = self.config(endpoints, timeout);
        self.rt
            .block_on(hostlet_runtime::Etcd::connect(cfg))
            .unwrap_or_else(|e| panic!("etcd client: {e}"))
    }

    /// What the member at `endpoint` says: (cluster id, member id, leader, raft index), `None` when it
    /// does not answer.
    pub fn status(&self, endpoint: &str) -> Option<(u64, u64, u64, u64)> {
        let etcd = self.connect(&[endpoint.to_string()], Duration::from_secs(2));
        let s = self.rt.block_on(etcd.status_of(endpoint)).ok()?;
        let h = s.header()?;
        Some((h.cluster_id(), h.member_id(), s.leader(), s.raft_index()))
    }

    /// (name, id, is learner) of every member, as the member at `endpoint` knows them.
    pub fn members(&self, endpoint: &str) -> Option<Vec<(String, u64, bool)>> {
        let etcd = self.connect(&[endpoint.to_string()], Duration::from_secs(2));
        let ms = self.rt.block_on(etcd.member_list_of(endpoint)).ok()?;
        Some(
            ms.iter()
                .map(|m| (m.name().to_string(), m.id(), m.is_learner()))
                .collect(),
        )
    }

    /// The keys under `prefix` in the member at `endpoint`'s own copy (a serializable read: what that
    /// member holds, leader or not).
    pub fn local_keys(&self, endpoint: &str, prefix: &str) -> Option<BTreeSet<String>> {
        let etcd = self.connect(&[endpoint.to_string()], Duration::from_secs(5));
        let mut kv = etcd.client().kv_client();
        let opts = etcd_client::GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_serializable();
        let r = self
            .rt
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(5), kv.get(prefix, Some(opts))).await
            })
            .ok()?
            .ok()?;
        Some(
            r.kvs()
                .iter()
                .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                .collect(),
        )
    }

    /// The values under `prefix`, read through the cluster.
    pub fn values(&self, endpoints: &[String], prefix: &str) -> Vec<String> {
        let etcd = self.connect(endpoints, Duration::from_secs(5));
        self.rt
            .block_on(etcd.get_prefix(prefix))
            .map(|(kvs, _)| {
                kvs.iter()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn put(&self, endpoints: &[String], key: &str, value: &str) -> Result<(), String> {
        let etcd = self.connect(endpoints, Duration::from_secs(5));
        self.rt
            .block_on(etcd.put(key, value.as_bytes().to_vec()))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// Puts a key every ~100 ms through the cluster's endpoints and records each one it got an OK for.
pub struct Writer {
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    /// Puts begun and finished: equal when none is in flight.
    begun: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
    pub acked: Arc<Mutex<Vec<String>>>,
    pub failed: Arc<AtomicU64>,
    pub prefix: String,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    pub fn start(cfg: hostlet_runtime::EtcdConfig, prefix: &str) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let begun = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicU64::new(0));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(AtomicU64::new(0));
        let (s, a, f, p) = (
            stop.clone(),
            acked.clone(),
            failed.clone(),
            prefix.to_string(),
        );
        let (pa, b, d) = (paused.clone(), begun.clone(), done.clone());
        let thread = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(etcd) = hostlet_runtime::Etcd::connect(cfg).await else {
                    return;
                };
                let mut seq: u64 = 0;
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !s.load(Ordering::SeqCst) {
                    tick.tick().await;
                    // Counted as begun before the pause is looked at, so that `pause` never misses a
                    // put about to start.
                    b.fetch_add(1, Ordering::SeqCst);
                    if pa.load(Ordering::SeqCst) {
                        d.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    seq += 1;
                    let key = format!("{p}/{seq:09}");
                    let put = etcd.put(&key, seq.to_string().into_bytes());
                    match tokio::time::timeout(Duration::from_secs(5), put).await {
                        Ok(Ok(_)) => a.lock().unwrap_or_else(|e| e.into_inner()).push(key),
                        _ => {
                            f.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    d.fetch_add(1, Ordering::SeqCst);
                }
            });
        });
        Writer {
            stop,
            paused,
            begun,
            done,
            acked,
            failed,
            prefix: prefix.to_string(),
            thread: Some(thread),
        }
    }

    pub fn acked(&self) -> Vec<String> {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops putting; returns once no put is in flight.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        crate::member_support::eventually(
            "the writer's put in flight",
            Duration::from_secs(10),
            || {
                (self.begun.load(Ordering::SeqCst) == self.done.load(Ordering::SeqCst))
                    .then_some(())
            },
        );
    }

    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop();
    }
}
