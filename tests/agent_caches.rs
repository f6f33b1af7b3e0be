//! The shared caches of a running agent: one informer per key prefix, one work queue and reconcile series
//! per controller, a change of the member cache reaching its readers, and a deleted node record reaching
//! member removal with the record it held.

mod member_support;

use std::time::Duration;

use member_support::*;

fn metrics(n: &Node) -> String {
    n.get_metrics("/metrics")
        .map(|(_, t)| t)
        .unwrap_or_default()
}

fn reconciles(text: &str, controller: &str) -> f64 {
    ["success", "error", "requeue"]
        .iter()
        .filter_map(|r| {
            metric(
                text,
                &format!("hostlet_reconcile_total{{controller=\"{controller}\",result=\"{r}\"}}"),
            )
        })
        .sum()
}

#[test]
fn one_informer_per_prefix_one_queue_per_controller_and_a_member_change_reaches_the_learner_manager(
) {
    let mut n = Node::new("caches-1");
    n.start(&[]);
    n.wait_ready(Duration::from_secs(30));
    let listed = [
        "tombstone-request",
        "snapshot-policy",
        "snapshot-node-policy",
        "snapshot-requests",
    ];
    let text = eventually("the caches listed", Duration::from_secs(30), || {
        let t = metrics(&n);
        listed
            .iter()
            .all(|informer| {
                metric(
                    &t,
                    &format!(
                        "hostlet_informer_events_total{{informer=\"{informer}\",type=\"init_done\"}}"
                    ),
                )
                .is_some_and(|v| v >= 1.0)
            })
            .then_some(t)
    });
    // Each cache was listed once: a second informer over the same prefix would list it again.
    for informer in [
        "members",
        "nodes",
        "learner-progress",
        "tombstone-request",
        "snapshot-policy",
        "snapshot-node-policy",
        "snapshot-requests",
        "node-labels",
        "podsets",
        "host-pods",
    ] {
        let key = format!("hostlet_informer_events_total{{informer=\"{informer}\",type=\"init\"}}");
        assert_eq!(metric(&text, &key), Some(1.0), "{key}\n{text}");
    }
    // Every controller has its own queue.
    for controller in [
        "pods",
        "learners",
        "member-removal",
        "upkeep",
        "rejoin",
        "snapshots",
        "podsets",
    ] {
        let key = format!("workqueue_adds_total{{name=\"{controller}\"}}");
        assert!(metric(&text, &key).is_some(), "{key}\n{text}");
        for result in ["success", "error", "requeue"] {
            let key = format!(
                "hostlet_reconcile_total{{controller=\"{controller}\",result=\"{result}\"}}"
            );
            assert!(metric(&text, &key).is_some(), "{key}\n{text}");
        }
    }

    // A learner added by hand (it never starts) is a change of the member cache. The learner manager has
    // no timer of its own: only the change can make it reconcile and count the learner.
    let learners_before = reconciles(&text, "learners");
    let readers_before = ["rejoin", "upkeep"].map(|c| reconciles(&text, c));
    let peer = format!("http://127.0.0.1:{}", free_port());
    let add = n.etcdctl(&[
        "member",
        "add",
        "never-starts",
        "--learner",
        "--peer-urls",
        &peer,
    ]);
    assert!(add.status.success(), "{}", output_text(&add));
    let id = eventually(
        "the learner in the member list",
        Duration::from_secs(10),
        || {
            let o = n.etcdctl(&["member", "list", "-w", "json"]);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
            v["members"].as_array()?.iter().find_map(|m| {
                (m["peerURLs"][0] == peer.as_str())
                    .then(|| m["ID"].as_u64())
                    .flatten()
            })
        },
    );
    // The cache looks slowly while nothing happens: within its slow period and a margin.
    wait_for_nodes(
        "the learner manager reconciled the change",
        Duration::from_secs(45),
        &[&n],
        || {
            let t = metrics(&n);
            (reconciles(&t, "learners") > learners_before
                && metric(&t, "hostlet_etcd_members{role=\"learner\"}") == Some(1.0))
            .then_some(())
        },
    );
    // The other readers of the member cache reconcile too (they also follow its statuses, so this shows
    // the change reached them, not that only it did).
    let t = metrics(&n);
    for (c, before) in ["rejoin", "upkeep"].iter().zip(readers_before) {
        assert!(reconciles(&t, c) > before, "{c} did not reconcile\n{t}");
    }

    let rm = n.etcdctl(&["member", "remove", &format!("{id:x}")]);
    assert!(rm.status.success(), "{}", output_text(&rm));

    // A node record that goes is a delete of the node cache, carrying the record: it reaches member
    // removal, which has no other trigger. This record names no member, so nothing is removed.
    let removal_before = reconciles(&metrics(&n), "member-removal");
    let record = r#"{"name":"ghost","address":"127.0.0.9","version":"test","started":"2026-01-01T00:00:00Z"}"#;
    let put = n.etcdctl(&["put", "/hostlet/nodes/ghost", record]);
    assert!(put.status.success(), "{}", output_text(&put));
    let del = n.etcdctl(&["del", "/hostlet/nodes/ghost"]);
    assert!(del.status.success(), "{}", output_text(&del));
    wait_for_nodes(
        "member removal reconciled the deleted record",
        Duration::from_secs(30),
        &[&n],
        || (reconciles(&metrics(&n), "member-removal") > removal_before).then_some(()),
    );
    let t = metrics(&n);
    assert_eq!(
        metric(&t, "hostlet_member_removals_total{result=\"success\"}"),
        Some(0.0),
        "{t}"
    );
    let list = n.etcdctl(&["member", "list"]);
    assert!(
        output_text(&list).contains(&n.member_name()),
        "{}",
        output_text(&list)
    );
}
