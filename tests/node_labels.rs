//! Node labels on a real agent: the built-in ones, `--node-label`, a device `--allowed-devices` lets pods
//! have (a character device the test makes with mknod), an admin's `hostlet node label`, and `node ls
//! --show-labels -l`.

mod member_support;

use std::time::Duration;

use member_support::*;

const READY: Duration = Duration::from_secs(60);

fn labels(n: &Node) -> serde_json::Value {
    let o = cli(n, &["node", "ls", "-o", "json"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v[0].clone()
}

#[test]
fn a_node_states_its_labels_and_an_admin_adds_and_removes_more() {
    let mut n = Node::new("labelled");
    let devices = n.dir.join("dev");
    std::fs::create_dir_all(&devices).unwrap();
    let made = std::process::Command::new("mknod")
        .arg(devices.join("ttyUSB0"))
        .args(["c", "1", "3"])
        .status()
        .expect("mknod");
    assert!(made.success(), "mknod needs root");
    // A plain file the glob matches is no device.
    std::fs::write(devices.join("ttyUSB9"), "").unwrap();

    // A label only an admin may set is refused at start, naming it.
    let o = n
        .wrapped(BIN)
        .args(n.args())
        .arg("--node-label=hostlet.io/dedicated=db")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let text = output_text(&o);
    assert!(text.contains("hostlet.io/dedicated"), "{text}");
    let o = n
        .wrapped(BIN)
        .args(n.args())
        .arg("--node-label=disk=s s d")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        output_text(&o).contains("label disk"),
        "{}",
        output_text(&o)
    );

    n.start(&[
        "--node-label=disk=ssd,zone=a".to_string(),
        "--failure-domain=rack-1".to_string(),
        format!("--allowed-devices={}/ttyUSB*", devices.display()),
    ]);
    n.wait_ready(READY);
    let node = labels(&n);
    let own = &node["labels"];
    assert_eq!(own["hostlet.io/hostname"], "labelled", "{node}");
    assert_eq!(own["hostlet.io/role"], "voter", "{node}");
    assert_eq!(own["hostlet.io/os"], "linux", "{node}");
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    };
    assert_eq!(own["hostlet.io/arch"], arch, "{node}");
    assert_eq!(own["hostlet.io/failure-domain"], "rack-1", "{node}");
    assert_eq!(own["hostlet.io/device.ttyUSB0"], "true", "{node}");
    assert!(own.get("hostlet.io/device.ttyUSB9").is_none(), "{node}");
    assert_eq!(own["disk"], "ssd", "{node}");
    assert_eq!(own["zone"], "a", "{node}");

    // An admin's labels go on top; restricted ones are theirs to set.
    let o = cli(
        &n,
        &[
            "node",
            "label",
            "labelled",
            "disk=nvme",
            "node-restriction.hostlet.io/dedicated=db",
        ],
    );
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(output_text(&o).contains("disk=nvme"), "{}", output_text(&o));
    let node = labels(&n);
    assert_eq!(node["effectiveLabels"]["disk"], "nvme", "{node}");
    assert_eq!(
        node["labels"]["disk"], "ssd",
        "the node's own stay as it said: {node}"
    );
    assert_eq!(
        node["effectiveLabels"]["node-restriction.hostlet.io/dedicated"],
        "db"
    );

    // Selected by label, shown with --show-labels.
    let o = cli(&n, &["node", "ls", "--show-labels", "-l", "disk=nvme,zone"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let text = stdout(&o);
    assert!(
        text.contains("LABELS") && text.contains("labelled"),
        "{text}"
    );
    assert!(text.contains("hostlet.io/device.ttyUSB0=true"), "{text}");
    let o = cli(&n, &["node", "ls", "-l", "disk=ssd"]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(!stdout(&o).contains("labelled"), "{}", stdout(&o));
    let o = cli(&n, &["node", "ls", "-l", "bad key"]);
    assert_eq!(o.status.code(), Some(4), "{}", output_text(&o));

    // A restart keeps the admin's labels; the node's own are as its flags say now.
    n.terminate(Duration::from_secs(30));
    n.start(&["--node-label=zone=b".to_string()]);
    n.wait_ready(READY);
    let node = labels(&n);
    assert_eq!(node["effectiveLabels"]["disk"], "nvme", "{node}");
    assert_eq!(node["effectiveLabels"]["zone"], "b", "{node}");
    assert!(node["labels"].get("disk").is_none(), "{node}");

    // Removing: the admin's label goes; the node's own is not the admin's to remove; bad input is refused
    // whole, naming it, and changes nothing.
    let o = cli(&n, &["node", "label", "labelled", "disk-"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let o = cli(&n, &["node", "label", "labelled", "zone-"]);
    assert_eq!(o.status.code(), Some(4), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("node's own"),
        "{}",
        output_text(&o)
    );
    let o = cli(&n, &["node", "label", "labelled", "ok=1", "Bad Key=x"]);
    assert_eq!(o.status.code(), Some(4), "{}", output_text(&o));
    assert!(output_text(&o).contains("Bad Key"), "{}", output_text(&o));
    let o = cli(&n, &["node", "label", "nobody", "a=b"]);
    assert_eq!(o.status.code(), Some(3), "{}", output_text(&o));
    let node = labels(&n);
    assert!(node["effectiveLabels"].get("disk").is_none(), "{node}");
    assert!(node["effectiveLabels"].get("ok").is_none(), "{node}");
    assert_eq!(
        node["effectiveLabels"]["node-restriction.hostlet.io/dedicated"],
        "db"
    );
    n.terminate(Duration::from_secs(30));
}
