//! The pod routes of the agent's API: `/pods`, `/pods/<id>` (manifest + status) and
//! `/stats/<pod>/<container>` (CPU and memory from Docker). The agent's server adds TLS and auth.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hostlet_api::routes;

use crate::routes::serve;
use axum::{Json, Router};

use super::controller::{PodsHandle, StatsError};
use super::runtime::ContainerRuntime;

/// The three read-only pod routes, on `handle`.
pub fn router<R: ContainerRuntime>(handle: PodsHandle<R>) -> Router {
    let r = serve(Router::new(), &routes::PODS, list::<R>);
    let r = serve(r, &routes::POD, one::<R>);
    serve(r, &routes::STATS, stats::<R>).with_state(handle)
}

async fn list<R: ContainerRuntime>(State(h): State<PodsHandle<R>>) -> Response {
    Json(h.pods()).into_response()
}

async fn one<R: ContainerRuntime>(
    State(h): State<PodsHandle<R>>,
    Path(id): Path<String>,
) -> Response {
    match h.pod(&id) {
        Some(view) => Json(view).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no pod {id:?} on this node\n"),
        )
            .into_response(),
    }
}

async fn stats<R: ContainerRuntime>(
    State(h): State<PodsHandle<R>>,
    Path((pod, container)): Path<(String, String)>,
) -> Response {
    match h.stats(&pod, &container).await {
        Ok(s) => Json(s).into_response(),
        Err(e @ StatsError::NotFound { .. }) => {
            (StatusCode::NOT_FOUND, format!("{e}\n")).into_response()
        }
        Err(e) => (StatusCode::BAD_GATEWAY, format!("{e}\n")).into_response(),
    }
}
