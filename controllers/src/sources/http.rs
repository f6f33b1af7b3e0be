//! The agent's HTTP source: `POST /pods` (one manifest or a list) and the 2014 `POST /container` and
//! `POST /containers`. A POST replaces this source's whole set, as in 2014. The token check is the API
//! server's (every POST needs it).

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Router;
use hostlet_api::routes;
use hostlet_api::validation::SourceKind;

use crate::routes::serve;

use super::{entries_from_list, SourceSet, SourceSink};

/// The HTTP source's state: the last accepted set.
#[derive(Clone)]
pub struct HttpSource {
    sink: SourceSink,
    current: Arc<Mutex<Vec<super::SourceEntry>>>,
}

impl HttpSource {
    /// A source with an empty set, published at once (so it counts as synced).
    pub fn new(sink: SourceSink) -> Self {
        sink.publish(SourceSet {
            source: SourceKind::Http,
            entries: Vec::new(),
        });
        HttpSource {
            sink,
            current: Arc::default(),
        }
    }

    /// Replaces the set with the manifests in `body`; text that cannot be read changes nothing.
    pub fn replace(&self, origin: &str, body: &[u8]) -> Result<usize, String> {
        let entries = entries_from_list(origin, body, 0)?;
        let n = entries.len();
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = entries.clone();
        self.sink.publish(SourceSet {
            source: SourceKind::Http,
            entries,
        });
        Ok(n)
    }

    /// `POST /pods`, `POST /container`, `POST /containers`.
    pub fn router(&self) -> Router {
        let r = serve(Router::new(), &routes::POST_PODS, post_pods);
        let r = serve(r, &routes::POST_CONTAINER, post_pods);
        serve(r, &routes::POST_CONTAINERS, post_pods).with_state(self.clone())
    }
}

async fn post_pods(State(src): State<HttpSource>, body: Bytes) -> (StatusCode, String) {
    match src.replace("POST /pods", &body) {
        Ok(n) => (
            StatusCode::OK,
            format!("accepted {n} manifest(s); they replace the previously posted set\n"),
        ),
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\nnothing changed\n")),
    }
}
