//! hostlet controllers.
pub mod agent;
pub mod caches;
pub mod disk;
pub mod etcd_member;
pub mod events;
pub mod files;
pub mod learners;
pub mod members;
pub mod membership;
pub mod nodeapi;
pub mod pki;
pub mod placement;
pub mod pods;
pub mod podsets;
pub mod routes;
pub mod secrets;
pub mod snapshots;
pub mod sources;
pub mod tombstone;
pub mod upgrade;
pub mod upkeep;

/// What went wrong with an HTTP request, in words an operator can act on: the innermost cause (e.g.
/// "Connection refused (os error 111)") rather than the client's "error sending request for url".
pub fn http_failure(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "timed out".to_string();
    }
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    let root = cause.to_string();
    if e.is_connect() && !root.to_lowercase().contains("connect") {
        format!("cannot connect: {root}")
    } else {
        root
    }
}

/// `e` and its sources, `: `-separated (our error types keep their sources out of their own message).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn an_http_failure_names_its_cause_not_the_clients_wrapper() {
        // A loopback port with nothing listening: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let e = reqwest::get(format!("http://127.0.0.1:{port}/"))
            .await
            .unwrap_err();
        let said = super::http_failure(&e);
        assert!(said.to_lowercase().contains("refused"), "{said}");
        assert!(!said.contains("error sending request"), "{said}");
    }
}
