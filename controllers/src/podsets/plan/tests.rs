use super::*;
use hostlet_api::podset;

fn set_text(image: &str, extra: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
  annotations: {{{extra}}}
spec:
  selector: {{matchLabels: {{app: agent}}}}
  progressDeadlineSeconds: 60
  template:
    metadata: {{labels: {{app: agent}}}}
    spec:
      nodeSelector: {{role: edge}}
      containers:
      - name: main
        image: {image}
"#
    )
}

fn set(image: &str) -> PodSet {
    podset::parse(set_text(image, "").as_bytes()).expect("valid")
}

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
}

/// A cluster of `n` matching nodes, each running revision `rev` of `s`, ready since 0.
fn running(s: &PodSet, rev: &Revision, n: usize) -> Observed {
    let mut obs = Observed {
        name: "agent".into(),
        set: SetState::Valid {
            set: Box::new(s.clone()),
            generation: 7,
        },
        revisions: vec![rev.clone()],
        status: None,
        nodes: Vec::new(),
        pods: BTreeMap::new(),
        statuses: BTreeMap::new(),
        now: t(100),
    };
    for i in 0..n {
        let node = format!("n{i}");
        obs.nodes.push(NodeView {
            name: node.clone(),
            labels: [("role".to_string(), "edge".to_string())].into(),
            unschedulable: false,
            admin_revision: 0,
        });
        obs.pods.insert(node.clone(), pod(&rev.hash, 10));
        obs.statuses.insert(node, status(&rev.hash, true, 0));
    }
    obs
}

fn pod(hash: &str, mod_revision: i64) -> PodView {
    PodView {
        owner: Some("agent".into()),
        hash: Some(hash.into()),
        mod_revision,
    }
}

fn status(hash: &str, ready: bool, at: u64) -> StatusView {
    StatusView {
        ready,
        hash: Some(hash.into()),
        updated: t(at),
        phase: PodPhase::Running,
        message: String::new(),
        mod_revision: 1,
    }
}

fn revision(s: &PodSet, n: u64) -> Revision {
    Revision {
        revision: n,
        hash: s.hash(),
        template: s.template_value.clone(),
        created: Timestamp(t(0)),
    }
}

/// Applies a plan's writes to the observation, as etcd would.
fn apply(obs: &mut Observed, plan: &Plan) {
    let hash = plan
        .update
        .as_ref()
        .map(|u| u.hash.clone())
        .unwrap_or_default();
    for op in &plan.ops {
        match op {
            PodOp::Create { node } | PodOp::Replace { node, .. } => {
                obs.pods.insert(node.clone(), pod(&hash, 20));
            }
            PodOp::Delete { node, .. } => {
                obs.pods.remove(node);
                obs.statuses.remove(node);
            }
        }
    }
    obs.revisions
        .retain(|x| !plan.drop_revisions.contains(&x.revision));
    if let Some(r) = &plan.put_revision {
        obs.revisions.push(r.clone());
    }
    if let Some(s) = &plan.status {
        obs.status = Some(s.clone());
    }
}

fn replaced(plan: &Plan) -> Vec<String> {
    plan.ops
        .iter()
        .filter_map(|o| match o {
            PodOp::Replace { node, .. } => Some(node.clone()),
            _ => None,
        })
        .collect()
}

fn valid(s: &PodSet, generation: i64) -> SetState {
    SetState::Valid {
        set: Box::new(s.clone()),
        generation,
    }
}

#[test]
fn a_new_set_gets_a_pod_on_every_matching_node_and_none_elsewhere() {
    let s = set("busybox:1");
    let mut obs = running(&s, &revision(&s, 1), 0);
    obs.revisions.clear();
    for (n, role) in [("a", "edge"), ("b", "core"), ("c", "edge")] {
        obs.nodes.push(NodeView {
            name: n.into(),
            labels: [("role".to_string(), role.to_string())].into(),
            unschedulable: false,
            admin_revision: 0,
        });
    }
    let plan = decide(&obs);
    assert_eq!(
        plan.ops,
        vec![
            PodOp::Create { node: "a".into() },
            PodOp::Create { node: "c".into() }
        ]
    );
    let r = plan.put_revision.as_ref().expect("revision 1");
    assert_eq!(r.revision, 1);
    let st = plan.status.as_ref().expect("status");
    assert_eq!(st.desired_number_scheduled, 2);
    assert_eq!(st.update_revision, 1);
    assert_eq!(st.steps, 1);
}

/// Whether a node has an available pod of the set: its key and its status say the same revision, ready.
fn available_on(o: &Observed, node: &str) -> bool {
    let p = o.pods.get(node);
    let s = o.statuses.get(node);
    p.is_some() && s.is_some_and(|s| s.ready && s.hash == p.and_then(|p| p.hash.clone()))
}

#[test]
fn a_template_change_replaces_at_most_max_unavailable_at_a_time() {
    let old = set("busybox:1");
    let new = set("busybox:2");
    let mut obs = running(&old, &revision(&old, 1), 4);
    obs.set = valid(&new, 8);
    let mut most = 0;
    for round in 0..20 {
        obs.now = t(100 + round * 10);
        let plan = decide(&obs);
        apply(&mut obs, &plan);
        let unavailable = obs
            .nodes
            .iter()
            .filter(|n| !available_on(&obs, &n.name))
            .count();
        most = most.max(unavailable);
        // The nodes whose new pod was written report it ready.
        for (node, p) in obs.pods.clone() {
            let reported = obs.statuses.get(&node).and_then(|s| s.hash.clone());
            if reported != p.hash {
                let h = p.hash.clone().unwrap_or_default();
                obs.statuses
                    .insert(node, status(&h, true, 100 + round * 10));
            }
        }
        if obs
            .status
            .as_ref()
            .is_some_and(|s| s.rollout.as_ref().is_some_and(|r| r.complete))
        {
            break;
        }
    }
    assert_eq!(most, 1, "maxUnavailable 1 held");
    let st = obs.status.expect("status");
    assert!(st.rollout.expect("rollout").complete);
    assert_eq!(st.updated_number_scheduled, 4);
    assert_eq!(st.last_good, Some(2));
    assert_eq!(st.current_revision, 2);
}

#[test]
fn a_written_pod_whose_status_is_older_counts_as_unavailable() {
    let old = set("busybox:1");
    let new = set("busybox:2");
    let mut obs = running(&old, &revision(&old, 1), 3);
    obs.revisions.push(revision(&new, 2));
    obs.set = valid(&new, 8);
    // n0 holds the new manifest, but its node still reports the old pod ready.
    obs.pods.insert("n0".into(), pod(&new.hash(), 30));
    let plan = decide(&obs);
    assert!(replaced(&plan).is_empty(), "{:?}", plan.ops);
}

#[test]
fn an_unavailable_old_pod_is_replaced_first_without_using_the_budget() {
    let old = set("busybox:1");
    let new = set("busybox:2");
    let mut obs = running(&old, &revision(&old, 1), 3);
    obs.revisions.push(revision(&new, 2));
    obs.set = valid(&new, 8);
    obs.statuses
        .insert("n2".into(), status(&old.hash(), false, 0));
    let plan = decide(&obs);
    assert_eq!(replaced(&plan), vec!["n2".to_string()]);
}

#[test]
fn a_percentage_replaces_that_share_at_once() {
    let text = set_text("busybox:2", "").replace(
        "  progressDeadlineSeconds: 60",
        "  updateStrategy: {rollingUpdate: {maxUnavailable: 25%}}",
    );
    let new = podset::parse(text.as_bytes()).expect("valid");
    let old = set("busybox:1");
    let mut obs = running(&old, &revision(&old, 1), 8);
    obs.set = valid(&new, 8);
    assert_eq!(replaced(&decide(&obs)).len(), 2);
}

#[test]
fn min_ready_seconds_holds_a_pod_back_from_available() {
    let text =
        set_text("busybox:1", "").replace("  progressDeadlineSeconds: 60", "  minReadySeconds: 30");
    let s = podset::parse(text.as_bytes()).expect("valid");
    let mut obs = running(&s, &revision(&s, 1), 2);
    obs.statuses
        .insert("n1".into(), status(&s.hash(), true, 90));
    let plan = decide(&obs);
    let st = plan.status.expect("status");
    assert_eq!(st.number_ready, 2);
    assert_eq!(st.number_available, 1);
    assert_eq!(plan.again, Some(Duration::from_secs(20)));
}

#[test]
fn a_rollout_past_its_deadline_stops_and_reverts_when_asked() {
    let revert = "hostlet.io/auto-revert: \"true\"";
    let good = podset::parse(set_text("busybox:1", revert).as_bytes()).expect("valid");
    let bad = podset::parse(set_text("busybox:nope", revert).as_bytes()).expect("valid");
    let mut obs = running(&good, &revision(&good, 1), 3);
    obs.status = decide(&obs).status;
    assert_eq!(obs.status.as_ref().and_then(|s| s.last_good), Some(1));
    obs.set = valid(&bad, 9);
    let plan = decide(&obs);
    assert_eq!(replaced(&plan), vec!["n0".to_string()]);
    apply(&mut obs, &plan);
    obs.statuses.insert(
        "n0".into(),
        StatusView {
            ready: false,
            hash: Some(bad.hash()),
            updated: t(101),
            phase: PodPhase::Pending,
            message: "main: ErrImagePull".into(),
            mod_revision: 2,
        },
    );
    // Before the deadline: waiting, nothing more replaced.
    obs.now = t(130);
    let plan = decide(&obs);
    assert!(replaced(&plan).is_empty());
    assert!(plan.again.is_some());
    apply(&mut obs, &plan);
    // After it: failed, naming the node, and reverted.
    obs.now = t(200);
    let plan = decide(&obs);
    assert!(
        plan.notes.iter().any(|n| matches!(n,
            Note::RolloutFailed { nodes, reason, .. }
                if nodes == &["n0".to_string()] && reason.contains("ErrImagePull"))),
        "{:?}",
        plan.notes
    );
    let back = plan.revert_to.as_ref().expect("reverted");
    assert_eq!(back.hash, good.hash());
    let st = plan.status.as_ref().expect("status");
    let cond = |st: &PodSetStatus, k: &str| st.condition(k).map(|c| c.status.clone());
    assert_eq!(cond(st, "RolloutFailed").as_deref(), Some("True"));
    assert_eq!(cond(st, "Reverted").as_deref(), Some("True"));
    assert!(
        replaced(&plan).is_empty(),
        "a failed rollout replaces nothing more"
    );

    // The set says the good template again: a new number for it, and n0 goes back first.
    apply(&mut obs, &plan);
    obs.set = valid(&good, 10);
    obs.revisions.push(revision(&bad, 2));
    let plan = decide(&obs);
    assert_eq!(plan.put_revision.as_ref().map(|r| r.revision), Some(3));
    assert_eq!(plan.drop_revisions, vec![1]);
    assert_eq!(replaced(&plan), vec!["n0".to_string()]);
    let st = plan.status.as_ref().expect("status");
    assert_eq!(cond(st, "Reverted").as_deref(), Some("True"));
    assert_eq!(
        cond(st, "RolloutFailed").as_deref(),
        Some("True"),
        "the failure is still told while the revert rolls out"
    );
    let told = st
        .condition("RolloutFailed")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(told.contains("revision 2") && told.contains("n0"), "{told}");

    // A new template ends both.
    apply(&mut obs, &plan);
    obs.set = valid(
        &podset::parse(set_text("busybox:3", revert).as_bytes()).expect("valid"),
        11,
    );
    let st = decide(&obs).status.expect("status");
    assert_eq!(cond(&st, "Reverted").as_deref(), Some("False"));
    assert_eq!(cond(&st, "RolloutFailed").as_deref(), Some("False"));
}

#[test]
fn without_auto_revert_a_failed_rollout_just_stops() {
    let good = set("busybox:1");
    let bad = set("busybox:nope");
    let mut obs = running(&good, &revision(&good, 1), 3);
    obs.status = decide(&obs).status;
    obs.set = valid(&bad, 9);
    let plan = decide(&obs);
    apply(&mut obs, &plan);
    obs.statuses
        .insert("n0".into(), status(&bad.hash(), false, 101));
    obs.now = t(300);
    let plan = decide(&obs);
    assert!(plan.revert_to.is_none());
    assert!(replaced(&plan).is_empty());
    apply(&mut obs, &plan);
    let again = decide(&obs);
    assert!(!again.writes(), "a stopped rollout stays quiet: {again:?}");
}

#[test]
fn a_paused_rollout_replaces_nothing_and_its_deadline_waits() {
    let good = set("busybox:1");
    let text = set_text("busybox:2", "").replace(
        "  progressDeadlineSeconds: 60",
        "  progressDeadlineSeconds: 60\n  paused: true",
    );
    let paused = podset::parse(text.as_bytes()).expect("valid");
    let mut obs = running(&good, &revision(&good, 1), 3);
    obs.set = valid(&paused, 9);
    let plan = decide(&obs);
    assert!(replaced(&plan).is_empty());
    apply(&mut obs, &plan);
    obs.now = t(1000);
    let plan = decide(&obs);
    apply(&mut obs, &plan);
    obs.set = valid(&set("busybox:2"), 10);
    let plan = decide(&obs);
    assert_eq!(replaced(&plan).len(), 1, "resumed");
    assert!(plan
        .notes
        .iter()
        .all(|n| !matches!(n, Note::RolloutFailed { .. })));
}

#[test]
fn a_node_that_stops_matching_loses_its_pod_and_a_cordoned_one_keeps_it() {
    let s = set("busybox:1");
    let mut obs = running(&s, &revision(&s, 1), 3);
    obs.nodes[1].labels.insert("role".into(), "core".into());
    obs.nodes[2].unschedulable = true;
    let plan = decide(&obs);
    assert_eq!(
        plan.ops,
        vec![PodOp::Delete {
            node: "n1".into(),
            mod_revision: 10
        }]
    );
    let st = plan.status.expect("status");
    assert_eq!(st.desired_number_scheduled, 1);
    assert_eq!(st.number_misscheduled, 1);
}

#[test]
fn a_cordoned_node_gets_no_new_pod() {
    let s = set("busybox:1");
    let mut obs = running(&s, &revision(&s, 1), 2);
    obs.pods.remove("n1");
    obs.nodes[1].unschedulable = true;
    assert!(decide(&obs).ops.is_empty());
}

#[test]
fn a_pod_the_set_did_not_write_is_left_alone_and_reported() {
    let s = set("busybox:1");
    let mut obs = running(&s, &revision(&s, 1), 2);
    obs.pods.insert(
        "n1".into(),
        PodView {
            owner: None,
            hash: None,
            mod_revision: 5,
        },
    );
    let plan = decide(&obs);
    assert!(plan.ops.is_empty(), "{:?}", plan.ops);
    assert_eq!(plan.foreign, vec!["n1".to_string()]);
}

#[test]
fn an_invalid_set_changes_no_pod_and_says_so_once() {
    let s = set("busybox:1");
    let mut obs = running(&s, &revision(&s, 1), 2);
    obs.set = SetState::Invalid {
        message: "spec.template.spec.containers[0].image: required".into(),
        generation: 12,
    };
    let plan = decide(&obs);
    assert!(plan.ops.is_empty());
    assert!(matches!(plan.notes.as_slice(), [Note::Invalid { .. }]));
    apply(&mut obs, &plan);
    assert!(!decide(&obs).writes());
}

#[test]
fn a_deleted_set_removes_its_pods_then_its_records() {
    let s = set("busybox:1");
    let mut obs = running(&s, &revision(&s, 1), 2);
    obs.status = decide(&obs).status;
    obs.set = SetState::Deleted;
    obs.pods.insert(
        "n9".into(),
        PodView {
            owner: None,
            hash: None,
            mod_revision: 3,
        },
    );
    let plan = decide(&obs);
    assert_eq!(plan.ops.len(), 2, "only the set's own pods: {:?}", plan.ops);
    apply(&mut obs, &plan);
    let plan = decide(&obs);
    assert!(plan.forget && plan.ops.is_empty());
}

#[test]
fn a_steady_set_writes_nothing() {
    let s = set("busybox:1");
    let mut obs = running(&s, &revision(&s, 1), 3);
    let plan = decide(&obs);
    apply(&mut obs, &plan);
    let plan = decide(&obs);
    assert!(!plan.writes(), "{plan:?}");
}

#[test]
fn old_revisions_are_pruned_to_the_history_limit() {
    let text = set_text("busybox:9", "")
        .replace("  progressDeadlineSeconds: 60", "  revisionHistoryLimit: 2");
    let s = podset::parse(text.as_bytes()).expect("valid");
    let mut obs = running(&s, &revision(&s, 9), 1);
    for i in 1..=5u64 {
        let old = set(&format!("busybox:old{i}"));
        obs.revisions.push(revision(&old, i));
    }
    let plan = decide(&obs);
    assert_eq!(plan.drop_revisions, vec![1, 2, 3]);
}

#[test]
fn on_delete_replaces_only_what_an_operator_deleted() {
    let text = set_text("busybox:2", "").replace(
        "  progressDeadlineSeconds: 60",
        "  updateStrategy: {type: OnDelete}",
    );
    let new = podset::parse(text.as_bytes()).expect("valid");
    let old = set("busybox:1");
    let mut obs = running(&old, &revision(&old, 1), 3);
    obs.set = valid(&new, 8);
    let plan = decide(&obs);
    assert!(replaced(&plan).is_empty(), "{:?}", plan.ops);
    apply(&mut obs, &plan);
    obs.pods.remove("n1");
    obs.statuses.remove("n1");
    let plan = decide(&obs);
    assert_eq!(plan.ops, vec![PodOp::Create { node: "n1".into() }]);
    assert_eq!(plan.update.map(|u| u.hash), Some(new.hash()));
}
