//! Every manifest source at once on a real agent (etcd key, legacy list key, file, URL, POST), merged with
//! the fixed precedence; the CLI round trip; bad inputs that change nothing.

mod member_support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::Duration;

use member_support::{cli, eventually, free_port, status, Cleanup, Node};

fn pod(id: &str) -> String {
    format!("version: v1beta1\nid: {id}\ncontainers:\n- name: main\n  image: busybox:latest\n  command: [sleep, '3600']\n")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Serves `body` to every request on a loopback port, from a thread.
fn serve_forever(body: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut s = stream;
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(resp.as_bytes());
        }
    });
    format!("http://{addr}/pods")
}

/// A one-item JSON list of the manifest (YAML in, JSON out).
fn json_list(yaml: &str) -> String {
    let v: serde_json::Value = yaml_serde::from_str(yaml).unwrap();
    serde_json::to_string(&[v]).unwrap()
}

fn running_from(node: &Node, id: &str, source: &str) -> bool {
    status(node, id).is_some_and(|s| s["phase"] == "Running" && s["source"] == source)
}

fn post(node: &Node, body: &str, token: Option<&str>) -> String {
    let mut c = Command::new("curl");
    c.args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-X",
        "POST",
        "--data-binary",
        body,
    ]);
    if let Some(t) = token {
        c.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    c.arg(format!("http://127.0.0.1:{}/pods", node.api_port));
    String::from_utf8_lossy(&c.output().unwrap().stdout).into_owned()
}

#[test]
fn five_sources_merge_with_the_fixed_precedence() {
    // Declared first so that it drops last: after the agent has stopped, its containers are removed.
    let _cleanup = Cleanup("src-all".to_string());
    let mut node = Node::new("src-all").insecure();
    let manifests = node.dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(manifests.join("a.yaml"), pod("from-file")).unwrap();
    std::fs::write(manifests.join("b.yaml"), pod("dup")).unwrap();
    std::fs::write(manifests.join(".b.yaml.swp"), "garbage").unwrap();
    let url = serve_forever(json_list(&pod("from-url")));
    node.start(&[
        format!("--manifest-path={}", manifests.display()),
        format!("--manifest-url={url}"),
    ]);
    node.wait_ready(Duration::from_secs(60));

    // etcd key (through the CLI) beats the file for "dup".
    let file = node.dir.join("dup.yaml");
    std::fs::write(&file, pod("dup").replace("3600", "3601")).unwrap();
    let o = cli(&node, &["pod", "apply", "-f", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    // The 2014 list key.
    let list = json_list(&pod("from-list"));
    let o = node.etcdctl(&["put", "/registry/hosts/src-all/kubelet", &list]);
    assert!(o.status.success(), "{}", text(&o));
    // POST without the token changes nothing; with it, the pod comes.
    assert_eq!(post(&node, &pod("from-http"), None), "401");
    assert_eq!(post(&node, &pod("from-http"), Some(&node.token())), "200");

    for (id, source) in [
        ("dup", "etcd-key"),
        ("from-list", "etcd-list"),
        ("from-file", "file"),
        ("from-url", "url"),
        ("from-http", "http"),
    ] {
        eventually(
            &format!("{id} running from {source}"),
            Duration::from_secs(60),
            || running_from(&node, id, source).then_some(()),
        );
    }
    // The file's "dup" lost: an event says so and names the winner.
    eventually(
        "a Rejected event for the file's dup",
        Duration::from_secs(20),
        || {
            let o = cli(&node, &["events", "--pod", "dup", "-o", "json"]);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
            v.as_array()?
                .iter()
                .any(|e| {
                    e["reason"] == "Rejected"
                        && e["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("b.yaml") && m.contains("etcd key"))
                })
                .then_some(())
        },
    );

    // CLI round trip: ls shows it, -o json parses, delete hands "dup" to the file source.
    let o = cli(&node, &["pod", "ls"]);
    let row = text(&o)
        .lines()
        .find(|l| l.starts_with("dup "))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(
        row.contains("Running") && row.contains("etcd-key"),
        "{}",
        text(&o)
    );
    let o = cli(&node, &["pod", "ls", "-o", "json"]);
    let all: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(all.as_array().unwrap().len() >= 5);
    // An etcd-key pod's status carries no copy of its manifest (the key holds it).
    let st = status(&node, "dup");
    assert!(
        st.as_ref().is_some_and(|s| s.get("manifest").is_none()),
        "{st:?}"
    );
    let o = cli(&node, &["pod", "delete", "dup"]);
    assert!(o.status.success(), "{}", text(&o));
    eventually(
        "dup running from the file now",
        Duration::from_secs(60),
        || running_from(&node, "dup", "file").then_some(()),
    );
    // The file's pod has no key of its own: `pod get` shows the manifest its agent mirrors in the status,
    // in either form.
    let o = cli(&node, &["pod", "get", "dup", "-o", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let shown: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(shown["manifest"]["id"], "dup", "{shown}");
    assert_eq!(
        shown["manifest"]["containers"][0]["command"],
        serde_json::json!(["sleep", "3600"]),
        "the file's manifest, not the deleted key's: {shown}"
    );
    assert!(shown["status"].get("manifest").is_none(), "{shown}");
    let o = cli(
        &node,
        &["pod", "get", "from-url", "-o", "json", "--format", "v1"],
    );
    let shown: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(shown["manifest"]["metadata"]["name"], "from-url", "{shown}");

    // A file's pod refused for a host port an etcd-key pod holds is listed as the file's, not the key's.
    let port = free_port();
    let port_pod = |id: &str| {
        format!(
            "{}  ports: [{{containerPort: 80, hostPort: {port}, hostIP: 127.0.0.1}}]\n",
            pod(id)
        )
    };
    let held = node.dir.join("key-port.yaml");
    std::fs::write(&held, port_pod("key-port")).unwrap();
    let o = cli(&node, &["pod", "apply", "-f", held.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    eventually("key-port running", Duration::from_secs(60), || {
        running_from(&node, "key-port", "etcd-key").then_some(())
    });
    std::fs::write(manifests.join("c.yaml"), port_pod("file-port")).unwrap();
    let st = eventually("file-port rejected", Duration::from_secs(60), || {
        status(&node, "file-port").filter(|s| s["phase"] == "Rejected")
    });
    assert_eq!(st["source"], "file", "{st}");
    assert!(
        st["message"].as_str().is_some_and(|m| m.contains("c.yaml")),
        "{st}"
    );
    let o = cli(&node, &["pod", "ls"]);
    let row = text(&o)
        .lines()
        .find(|l| l.starts_with("file-port "))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(
        row.contains("Rejected") && row.contains("file") && !row.contains("etcd-key"),
        "{}",
        text(&o)
    );

    // A garbage file and an empty POST list: the file keeps its last good pod, the POST set empties.
    std::fs::write(manifests.join("a.yaml"), [0xffu8, 0x00, 0xfe]).unwrap();
    assert_eq!(post(&node, "[]", Some(&node.token())), "200");
    eventually("from-http gone", Duration::from_secs(60), || {
        status(&node, "from-http").is_none().then_some(())
    });
    assert!(
        running_from(&node, "from-file", "file"),
        "last good pod of a broken file keeps running"
    );
    assert!(
        running_from(&node, "from-url", "url"),
        "other sources undisturbed"
    );
    eventually(
        "an event naming the broken file",
        Duration::from_secs(30),
        || {
            let o = cli(&node, &["events", "-o", "json"]);
            String::from_utf8_lossy(&o.stdout)
                .contains("ManifestFileError")
                .then_some(())
        },
    );
}
