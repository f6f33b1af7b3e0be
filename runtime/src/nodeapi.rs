//! The informer's [`ListWatch`] over a voter's node API instead of etcd: what a worker's informers use to
//! reach the cluster through the voters. The voter lists and watches etcd for it (after deciding whether
//! the calling node may), and this side turns its answers back into the informer's pages and events, so an
//! informer cannot tell the two apart.
//!
//! - `GET /node/v1/list?prefix=P&revision=R[&from=F]`: one page, [`WirePage`]; 410 when `R` is compacted;
//! - `GET /node/v1/watch?prefix=P&revision=R`: one [`WireItem`] per line (JSON), as etcd's watch answers,
//!   and an empty one every [`HEARTBEAT`] while nothing changes;
//! - `key=K` instead of `prefix=P`: that key alone.
//!
//! Keys and values travel as base64 (a value may be any bytes). A failed request goes to the next voter
//! the next time; a watch resumes there from its revision.

use std::sync::atomic::{AtomicUsize, Ordering};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::etcd::EtcdError;
use crate::informer::{ListWatch, Page, RawEvent, RawKv, WatchItem};

/// How often a watch with nothing to say sends an empty line.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(30);
/// A watch silent for this long is given up (its voter may be gone without a word) and opened again.
pub const WATCH_IDLE: std::time::Duration = std::time::Duration::from_secs(95);

/// A key-value on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireKv {
    pub key: String,
    pub value: String,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

impl From<&RawKv> for WireKv {
    fn from(kv: &RawKv) -> Self {
        WireKv {
            key: kv.key.clone(),
            value: B64.encode(&kv.value),
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
        }
    }
}

impl WireKv {
    fn raw(self) -> Result<RawKv, String> {
        Ok(RawKv {
            value: B64
                .decode(&self.value)
                .map_err(|e| format!("{}: value: {e}", self.key))?,
            key: self.key,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
            lease: self.lease,
        })
    }
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WirePage {
    pub revision: i64,
    pub kvs: Vec<WireKv>,
    /// Where the next page starts (base64), if there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

impl From<&Page> for WirePage {
    fn from(p: &Page) -> Self {
        WirePage {
            revision: p.revision,
            kvs: p.kvs.iter().map(WireKv::from).collect(),
            next: p.next.as_ref().map(|n| B64.encode(n)),
        }
    }
}

/// One change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum WireEvent {
    Put { kv: WireKv },
    Delete { key: String, revision: i64 },
}

/// One line of a watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum WireItem {
    Events { events: Vec<WireEvent> },
    Compacted { revision: i64 },
}

impl From<&WatchItem> for WireItem {
    fn from(w: &WatchItem) -> Self {
        match w {
            WatchItem::Events(events) => WireItem::Events {
                events: events
                    .iter()
                    .map(|e| match e {
                        RawEvent::Put(kv) => WireEvent::Put { kv: kv.into() },
                        RawEvent::Delete { key, revision } => WireEvent::Delete {
                            key: key.clone(),
                            revision: *revision,
                        },
                    })
                    .collect(),
            },
            WatchItem::Compacted(r) => WireItem::Compacted { revision: *r },
        }
    }
}

impl WireItem {
    fn item(self) -> Result<WatchItem, String> {
        Ok(match self {
            WireItem::Compacted { revision } => WatchItem::Compacted(revision),
            WireItem::Events { events } => WatchItem::Events(
                events
                    .into_iter()
                    .map(|e| {
                        Ok(match e {
                            WireEvent::Put { kv } => RawEvent::Put(kv.raw()?),
                            WireEvent::Delete { key, revision } => {
                                RawEvent::Delete { key, revision }
                            }
                        })
                    })
                    .collect::<Result<_, String>>()?,
            ),
        })
    }
}

fn failed(url: &str, why: impl std::fmt::Display) -> EtcdError {
    EtcdError::unavailable(url, etcd_client::Error::InvalidArgs(why.to_string()))
}

/// [`ListWatch`] of one prefix through the node API of any of `urls` (the voters' API URLs).
pub struct NodeApiListWatch {
    client: reqwest::Client,
    urls: Vec<String>,
    /// `prefix` or `key`, and its value.
    scope: (&'static str, String),
    next: AtomicUsize,
}

impl NodeApiListWatch {
    /// `client` carries the node's certificate and trusts the cluster CA.
    pub fn new(client: reqwest::Client, urls: Vec<String>, prefix: impl Into<String>) -> Self {
        NodeApiListWatch {
            client,
            urls,
            scope: ("prefix", prefix.into()),
            next: AtomicUsize::new(0),
        }
    }

    /// The same for one key (a policy, a request), where a node may read the key but not a prefix.
    pub fn for_key(client: reqwest::Client, urls: Vec<String>, key: impl Into<String>) -> Self {
        NodeApiListWatch {
            scope: ("key", key.into()),
            ..NodeApiListWatch::new(client, urls, String::new())
        }
    }

    fn url(&self) -> Result<&str, EtcdError> {
        if self.urls.is_empty() {
            return Err(EtcdError::NoEndpoints);
        }
        Ok(&self.urls[self.next.load(Ordering::Relaxed) % self.urls.len()])
    }

    /// The next request goes to the next voter.
    fn rotate(&self) {
        self.next.fetch_add(1, Ordering::Relaxed);
    }

    async fn get(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<reqwest::Response, EtcdError> {
        let base = self.url()?.to_string();
        let sent = self
            .client
            .get(format!("{base}{path}"))
            .query(query)
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                self.rotate();
                return Err(failed(&base, e));
            }
        };
        if resp.status() == reqwest::StatusCode::GONE {
            let revision = query
                .iter()
                .find(|(k, _)| *k == "revision")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            return Err(EtcdError::Compacted {
                revision,
                source: Box::new(etcd_client::Error::InvalidArgs("compacted".into())),
            });
        }
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            // A refusal is the same on every voter; anything else may be this voter's alone.
            if status.is_server_error() {
                self.rotate();
            }
            return Err(failed(&base, format!("{status}: {}", body.trim())));
        }
        Ok(resp)
    }
}

impl ListWatch for NodeApiListWatch {
    type Watch = BoxStream<'static, Result<WatchItem, EtcdError>>;

    async fn list(&self, from: Option<&[u8]>, revision: i64) -> Result<Page, EtcdError> {
        let mut query = vec![
            (self.scope.0, self.scope.1.clone()),
            ("revision", revision.to_string()),
        ];
        if let Some(f) = from {
            query.push(("from", B64.encode(f)));
        }
        let resp = self.get("/node/v1/list", &query).await?;
        let base = self.url()?.to_string();
        let page: WirePage = resp.json().await.map_err(|e| failed(&base, e))?;
        Ok(Page {
            revision: page.revision,
            kvs: page
                .kvs
                .into_iter()
                .map(WireKv::raw)
                .collect::<Result<_, _>>()
                .map_err(|e| failed(&base, e))?,
            next: match page.next {
                Some(n) => Some(B64.decode(n).map_err(|e| failed(&base, e))?),
                None => None,
            },
        })
    }

    async fn watch(&self, start_revision: i64) -> Result<Self::Watch, EtcdError> {
        let query = [
            (self.scope.0, self.scope.1.clone()),
            ("revision", start_revision.to_string()),
        ];
        let resp = self.get("/node/v1/watch", &query).await?;
        let base = self.url()?.to_string();
        let bytes = resp.bytes_stream();
        // Lines may arrive split across chunks: keep the unfinished one.
        let lines = futures::stream::unfold(
            (bytes, Vec::<u8>::new(), base),
            |(mut bytes, mut buf, base)| async move {
                loop {
                    if let Some(i) = buf.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buf.drain(..=i).collect();
                        let item = serde_json::from_slice::<WireItem>(&line)
                            .map_err(|e| e.to_string())
                            .and_then(WireItem::item)
                            .map_err(|e| failed(&base, e));
                        return Some((item, (bytes, buf, base)));
                    }
                    match tokio::time::timeout(WATCH_IDLE, bytes.next()).await {
                        Ok(Some(Ok(chunk))) => buf.extend_from_slice(&chunk),
                        Ok(Some(Err(e))) => {
                            let e = failed(&base, e);
                            return Some((Err(e), (bytes, Vec::new(), base)));
                        }
                        Ok(None) => return None,
                        Err(_) => {
                            let e = failed(&base, "the watch was silent past its heartbeat");
                            return Some((Err(e), (bytes, Vec::new(), base)));
                        }
                    }
                }
            },
        );
        Ok(lines.boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_items_survive_the_wire_with_any_bytes() {
        let kv = RawKv {
            key: "/hostlet/hosts/w1/pods/a".into(),
            value: vec![0, 159, 146, 150, b'\n'],
            create_revision: 3,
            mod_revision: 5,
            version: 2,
            lease: 7,
        };
        let page = Page {
            revision: 9,
            kvs: vec![kv.clone()],
            next: Some(b"/hostlet/hosts/w1/pods/a\0".to_vec()),
        };
        let wire = serde_json::to_string(&WirePage::from(&page)).unwrap();
        let back: WirePage = serde_json::from_str(&wire).unwrap();
        assert_eq!(back.kvs[0].clone().raw().unwrap(), kv);
        assert_eq!(B64.decode(back.next.unwrap()).unwrap(), page.next.unwrap());
        for item in [
            WatchItem::Events(vec![
                RawEvent::Put(kv),
                RawEvent::Delete {
                    key: "/k".into(),
                    revision: 10,
                },
            ]),
            WatchItem::Compacted(4),
        ] {
            let line = serde_json::to_string(&WireItem::from(&item)).unwrap();
            assert!(!line.contains('\n'));
            let back: WireItem = serde_json::from_str(&line).unwrap();
            assert_eq!(back.item().unwrap(), item);
        }
    }
}
