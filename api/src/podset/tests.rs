use super::*;

const SET: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
  annotations:
    hostlet.io/auto-revert: "true"
spec:
  selector:
    matchLabels: {app: agent}
  updateStrategy:
    type: RollingUpdate
    rollingUpdate: {maxUnavailable: 25%}
  minReadySeconds: 5
  template:
    metadata:
      labels: {app: agent}
    spec:
      nodeSelector: {disk: ssd}
      containers:
      - name: main
        image: busybox:latest
"#;

fn errors(text: &str) -> Vec<String> {
    match parse(text.as_bytes()) {
        Ok(_) => Vec::new(),
        Err(es) => es.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn a_daemon_set_reads_into_a_pod_set() {
    let s = parse(SET.as_bytes()).expect("valid");
    assert_eq!(s.name, "agent");
    assert_eq!(s.template.id, "agent");
    assert_eq!(s.template.containers[0].image, "busybox:latest");
    assert_eq!(s.node_selector.get("disk").map(String::as_str), Some("ssd"));
    assert_eq!(
        s.strategy,
        Strategy::RollingUpdate {
            max_unavailable: IntOrPercent::Percent(25)
        }
    );
    assert_eq!(s.min_ready_seconds, 5);
    assert_eq!(s.revision_history_limit, 10);
    assert_eq!(s.progress_deadline_seconds, 600);
    assert!(s.auto_revert);
    let pod = s.pod_for(3);
    assert_eq!(
        pod.annotations.get(OWNER).map(String::as_str),
        Some("agent")
    );
    assert_eq!(pod.annotations.get(REVISION).map(String::as_str), Some("3"));
    assert_eq!(pod.annotations.get(HASH), Some(&s.hash()));
    assert!(crate::validation::validate(&pod).is_empty());
}

#[test]
fn the_hash_follows_the_template_only() {
    let a = parse(SET.as_bytes()).expect("valid");
    let b = parse(
        SET.replace("minReadySeconds: 5", "minReadySeconds: 9")
            .as_bytes(),
    )
    .expect("valid");
    assert_eq!(a.hash(), b.hash());
    let c = parse(SET.replace("busybox:latest", "busybox:1").as_bytes()).expect("valid");
    assert_ne!(a.hash(), c.hash());
    let d = parse(SET.replace("disk: ssd", "disk: hdd").as_bytes()).expect("valid");
    assert_ne!(
        a.hash(),
        d.hash(),
        "the node selector is part of the template"
    );
}

#[test]
fn percentages_round_up_and_never_to_nothing() {
    assert_eq!(IntOrPercent::Percent(25).of(20, true), 5);
    assert_eq!(IntOrPercent::Percent(25).of(3, true), 1);
    assert_eq!(IntOrPercent::Percent(10).of(0, true), 1);
    assert_eq!(IntOrPercent::Int(2).of(20, true), 2);
}

#[test]
fn bad_sets_are_refused_with_the_field() {
    let cases = [
        (SET.replace("apps/v1", "apps/v2"), "apiVersion"),
        (SET.replace("kind: DaemonSet", "kind: Deployment"), "kind"),
        (SET.replace("name: agent", "name: Agent_1"), "metadata.name"),
        (
            SET.replace("matchLabels: {app: agent}", "matchLabels: {app: other}"),
            "spec.template.metadata.labels",
        ),
        (
            SET.replace("maxUnavailable: 25%", "maxUnavailable: 0"),
            "spec.updateStrategy.rollingUpdate.maxUnavailable",
        ),
        (
            SET.replace("maxUnavailable: 25%", "maxUnavailable: lots"),
            "spec.updateStrategy.rollingUpdate.maxUnavailable",
        ),
        (
            SET.replace("maxUnavailable: 25%", "maxSurge: 1"),
            "spec.updateStrategy.rollingUpdate.maxSurge",
        ),
        (
            SET.replace("type: RollingUpdate", "type: Recreate"),
            "spec.updateStrategy.type",
        ),
        (
            SET.replace("disk: ssd", "disk: \"not ok\""),
            "spec.template.spec.nodeSelector",
        ),
        (
            SET.replace("image: busybox:latest", "image: \"\""),
            "spec.template.spec.containers[0].image",
        ),
        (
            SET.replace("        image:", "        bogus: 1\n        image:"),
            "spec.template.spec.containers[0].bogus",
        ),
        (
            SET.replace("  minReadySeconds: 5", "  replicas: 5"),
            "spec.replicas",
        ),
        (
            SET.replace("\"true\"", "\"yes\""),
            "metadata.annotations[hostlet.io/auto-revert]",
        ),
    ];
    for (text, field) in cases {
        let es = errors(&text);
        assert!(es.iter().any(|e| e.contains(field)), "{field}: {es:?}");
    }
}

#[test]
fn a_template_may_not_claim_the_controllers_annotations() {
    let text = SET.replace(
        "      labels: {app: agent}",
        "      labels: {app: agent}\n      annotations: {hostlet.io/podset: other}",
    );
    let es = errors(&text);
    assert!(es.iter().any(|e| e.contains("hostlet.io/podset")), "{es:?}");
}

#[test]
fn a_revert_writes_the_old_template_back_and_keeps_the_rest() {
    let stored = to_stored(SET.as_bytes()).expect("json");
    let old = parse(SET.replace("busybox:latest", "busybox:1").as_bytes()).expect("valid");
    let back = with_template(&stored, &old.template_value).expect("rewritten");
    let s = parse(&back).expect("valid");
    assert_eq!(s.hash(), old.hash());
    assert_eq!(s.min_ready_seconds, 5);
    assert!(s.auto_revert);
}
