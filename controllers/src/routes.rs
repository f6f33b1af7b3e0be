//! How a handler enters the agent's API: by its entry in the route table ([`hostlet_api::routes`]), which
//! says who may call it and how large a body it takes. The agent's gate enforces the table before the
//! handler runs; a route added any other way is not in the table and cannot be reached.

use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::routing::{on, MethodFilter};
use axum::Router;
use hostlet_api::routes::{Method, Route};

fn filter(m: Method) -> MethodFilter {
    match m {
        Method::Get => MethodFilter::GET,
        Method::Put => MethodFilter::PUT,
        Method::Post => MethodFilter::POST,
        Method::Delete => MethodFilter::DELETE,
    }
}

/// `router` with `handler` serving `route`, its body limited to the route's.
pub fn serve<S, H, T>(router: Router<S>, route: &'static Route, handler: H) -> Router<S>
where
    H: Handler<T, S>,
    T: 'static,
    S: Clone + Send + Sync + 'static,
{
    router.route(
        route.path,
        on(filter(route.method), handler).layer(DefaultBodyLimit::max(route.body_limit)),
    )
}
