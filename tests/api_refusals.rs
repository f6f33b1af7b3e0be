//! Refusals reach every client, with real agents and etcd (TLS as deployed): the agent API and the node API
//! answer a request they refuse with its status over HTTP/2 and HTTP/1.1 alike, never with a reset stream,
//! whatever body the client is still sending; a body over the route's limit is answered 413 without being
//! read; and every route of the table that is not open refuses a caller without a credential and a caller
//! of the wrong kind.

mod member_support;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hostlet_api::routes::{self, Caller, ROUTES};
use member_support::{cli, output_text, Cleanup, Node};

const READY: Duration = Duration::from_secs(120);
/// As the scripts send: a manifest-sized body, larger than one HTTP/2 frame and one TCP window.
const BODY: usize = 100 * 1024;
const TRIES: usize = 200;

#[derive(Clone, Copy, Debug)]
enum Http {
    H1,
    H2,
}

/// A client of `node`'s API trusting its cluster CA, speaking `http` only, presenting `who`'s client
/// certificate if given.
fn client(node: &Node, who: Option<&Node>, http: Http) -> reqwest::Client {
    let ca = std::fs::read(node.tls_file("ca.crt")).unwrap();
    let mut b = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap());
    if let Some(w) = who {
        let mut pem = std::fs::read(w.tls_file("client.crt")).unwrap();
        pem.extend(std::fs::read(w.tls_file("client.key")).unwrap());
        b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    b = match http {
        Http::H1 => b.http1_only(),
        Http::H2 => b.http2_prior_knowledge(),
    };
    b.build().unwrap()
}

/// Sends `TRIES` requests of a `BODY`-byte body, eight at a time; the answers, or each transport error.
async fn hammer(
    c: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    http: Http,
) -> Vec<Result<u16, String>> {
    let body = vec![b'x'; BODY];
    futures::stream::iter(0..TRIES)
        .map(|_| {
            let req = c.request(method.clone(), url).body(body.clone());
            async move {
                let r = req.send().await.map_err(|e| format!("{e:?}"))?;
                let expected = match http {
                    Http::H1 => reqwest::Version::HTTP_11,
                    Http::H2 => reqwest::Version::HTTP_2,
                };
                if r.version() != expected {
                    return Err(format!("answered over {:?}", r.version()));
                }
                let code = r.status().as_u16();
                r.bytes().await.map_err(|e| format!("reading: {e:?}"))?;
                Ok(code)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await
}

fn assert_all(what: &str, answers: &[Result<u16, String>], code: u16) {
    let wrong: Vec<_> = answers.iter().filter(|a| **a != Ok(code)).collect();
    assert!(
        wrong.is_empty(),
        "{what}: {} of {} not answered {code}: {:?}",
        wrong.len(),
        answers.len(),
        &wrong[..wrong.len().min(5)]
    );
}

/// `TRIES` POSTs of a `BODY`-byte file through curl over `--http2` or `--http1.1`; the (exit, status) pairs
/// that are not (0, `code`).
fn curl_misses(node: &Node, url: &str, flag: &str, code: &str) -> Vec<(i32, String)> {
    let file = node.run_dir().join("curl-body");
    std::fs::write(&file, vec![b'x'; BODY]).unwrap();
    let ca = node.tls_file("ca.crt");
    (0..TRIES)
        .filter_map(|_| {
            let o = std::process::Command::new("curl")
                .args([
                    "-s",
                    flag,
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    "-X",
                    "POST",
                ])
                .arg("--cacert")
                .arg(&ca)
                .arg("--data-binary")
                .arg(format!("@{}", file.display()))
                .arg(url)
                .output()
                .expect("curl (hack/install-deps.sh installs it)");
            let got = (
                o.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&o.stdout).into_owned(),
            );
            (got != (0, code.to_string())).then_some(got)
        })
        .collect()
}

/// `route`'s path with a value in each `{…}` segment.
fn concrete(route: &routes::Route) -> String {
    route
        .path
        .split('/')
        .map(|s| if s.starts_with('{') { "x" } else { s })
        .collect::<Vec<_>>()
        .join("/")
}

fn method(route: &routes::Route) -> reqwest::Method {
    reqwest::Method::from_bytes(route.method.as_str().as_bytes()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_reach_every_client_whole() {
    let _cleanup = Cleanup("refuse-2".to_string());
    let (voter, worker) = member_support::voter_and_worker("refuse", READY);
    let pods = format!("{}/pods", voter.api_url());
    // The voter's own pods: not the worker's to write.
    let not_its_own = format!(
        "{}/node/v1/kv?key=/hostlet/hosts/refuse-1/pods/web",
        voter.api_url()
    );

    for http in [Http::H2, Http::H1] {
        let anon = client(&voter, None, http);
        let as_worker = client(&voter, Some(&worker), http);
        // No credential: the gate refuses before the body is read.
        let a = hammer(&anon, reqwest::Method::POST, &pods, http).await;
        assert_all(&format!("{http:?} POST /pods without a token"), &a, 401);
        let a = hammer(&anon, reqwest::Method::PUT, &not_its_own, http).await;
        assert_all(
            &format!("{http:?} PUT to the node API without a certificate"),
            &a,
            401,
        );
        // The wrong certificate for the key: the node API's rules refuse.
        let a = hammer(&as_worker, reqwest::Method::PUT, &not_its_own, http).await;
        assert_all(
            &format!("{http:?} PUT of another node's key with a worker's certificate"),
            &a,
            403,
        );
        // The wrong kind of caller for the route: a node's certificate on another node's agent.
        let a = hammer(&as_worker, reqwest::Method::POST, &pods, http).await;
        assert_all(
            &format!("{http:?} POST /pods with another node's certificate"),
            &a,
            403,
        );
    }

    // curl as the script ran it (Debian 12's curl resets on an early answer over HTTP/2).
    for flag in ["--http2", "--http1.1"] {
        let misses = curl_misses(&voter, &pods, flag, "401");
        assert!(
            misses.is_empty(),
            "curl {flag}: {} of {TRIES} POSTs not answered 401 with exit 0: {:?}",
            misses.len(),
            &misses[..misses.len().min(5)]
        );
    }

    table_routes_refuse_the_wrong_callers(&voter, &worker).await;
    bodies_over_the_limit_are_not_read(&voter).await;

    // A revoked certificate: refused by the gate, every answer whole.
    let o = cli(&voter, &["node", "delete", "refuse-2"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let as_worker = client(&voter, Some(&worker), Http::H2);
    let own_status = format!(
        "{}/node/v1/kv?key=/hostlet/hosts/refuse-2/status/web",
        voter.api_url()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = as_worker.get(&own_status).send().await.unwrap();
        if r.headers().contains_key("hostlet-certificate-revoked") {
            assert_eq!(r.status().as_u16(), 403);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the voter still answers the deleted worker's certificate: {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for http in [Http::H2, Http::H1] {
        let as_worker = client(&voter, Some(&worker), http);
        let a = hammer(&as_worker, reqwest::Method::PUT, &own_status, http).await;
        assert_all(&format!("{http:?} PUT with a revoked certificate"), &a, 403);
    }
}

/// Every route of the table that is not open: 401 without a credential; 401 or 403 for the wrong kind of
/// caller (the token where a certificate is needed, another node's certificate on this node's agent).
async fn table_routes_refuse_the_wrong_callers(voter: &Node, worker: &Node) {
    let anon = client(voter, None, Http::H2);
    let as_worker = client(voter, Some(worker), Http::H2);
    let token = voter.token();
    let mut checked = 0;
    for route in ROUTES {
        let url = format!("{}{}", voter.api_url(), concrete(route));
        let what = format!("{} {}", route.method, route.path);
        if route.caller == Caller::Anyone {
            let r = anon.request(method(route), &url).send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200, "{what} is open");
            continue;
        }
        let r = anon.request(method(route), &url).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{what} without a credential");
        let (wrong, code) = match route.caller {
            // The server token, where only a certificate opens.
            Caller::Node => (anon.request(method(route), &url).bearer_auth(&token), 401),
            // A worker's certificate on a voter's agent: it acts for itself alone.
            Caller::AgentUser => (as_worker.request(method(route), &url), 403),
            // A token that is no token of the cluster.
            Caller::Joiner => (
                anon.request(method(route), &url)
                    .bearer_auth("H10::0000::not-a-token"),
                401,
            ),
            Caller::Anyone => unreachable!(),
        };
        let r = wrong.send().await.unwrap();
        assert_eq!(r.status().as_u16(), code, "{what} by the wrong caller");
        checked += 1;
    }
    assert_eq!(
        checked,
        ROUTES.iter().filter(|r| r.caller != Caller::Anyone).count()
    );
    // Unlisted: unreachable, whoever asks.
    let r = anon
        .get(format!("{}/node/v1/anything", voter.api_url()))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let r = anon
        .patch(format!("{}/pods", voter.api_url()))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
    assert_eq!(r.headers()["allow"], "GET, POST");
}

/// A body over `POST /pods`'s limit: 413 from its length alone, and a body of unknown length is not read
/// much past the limit (flow control lets some more through) before the 413.
async fn bodies_over_the_limit_are_not_read(voter: &Node) {
    let pods = format!("{}/pods", voter.api_url());
    let token = voter.token();
    let over = routes::POST_PODS.body_limit + 1;
    for http in [Http::H2, Http::H1] {
        let c = client(voter, None, http);
        let r = c
            .post(&pods)
            .bearer_auth(&token)
            .body(vec![b'x'; over])
            .send()
            .await;
        match (http, r) {
            (_, Ok(r)) => assert_eq!(r.status().as_u16(), 413, "{http:?}"),
            // Over HTTP/1.1 the connection closes after the answer, while this client may still be
            // writing: it may see the close first. curl below waits for the answer as clients do.
            (Http::H1, Err(e)) => eprintln!("HTTP/1.1 client saw the close first: {e}"),
            (Http::H2, Err(e)) => panic!("HTTP/2 413 not received: {e:?}"),
        }
    }
    // curl over HTTP/1.1 asks before sending a large body (Expect: 100-continue): it gets the 413 and
    // sends nothing. (Over HTTP/2 the stream ends with RST_STREAM(NO_ERROR) after the 413, as RFC 9113
    // section 8.1 has it; Debian 12's curl 7.88 takes that for an error, so only hyper is asked there.)
    let file = voter.run_dir().join("large-body");
    std::fs::write(&file, vec![b'x'; 8 * routes::POST_PODS.body_limit]).unwrap();
    let o = curl_post(voter, &pods, "--http1.1", &file, &token);
    assert_eq!(o, (0, "413".to_string()), "curl of a body over the limit");

    // Of unknown length, with the token: the route's own limit answers, and what was pulled from the
    // body stays far below what was offered.
    let offered = 64 * 1024 * 1024;
    let pulled = Arc::new(AtomicUsize::new(0));
    let counter = pulled.clone();
    let chunks = futures::stream::iter(0..offered / (64 * 1024)).map(move |_| {
        counter.fetch_add(64 * 1024, Ordering::Relaxed);
        Ok::<_, std::io::Error>(vec![b'x'; 64 * 1024])
    });
    let c = client(voter, None, Http::H2);
    let r = c
        .post(&pods)
        .bearer_auth(&token)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .expect("HTTP/2: the 413 arrives");
    assert_eq!(r.status().as_u16(), 413);
    let pulled = pulled.load(Ordering::Relaxed);
    assert!(
        pulled < offered / 4,
        "{pulled} bytes of {offered} pulled from the body: read past the limit"
    );
}

fn curl_post(node: &Node, url: &str, flag: &str, file: &Path, token: &str) -> (i32, String) {
    // The token goes in a header file, never on the command line.
    let header = node.run_dir().join("curl-auth");
    std::fs::write(&header, format!("Authorization: Bearer {token}\n")).unwrap();
    let o = std::process::Command::new("curl")
        .args(["-s", flag, "-o", "/dev/null", "-w", "%{http_code}"])
        .arg("--cacert")
        .arg(node.tls_file("ca.crt"))
        .arg("-H")
        .arg(format!("@{}", header.display()))
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg(url)
        .output()
        .expect("curl (hack/install-deps.sh installs it)");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}
