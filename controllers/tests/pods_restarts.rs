//! Restarts on the real Docker engine: a killed container comes back, a crashing one backs off
//! (CrashLoopBackOff), `restartPolicy: Never` is honoured, and liveness probes restart what fails them —
//! but not what errs once.

mod pods_support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hostlet_api::objects::{ContainerState, PodPhase};
use pods_support::{docker_lines, eventually, Harness};

#[tokio::test]
async fn a_killed_container_runs_again_with_restart_count_one() {
    let h = Harness::start("kill").await;
    h.put(
        "victim",
        "version: v1beta1\nid: victim\ncontainers:\n- name: app\n  image: busybox:latest\n  command: [sleep, '100000']\n",
    )
    .await;
    h.wait_status("victim", "running", Duration::from_secs(30), |s| {
        s.phase == PodPhase::Running
    })
    .await;
    let first = h.running_id("victim", "app").unwrap();
    docker_lines(&["kill", &first]);

    let status = h
        .wait_status("victim", "running again", Duration::from_secs(20), |s| {
            s.containers[0].restart_count == 1
                && matches!(s.containers[0].state, ContainerState::Running { .. })
        })
        .await;
    assert!(
        matches!(
            status.containers[0].last_state,
            Some(ContainerState::Terminated { exit_code: 137, .. })
        ),
        "{:?}",
        status.containers[0].last_state
    );
    let second = h.running_id("victim", "app").unwrap();
    assert_ne!(first, second);
    eventually("a second Started event", Duration::from_secs(5), || async {
        let started = h
            .events()
            .await
            .into_iter()
            .filter(|e| e.pod.as_deref() == Some("victim") && e.reason == "Started")
            // Repeats of one event aggregate into its count.
            .map(|e| e.count)
            .sum::<u64>();
        (started >= 2).then_some(())
    })
    .await;
}

/// `(unix nanos, action, restart count)` of the node's app container start/die events, from Docker.
fn lifecycle(h: &Harness, since: SystemTime) -> Vec<(u128, String, u32)> {
    let since = since
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let until = (SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 1)
    .to_string();
    let node = format!("label=io.hostlet.node={}", h.node.name);
    docker_lines(&[
        "events",
        "--since",
        &since,
        "--until",
        &until,
        "--filter",
        &node,
        "--filter",
        "label=io.hostlet.role=app",
        "--filter",
        "event=start",
        "--filter",
        "event=die",
        "--format",
        "{{.TimeNano}} {{.Action}} {{index .Actor.Attributes \"io.hostlet.restart-count\"}}",
    ])
    .into_iter()
    .map(|l| {
        let p: Vec<&str> = l.split(' ').collect();
        (
            p[0].parse().unwrap(),
            p[1].to_string(),
            p[2].parse().unwrap(),
        )
    })
    .collect()
}

#[tokio::test]
async fn a_crashing_container_backs_off() {
    let h = Harness::start("crash").await;
    let since = SystemTime::now() - Duration::from_secs(1);
    h.put(
        "crasher",
        "version: v1beta1\nid: crasher\ncontainers:\n- name: app\n  image: busybox:latest\n  command: [sh, -c, 'exit 1']\n",
    )
    .await;
    let waiting = h
        .wait_status("crasher", "CrashLoopBackOff", Duration::from_secs(30), |s| {
            matches!(&s.containers[0].state, ContainerState::Waiting { reason, .. } if reason == "CrashLoopBackOff")
        })
        .await;
    assert_eq!(
        waiting.phase,
        PodPhase::Running,
        "a pod restarting its container is Running"
    );
    assert!(matches!(
        waiting.containers[0].last_state,
        Some(ContainerState::Terminated { exit_code: 1, .. })
    ));
    h.wait_status("crasher", "second restart", Duration::from_secs(30), |s| {
        s.containers[0].restart_count >= 2
    })
    .await;
    h.wait_event("crasher", Some("app"), "BackOff", Duration::from_secs(5))
        .await;

    let events = lifecycle(&h, since);
    let at = |action: &str, rc: u32| {
        events
            .iter()
            .find(|(_, a, r)| a == action && *r == rc)
            .map(|(t, _, _)| *t)
            .unwrap_or_else(|| panic!("no {action} of restart {rc} in {events:?}"))
    };
    let first_wait = Duration::from_nanos((at("start", 1) - at("die", 0)) as u64);
    let second_wait = Duration::from_nanos((at("start", 2) - at("die", 1)) as u64);
    assert!(
        first_wait < Duration::from_secs(5),
        "the first restart is immediate: {first_wait:?}"
    );
    assert!(
        second_wait >= Duration::from_secs(10),
        "the second restart waits ≥ 10 s: {second_wait:?}"
    );
}

#[tokio::test]
async fn restart_policy_never_leaves_exited_containers_and_takes_the_phase_from_the_exit_code() {
    let h = Harness::start("never").await;
    h.put(
        "fails",
        "version: v1beta1\nid: fails\nrestartPolicy: Never\ncontainers:\n- name: app\n  image: busybox:latest\n  command: [sh, -c, 'sleep 0.5; exit 3']\n",
    )
    .await;
    h.put(
        "succeeds",
        "version: v1beta1\nid: succeeds\nrestartPolicy: Never\ncontainers:\n- name: app\n  image: busybox:latest\n  command: [sh, -c, 'sleep 0.5; exit 0']\n",
    )
    .await;
    let failed = h
        .wait_status("fails", "Failed", Duration::from_secs(30), |s| {
            s.phase == PodPhase::Failed
        })
        .await;
    assert!(matches!(
        &failed.containers[0].state,
        ContainerState::Terminated { exit_code: 3, reason, .. } if reason == "Error"
    ));
    let ok = h
        .wait_status("succeeds", "Succeeded", Duration::from_secs(30), |s| {
            s.phase == PodPhase::Succeeded
        })
        .await;
    assert!(matches!(
        &ok.containers[0].state,
        ContainerState::Terminated { exit_code: 0, reason, .. } if reason == "Completed"
    ));
    // Finished: the infra container goes, the app container stays (exited) and is not restarted.
    eventually(
        "the infra containers stopped",
        Duration::from_secs(10),
        || async {
            (h.running_id("fails", "net").is_none() && h.running_id("succeeds", "net").is_none())
                .then_some(())
        },
    )
    .await;
    let apps: Vec<_> = h
        .containers("fails")
        .into_iter()
        .filter(|c| c.1 == "app")
        .collect();
    assert_eq!(apps.len(), 1, "{apps:?}");
    assert!(!apps[0].3);
    assert_eq!(
        h.status("fails").await.unwrap().containers[0].restart_count,
        0
    );
}

const FAILING_HTTPD: &str = r#"mkdir -p /www/cgi-bin && printf '#!/bin/sh\necho Status: 500 Internal Server Error\necho\necho broken\n' > /www/cgi-bin/health && chmod +x /www/cgi-bin/health && exec httpd -f -p 8080 -h /www"#;

#[tokio::test]
async fn a_failing_liveness_probe_restarts_after_the_threshold_and_one_error_does_not() {
    let h = Harness::start("liveness").await;
    let sick = format!(
        "version: v1beta1\nid: sick\nterminationGracePeriodSeconds: 2\ncontainers:\n- name: web\n  image: busybox:latest\n  \
         command: [sh, -c, {FAILING_HTTPD:?}]\n  \
         livenessProbe: {{ httpGet: {{ path: /cgi-bin/health, port: 8080 }}, periodSeconds: 1, failureThreshold: 3 }}\n"
    );
    // Not listening for the first 1.5 s: the first probe errs (connection refused), then it passes.
    let slow = "version: v1beta1\nid: slow\ncontainers:\n- name: web\n  image: busybox:latest\n  \
         command: [sh, -c, 'sleep 1.5; mkdir -p /www; echo ok > /www/index.html; exec httpd -f -p 8080 -h /www']\n  \
         livenessProbe: { httpGet: { path: /index.html, port: 8080 }, periodSeconds: 2, failureThreshold: 1 }\n";
    h.put("sick", &sick).await;
    h.put("slow", slow).await;

    let restarted = h
        .wait_status(
            "sick",
            "restarted by its liveness probe",
            Duration::from_secs(30),
            |s| s.containers[0].restart_count >= 1,
        )
        .await;
    assert_eq!(restarted.phase, PodPhase::Running);
    let events = h.events().await;
    let sick_events: Vec<_> = events
        .iter()
        .filter(|e| e.pod.as_deref() == Some("sick"))
        .collect();
    let killing = sick_events
        .iter()
        .position(|e| e.reason == "Killing")
        .expect("a Killing event");
    // Repeats of one failure aggregate into one event's count.
    let unhealthy_before: u64 = sick_events[..killing]
        .iter()
        .filter(|e| e.reason == "Unhealthy")
        .map(|e| e.count)
        .sum();
    assert!(
        unhealthy_before >= 3,
        "killed after failureThreshold (3) failures: {sick_events:?}"
    );
    assert!(
        sick_events[killing - 1].message.contains("500"),
        "{:?}",
        sick_events[killing - 1]
    );
    let started = sick_events
        .iter()
        .find(|e| e.reason == "Started")
        .unwrap()
        .timestamp
        .0;
    let killed = sick_events[killing].timestamp.0;
    assert!(
        killed.duration_since(started).unwrap() >= Duration::from_secs(2),
        "three probes one period apart take at least two periods"
    );

    // The slow starter erred once and then passed: it is never restarted.
    let slow_status = h
        .wait_status("slow", "liveness passing", Duration::from_secs(15), |s| {
            s.containers[0].probes.get("liveness").map(String::as_str) == Some("success")
        })
        .await;
    assert_eq!(slow_status.containers[0].restart_count, 0);
    assert!(
        events
            .iter()
            .any(|e| e.pod.as_deref() == Some("slow") && e.reason == "Unhealthy"),
        "the first probe did err"
    );
    // Several more periods: still the first container.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let later = h.status("slow").await.unwrap();
    assert_eq!(later.containers[0].restart_count, 0);
    assert!(!h
        .events()
        .await
        .iter()
        .any(|e| e.pod.as_deref() == Some("slow") && e.reason == "Killing"));
}
