//! `--manifest-url`: a URL serving one manifest or a list, read every 20 s. Any error (unreachable, a
//! non-2xx answer, a body over the size cap, text that is not manifests, a manifest without `version`) keeps
//! the last good set.

use std::time::Duration;

use hostlet_api::validation::{validate, SourceKind};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio_util::sync::CancellationToken;

use super::{entries_from_list, SourceEntry, SourceSet, SourceSink};
use crate::events::{EventKind, EventRecorder};

/// How the URL is read.
#[derive(Debug, Clone)]
pub struct UrlSourceConfig {
    pub url: String,
    /// `Name: value` lines.
    pub headers: Vec<String>,
    pub period: Duration,
    pub timeout: Duration,
    /// The largest body read (`--manifest-url-max-bytes`).
    pub max_bytes: u64,
}

/// `--manifest-url-max-bytes` by default.
pub const DEFAULT_MAX_BYTES: u64 = 4 << 20;

impl UrlSourceConfig {
    pub fn new(url: impl Into<String>) -> Self {
        UrlSourceConfig {
            url: url.into(),
            headers: Vec::new(),
            period: Duration::from_secs(20),
            timeout: Duration::from_secs(10),
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// The header lines as a map. A line may hold a secret (a token): a bad one is named by its number only.
fn header_map(lines: &[String]) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (i, line) in lines.iter().enumerate() {
        let bad = |why: &str| {
            format!(
                "--manifest-url-header line {}: {why} (the line is not shown: it may hold a secret)",
                i + 1
            )
        };
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad("must be `Name: value`"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| bad("not a valid header name"))?;
        let value =
            HeaderValue::from_str(value.trim()).map_err(|_| bad("not a valid header value"))?;
        map.append(name, value);
    }
    Ok(map)
}

/// Reads the URL once: the whole set, or why not (naming the URL).
pub async fn fetch(
    client: &reqwest::Client,
    cfg: &UrlSourceConfig,
) -> Result<Vec<SourceEntry>, String> {
    let url = &cfg.url;
    let resp = client
        .get(url)
        .headers(header_map(&cfg.headers)?)
        .timeout(cfg.timeout)
        .send()
        .await
        .map_err(|e| format!("{url}: {}", crate::http_failure(&e)))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("{url}: answered {status}"));
    }
    let cap = cfg.max_bytes;
    let too_big = || {
        format!("{url}: the answer is larger than --manifest-url-max-bytes ({cap} bytes); not read")
    };
    if resp.content_length().is_some_and(|n| n > cap) {
        return Err(too_big());
    }
    // Read chunk by chunk: a server may send more than it announced, or announce nothing.
    let mut resp = resp;
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("{url}: reading the answer: {}", crate::http_failure(&e)))?
    {
        if body.len() as u64 + chunk.len() as u64 > cap {
            return Err(too_big());
        }
        body.extend_from_slice(&chunk);
    }
    let entries = entries_from_list(url, &body, 0)?;
    // As in 2014, one bad manifest makes the whole answer suspect: keep the last good set.
    for e in &entries {
        match &e.manifest {
            Err(err) => return Err(format!("{}: {err}", e.origin)),
            Ok(m) if m.version.trim().is_empty() => {
                return Err(format!(
                    "{}: manifest {:?} has a blank version",
                    e.origin, m.id
                ));
            }
            Ok(m) => {
                let errors = validate(m);
                if !errors.is_empty() {
                    return Err(format!(
                        "{}: {}",
                        e.origin,
                        hostlet_api::validation::describe(&errors)
                    ));
                }
            }
        }
    }
    Ok(entries)
}

/// Runs the URL source until `shutdown`. The source counts as synced after its first answer, good or bad.
pub async fn run(
    cfg: UrlSourceConfig,
    sink: SourceSink,
    events: Option<EventRecorder>,
    shutdown: CancellationToken,
) {
    let client = match reqwest::Client::builder().build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build an HTTP client for --manifest-url");
            return;
        }
    };
    let mut last_good: Option<Vec<SourceEntry>> = None;
    let mut published: Option<Vec<SourceEntry>> = None;
    let mut last_error: Option<String> = None;
    loop {
        match fetch(&client, &cfg).await {
            Ok(entries) => {
                last_error = None;
                last_good = Some(entries);
            }
            Err(e) => {
                if last_error.as_ref() != Some(&e) {
                    let kept = last_good.as_ref().map(Vec::len).unwrap_or(0);
                    let msg = format!("{e} (keeping the {kept} pod(s) last read from it)");
                    match &events {
                        Some(ev) => {
                            ev.node_event(EventKind::Warning, "ManifestUrlError", msg)
                                .await
                        }
                        None => tracing::warn!("{msg}"),
                    }
                    last_error = Some(e);
                }
            }
        }
        let current = last_good.clone().unwrap_or_default();
        if published.as_ref() != Some(&current) {
            sink.publish(SourceSet {
                source: SourceKind::Url,
                entries: current.clone(),
            });
            published = Some(current);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(cfg.period) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_header_line_is_named_by_number_never_shown() {
        let lines = vec![
            "X-Ok: 1".to_string(),
            "Authorization Bearer s3cr3t".to_string(),
        ];
        let e = header_map(&lines).unwrap_err();
        assert!(e.contains("line 2") && !e.contains("s3cr3t"), "{e}");
        let lines = vec!["X-Bad\u{1}: s3cr3t\u{7f}".to_string()];
        let e = header_map(&lines).unwrap_err();
        assert!(e.contains("line 1") && !e.contains("s3cr3t"), "{e}");
        assert_eq!(header_map(&["A: b".to_string()]).unwrap().len(), 1);
    }
}
