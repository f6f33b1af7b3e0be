//! Parsing and validation of pod manifests, old and new.

use hostlet_api::manifest::{
    Container, EnvVar, ExecAction, HttpGetAction, MountType, PodManifest, PortRef, Probe,
    ProbeAction, PullPolicy, Quantity, Resources, RestartPolicy, TcpSocketAction, Volume,
    VolumeMount, VolumeSource,
};
use hostlet_api::parse::{parse_manifest, parse_manifest_list, to_json, to_yaml};
use hostlet_api::validation::{resolve, validate, SourceKind, SourcedPod};
use proptest::prelude::*;

const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/manifests");

fn read(name: &str) -> Vec<u8> {
    std::fs::read(format!("{MANIFESTS}/{name}")).unwrap()
}

fn paths(m: &PodManifest) -> Vec<String> {
    validate(m).into_iter().map(|e| e.path).collect()
}

#[test]
fn design_example_is_valid_and_read_in_full() {
    let m = parse_manifest(&read("design-example.yaml")).unwrap();
    assert_eq!(validate(&m), vec![]);
    assert_eq!(m.id, "web");
    assert_eq!(m.effective_restart_policy(), RestartPolicy::Always);
    let c = &m.containers[0];
    assert_eq!(c.cpu_millis(), Some(500));
    assert_eq!(c.memory_bytes(), Some(64 * 1024 * 1024));
    assert_eq!(c.ports[0].host_ip.as_deref(), Some("127.0.0.1"));
    let probe = c.liveness_probe.as_ref().unwrap();
    assert!(
        matches!(probe.action(), Some(ProbeAction::Http(h)) if h.port == PortRef::Number(8080))
    );
    assert_eq!(probe.failure_threshold(), 3);
}

#[test]
fn manifest_of_2014_with_old_field_names_is_valid() {
    let m = parse_manifest(&read("kubelet-2014.yaml")).unwrap();
    assert_eq!(validate(&m), vec![]);
    assert_eq!(m.effective_restart_policy(), RestartPolicy::Always);
    assert_eq!(
        m.volumes[0].effective_source(),
        VolumeSource::default().clone_with_empty_dir()
    );
    let c = &m.containers[0];
    assert_eq!(c.env[0].name, "MODE");
    assert_eq!(c.volume_mounts[0].mount_path, "/var/log/nginx");
    assert_eq!(c.volume_mounts[1].mount_type, Some(MountType::Host));
    assert_eq!(c.cpu_millis(), Some(100));
    assert_eq!(c.memory_bytes(), Some(67108864));
    let probe = c.liveness_probe.as_ref().unwrap();
    assert_eq!(probe.initial_delay(), 30);
    match probe.action() {
        Some(ProbeAction::Http(h)) => assert_eq!(h.port.resolve(c), Some(80)),
        other => panic!("{other:?}"),
    }
}

trait EmptyDirDefault {
    fn clone_with_empty_dir(&self) -> VolumeSource;
}
impl EmptyDirDefault for VolumeSource {
    fn clone_with_empty_dir(&self) -> VolumeSource {
        VolumeSource::default()
    }
}

#[test]
fn restart_policy_in_every_spelling() {
    for (text, want) in [
        ("restartPolicy: Never", RestartPolicy::Never),
        ("restartPolicy: {onFailure: {}}", RestartPolicy::OnFailure),
        ("restartPolicy: {never: {}}", RestartPolicy::Never),
        ("restartPolicy: OnFailure", RestartPolicy::OnFailure),
    ] {
        let doc =
            format!("version: v1beta1\nid: p\n{text}\ncontainers: [{{name: a, image: busybox}}]\n");
        assert_eq!(
            parse_manifest(doc.as_bytes()).unwrap().restart_policy,
            Some(want),
            "{text}"
        );
    }
    let bad =
        parse_manifest(b"version: v1beta1\nid: p\nrestartPolicy: Sometimes\ncontainers: []\n")
            .unwrap_err();
    assert!(bad.message.contains("restartPolicy"), "{bad}");
    assert_eq!(bad.line, Some(3), "{bad:?}");
}

#[test]
fn json_and_yaml_read_the_same() {
    let json = parse_manifest(&read("json-pod.json")).unwrap();
    let yaml = parse_manifest(to_yaml(&json).as_bytes()).unwrap();
    assert_eq!(json, yaml);
    assert_eq!(
        validate(&json),
        vec![],
        "same host port on TCP and UDP is fine"
    );
}

#[test]
fn parse_errors_carry_line_and_column() {
    let e =
        parse_manifest(b"version: v1beta1\nid: p\ncontainers:\n  - name: a\n    image: [busybox\n")
            .unwrap_err();
    assert_eq!(e.line, Some(6));
    assert!(e.column.is_some());
    let e = parse_manifest(b"{\"version\": \"v1beta1\",\n \"id\": 7\n}").unwrap_err();
    assert_eq!(e.line, Some(2), "{e:?}");
    assert!(e.to_string().starts_with("line 2, column"), "{e}");
    let e = parse_manifest(
        b"version: v1beta1\ncontainers:\n  - name: a\n    ports: [{containerPort: eighty}]\n",
    )
    .unwrap_err();
    assert_eq!(e.line, Some(4), "{e:?}");
}

#[test]
fn bytes_that_are_not_text_are_an_error_not_a_panic() {
    let e = parse_manifest_list(&[0xff, 0xfe, 0x00, 0x12]).unwrap_err();
    assert!(e.message.contains("UTF-8"), "{e}");
    assert!(parse_manifest_list(b"\x01\x02 plain").is_err());
    assert!(parse_manifest(b"just a string").is_err());
}

#[test]
fn lists_documents_and_empty_inputs() {
    assert_eq!(parse_manifest_list(b"[]").unwrap().len(), 0);
    assert_eq!(parse_manifest_list(b"").unwrap().len(), 0);
    assert_eq!(parse_manifest_list(b"  \n").unwrap().len(), 0);
    let docs = b"version: v1beta1\nid: a\n---\nversion: v1beta1\nid: b\n";
    let items = parse_manifest_list(docs).unwrap();
    let ids: Vec<_> = items
        .iter()
        .map(|i| i.as_ref().unwrap().id.clone())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    // One malformed item does not hide the others.
    let items = parse_manifest_list(
        b"- {version: v1beta1, id: a}\n- {version: v1beta1, id: [x]}\n- {id: c}\n",
    )
    .unwrap();
    assert!(items[0].is_ok());
    assert!(items[1].as_ref().unwrap_err().message.starts_with("[1]"));
    assert!(items[2].is_ok());
    assert!(
        parse_manifest(b"[]").is_err(),
        "a pod key holds one manifest"
    );
}

#[test]
fn every_error_is_reported_at_once_with_its_path() {
    let m = parse_manifest(&read("many-errors.yaml")).unwrap();
    let got = paths(&m);
    for want in [
        "id",
        "volumes[1].name",
        "containers[0].ports[0].containerPort",
        "containers[0].ports[0].protocol",
        "containers[1].name",
        "containers[1].image",
        "containers[1].volumeMounts[0].name",
        "containers[1].volumeMounts[0].mountPath",
        "containers[1].ports[1].hostPort",
    ] {
        assert!(got.contains(&want.to_string()), "missing {want} in {got:?}");
    }
}

#[test]
fn required_fields() {
    let m = parse_manifest(b"id: ''\ncontainers: []\n").unwrap();
    assert_eq!(paths(&m), ["version", "id", "containers"]);
    let m =
        parse_manifest(b"version: v1beta3\nid: p\ncontainers: [{name: a, image: b}]\n").unwrap();
    assert_eq!(paths(&m), ["version"]);
}

#[test]
fn host_port_conflicts_key_on_ip_port_and_protocol() {
    let pod = |ports: &str| {
        parse_manifest(
            format!(
                "version: v1beta1\nid: p\ncontainers:\n- name: a\n  image: b\n  ports: {ports}\n"
            )
            .as_bytes(),
        )
        .unwrap()
    };
    assert_eq!(
        paths(&pod(
            "[{containerPort: 1, hostPort: 80}, {containerPort: 2, hostPort: 80, protocol: UDP}]"
        )),
        Vec::<String>::new()
    );
    assert_eq!(
        paths(&pod("[{containerPort: 1, hostPort: 80, hostIP: 127.0.0.1}, {containerPort: 2, hostPort: 80, hostIP: 127.0.0.2}]")),
        Vec::<String>::new()
    );
    assert_eq!(
        paths(&pod("[{containerPort: 1, hostPort: 80, hostIP: 127.0.0.1}, {containerPort: 2, hostPort: 80}]")),
        ["containers[0].ports[1].hostPort"]
    );
    assert_eq!(
        paths(&pod("[{containerPort: 1}, {containerPort: 2}]")),
        Vec::<String>::new(),
        "hostPort 0 is unpublished"
    );
    assert_eq!(
        paths(&pod("[{containerPort: 1, hostPort: -1}]")),
        ["containers[0].ports[0].hostPort"]
    );
}

#[test]
fn probes_are_checked() {
    let pod = |probe: &str| {
        parse_manifest(
            format!("version: v1beta1\nid: p\ncontainers:\n- name: a\n  image: b\n  ports: [{{name: web, containerPort: 80}}]\n  livenessProbe: {probe}\n")
                .as_bytes(),
        )
        .unwrap()
    };
    assert!(paths(&pod("{httpGet: {port: web}}")).is_empty());
    assert!(paths(&pod("{tcpSocket: {port: 80}, periodSeconds: 2}")).is_empty());
    assert!(paths(&pod("{exec: {command: [true]}}")).is_empty());
    assert_eq!(
        paths(&pod("{httpGet: {port: nope}}")),
        ["containers[0].livenessProbe.httpGet.port"]
    );
    assert_eq!(paths(&pod("{}")), ["containers[0].livenessProbe"]);
    assert_eq!(
        paths(&pod("{type: udp, httpGet: {port: 80}}")),
        ["containers[0].livenessProbe.type"]
    );
    assert_eq!(
        paths(&pod("{exec: {command: []}, failureThreshold: 0}")),
        [
            "containers[0].livenessProbe.exec.command",
            "containers[0].livenessProbe.failureThreshold"
        ]
    );
}

/// Numbers the agent turns into timers or CPU quotas are bounded, so a valid manifest never overflows them.
#[test]
fn durations_thresholds_and_cpus_have_upper_bounds() {
    let pod = |extra: &str, container: &str| {
        parse_manifest(
            format!(
                "version: v1beta1\nid: p\n{extra}containers:\n- name: a\n  image: b\n{container}"
            )
            .as_bytes(),
        )
        .unwrap()
    };
    assert!(paths(&pod("terminationGracePeriodSeconds: 31536000\n", "")).is_empty());
    assert_eq!(
        paths(&pod(
            "terminationGracePeriodSeconds: 9223372036854775807\n",
            ""
        )),
        ["terminationGracePeriodSeconds"]
    );
    assert_eq!(
        paths(&pod(
            "",
            "  livenessProbe: {exec: {command: [true]}, initialDelaySeconds: 9223372036854775807, periodSeconds: 31536001, failureThreshold: 1000001}\n"
        )),
        [
            "containers[0].livenessProbe.initialDelaySeconds",
            "containers[0].livenessProbe.periodSeconds",
            "containers[0].livenessProbe.failureThreshold"
        ]
    );
    assert_eq!(
        paths(&pod(
            "",
            "  resources: {limits: {cpu: 9e15}, requests: {cpu: 1000000}}\n"
        )),
        ["containers[0].resources.limits.cpu"]
    );
}

#[test]
fn resources_are_quantities() {
    let pod = |limits: &str| {
        parse_manifest(format!("version: v1beta1\nid: p\ncontainers:\n- name: a\n  image: b\n  resources: {{limits: {limits}}}\n").as_bytes())
            .unwrap()
    };
    assert!(paths(&pod("{cpu: 1.5, memory: 1G}")).is_empty());
    assert_eq!(pod("{cpu: 2}").containers[0].cpu_millis(), Some(2000));
    assert_eq!(pod("{cpu: 250m}").containers[0].cpu_millis(), Some(250));
    assert_eq!(
        pod("{memory: 1Ki}").containers[0].memory_bytes(),
        Some(1024)
    );
    assert_eq!(
        paths(&pod("{cpu: lots, gpu: 1}")),
        [
            "containers[0].resources.limits.cpu",
            "containers[0].resources.limits.gpu"
        ]
    );
}

fn sourced(source: SourceKind, origin: &str, yaml: &str) -> SourcedPod {
    SourcedPod {
        source,
        origin: origin.into(),
        ordinal: 0,
        manifest: parse_manifest(yaml.as_bytes()).unwrap(),
    }
}

#[test]
fn source_order_decides_duplicate_ids_and_port_clashes() {
    let http = sourced(
        SourceKind::Http,
        "POST /pods",
        "version: v1beta1\nid: web\ncontainers: [{name: a, image: b}]",
    );
    let key = sourced(
        SourceKind::EtcdKey,
        "/hostlet/hosts/n/pods/web",
        "version: v1beta1\nid: web\ncontainers: [{name: a, image: c}]",
    );
    let file_port = sourced(
        SourceKind::File,
        "/etc/hostlet/a.yaml",
        "version: v1beta1\nid: aaa\ncontainers: [{name: a, image: b, ports: [{containerPort: 1, hostPort: 9000}]}]",
    );
    let list_port = sourced(
        SourceKind::EtcdList,
        "/registry/hosts/n/kubelet",
        "version: v1beta1\nid: zzz\ncontainers: [{name: a, image: b, ports: [{containerPort: 1, hostPort: 9000}]}]",
    );
    // Input order must not matter.
    for input in [
        vec![
            http.clone(),
            key.clone(),
            file_port.clone(),
            list_port.clone(),
        ],
        vec![
            list_port.clone(),
            file_port.clone(),
            key.clone(),
            http.clone(),
        ],
    ] {
        let r = resolve(input);
        assert_eq!(r.accepted.keys().collect::<Vec<_>>(), ["web", "zzz"]);
        assert_eq!(r.accepted["web"].source, SourceKind::EtcdKey);
        assert_eq!(r.rejected.len(), 2);
        let reasons: Vec<_> = r
            .rejected
            .iter()
            .map(|(p, why)| (p.manifest.id.clone(), why.clone()))
            .collect();
        assert!(
            reasons
                .iter()
                .any(|(id, why)| id == "web" && why.contains("etcd key /hostlet/hosts/n/pods/web")),
            "{reasons:?}"
        );
        assert!(
            reasons
                .iter()
                .any(|(id, why)| id == "aaa" && why.contains("9000") && why.contains("zzz")),
            "{reasons:?}"
        );
    }
}

// ---- parse ∘ serialize is the identity -------------------------------------------------------------

fn label() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,10}[a-z0-9]"
}

fn port_ref() -> impl Strategy<Value = PortRef> {
    prop_oneof![
        (1i64..65536).prop_map(PortRef::Number),
        label().prop_map(PortRef::Name)
    ]
}

fn probe() -> impl Strategy<Value = Probe> {
    (
        prop_oneof![
            port_ref().prop_map(|p| (
                Some(HttpGetAction {
                    path: Some("/h".into()),
                    port: p,
                    host: None
                }),
                None,
                None
            )),
            port_ref().prop_map(|p| (None, Some(TcpSocketAction { port: p }), None)),
            proptest::collection::vec(".{0,8}", 1..3).prop_map(|c| (
                None,
                None,
                Some(ExecAction { command: c })
            )),
        ],
        proptest::option::of(0i64..100),
        proptest::option::of(1i64..100),
    )
        .prop_map(|((h, t, e), delay, period)| Probe {
            kind: None,
            http_get: h,
            tcp_socket: t,
            exec: e,
            initial_delay_seconds: delay,
            period_seconds: period,
            ..Default::default()
        })
}

fn container() -> impl Strategy<Value = Container> {
    (
        label(),
        "[a-z]{1,8}(:[a-z0-9.]{1,5})?",
        proptest::option::of(prop_oneof![
            Just(PullPolicy::Always),
            Just(PullPolicy::IfNotPresent),
            Just(PullPolicy::Never)
        ]),
        proptest::collection::vec(".{0,12}", 0..4),
        proptest::collection::vec(
            ("[A-Z_]{1,6}", ".{0,8}").prop_map(|(n, v)| EnvVar {
                name: n,
                value: v,
                ..Default::default()
            }),
            0..3,
        ),
        proptest::collection::vec(
            (
                1i64..65536,
                0i64..65536,
                proptest::option::of(prop_oneof![
                    Just("TCP".to_string()),
                    Just("UDP".to_string())
                ]),
            )
                .prop_map(|(c, h, p)| hostlet_api::manifest::Port {
                    name: String::new(),
                    container_port: c,
                    host_port: h,
                    protocol: p,
                    host_ip: None,
                }),
            0..3,
        ),
        proptest::collection::vec(
            (
                label(),
                "/[a-z]{1,8}",
                any::<bool>(),
                proptest::option::of(prop_oneof![Just(MountType::Host), Just(MountType::Local)]),
            )
                .prop_map(|(n, p, ro, mt)| VolumeMount {
                    name: n,
                    mount_path: p,
                    read_only: ro,
                    mount_type: mt,
                }),
            0..2,
        ),
        proptest::option::of((1i64..4000, 1i64..1_000_000).prop_map(|(c, m)| {
            Resources {
                limits: [
                    ("cpu".to_string(), Quantity(format!("{c}m"))),
                    ("memory".to_string(), Quantity(format!("{m}Ki"))),
                ]
                .into(),
                requests: Default::default(),
            }
        })),
        proptest::option::of(probe()),
        proptest::option::of(probe()),
    )
        .prop_map(
            |(name, image, pull, command, env, ports, mounts, resources, live, ready)| Container {
                name,
                image,
                image_pull_policy: pull,
                command,
                args: Vec::new(),
                working_dir: None,
                env,
                env_from: Vec::new(),
                ports,
                volume_mounts: mounts,
                resources,
                cpu: None,
                memory: None,
                liveness_probe: live,
                readiness_probe: ready,
                startup_probe: None,
                privileged: false,
                security_context: None,
                lifecycle: None,
                restart_policy: None,
            },
        )
}

fn manifest() -> impl Strategy<Value = PodManifest> {
    (
        prop_oneof![Just("v1beta1".to_string()), Just("v1beta2".to_string())],
        "[a-z][a-z0-9.-]{0,20}[a-z0-9]",
        proptest::option::of(prop_oneof![
            Just(RestartPolicy::Always),
            Just(RestartPolicy::OnFailure),
            Just(RestartPolicy::Never)
        ]),
        proptest::option::of(0i64..600),
        proptest::collection::vec(
            (
                label(),
                proptest::option::of(prop_oneof![
                    Just(VolumeSource {
                        empty_dir: Some(Default::default()),
                        ..Default::default()
                    }),
                    "/[a-z]{1,8}".prop_map(|p| VolumeSource {
                        host_dir: Some(hostlet_api::manifest::HostDir {
                            path: p,
                            kind: None
                        }),
                        ..Default::default()
                    }),
                ]),
            )
                .prop_map(|(name, source)| Volume { name, source }),
            0..3,
        ),
        proptest::collection::vec(container(), 1..4),
    )
        .prop_map(
            |(version, id, rp, grace, volumes, containers)| PodManifest {
                form: Default::default(),
                version,
                id,
                uuid: None,
                labels: Default::default(),
                annotations: Default::default(),
                restart_policy: rp,
                termination_grace_period_seconds: grace,
                volumes,
                init_containers: Vec::new(),
                containers,
                security_context: None,
                dns_policy: None,
                dns_config: None,
                host_aliases: Vec::new(),
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn parse_of_serialized_yaml_is_identity(m in manifest()) {
        prop_assert_eq!(parse_manifest(to_yaml(&m).as_bytes()).unwrap(), m);
    }

    #[test]
    fn parse_of_serialized_json_is_identity(m in manifest()) {
        prop_assert_eq!(parse_manifest(to_json(&m).as_bytes()).unwrap(), m);
    }

    #[test]
    fn validation_never_panics(m in manifest()) {
        let _ = validate(&m);
    }

    #[test]
    fn parsing_arbitrary_text_never_panics(s in ".{0,200}") {
        let _ = parse_manifest_list(s.as_bytes());
    }
}

#[test]
fn a_pod_admitted_first_keeps_its_host_port_whatever_the_newcomers_id_or_source() {
    use hostlet_api::validation::resolve_admitted;
    let running = sourced(
        SourceKind::Http,
        "POST /pods",
        "version: v1beta1\nid: zz-port\ncontainers: [{name: a, image: b, ports: [{containerPort: 1, hostPort: 9100}]}]",
    );
    let newcomer = sourced(
        SourceKind::EtcdKey,
        "/hostlet/hosts/n/pods/aa-port",
        "version: v1beta1\nid: aa-port\ncontainers: [{name: a, image: b, ports: [{containerPort: 1, hostPort: 9100}]}]",
    );
    // Arriving together, the source order then the id decide: the etcd key's aa-port wins.
    let together = resolve_admitted(vec![running.clone(), newcomer.clone()], &Default::default());
    assert_eq!(together.accepted.keys().collect::<Vec<_>>(), ["aa-port"]);
    // zz-port was admitted first: it keeps the port, and the newcomer is rejected naming it.
    let admitted = [("zz-port".to_string(), 1u128)].into_iter().collect();
    let r = resolve_admitted(vec![newcomer, running], &admitted);
    assert_eq!(r.accepted.keys().collect::<Vec<_>>(), ["zz-port"]);
    let (loser, why) = &r.rejected[0];
    assert_eq!(loser.manifest.id, "aa-port");
    assert!(
        why.contains("zz-port") && why.contains("admitted first") && why.contains("rejected"),
        "{why}"
    );
}

#[test]
fn unknown_fields_are_refused_with_their_paths() {
    let e = hostlet_api::parse_manifest(
        b"version: v1beta1\nid: uf\nbogus: 1\ncontainers: [{name: c, image: busybox, imagePullPolcy: Always}]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("bogus") && e.contains("containers[0].imagePullPolcy"),
        "{e}"
    );
    let e = hostlet_api::parse_manifest(
        br#"{"version":"v1beta1","id":"j","containers":[],"extra":{}}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("extra: unknown field"), "{e}");
    // The 2014 object form of restartPolicy is not an unknown field.
    assert!(hostlet_api::parse_manifest(
        b"version: v1beta1\nid: r\nrestartPolicy: {always: {}}\ncontainers: [{name: c, image: busybox}]\n"
    )
    .is_ok());
}

#[test]
fn messages_speak_yaml_not_rust() {
    let e = hostlet_api::parse_manifest(
        b"version: v1beta1\nid: t\ncontainers: [{name: c, image: busybox, ports: [{containerPort: abc, hostPort: 70000}]}]\n",
    )
    .unwrap_err()
    .to_string();
    for rust in ["i64", "u16", "i32", "struct", "sequence"] {
        assert!(!e.contains(rust), "{e}");
    }
    let e = hostlet_api::parse_manifest(b"\"just a string\"")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("expected one manifest (a mapping), found a string"),
        "{e}"
    );
    assert!(!e.contains("list"), "a pod key takes one manifest: {e}");
    assert_eq!(
        hostlet_api::parse::plain_words(
            "invalid type: string \"x\", expected struct SnapshotPolicy"
        ),
        "invalid type: string \"x\", expected a mapping"
    );
}

/// Today's fields on top of [`manifest`]: args, labels, annotations, requests, init containers; in
/// either form.
fn manifest_of_either_form() -> impl Strategy<Value = PodManifest> {
    (
        manifest(),
        proptest::collection::vec("[a-z -]{0,6}", 0..3),
        proptest::collection::btree_map("[a-z]{1,5}", "[a-z0-9]{0,5}", 0..3),
        proptest::collection::btree_map("[a-z.]{1,8}/[a-z]{1,5}", ".{0,12}", 0..2),
        proptest::collection::vec(container(), 0..3),
        proptest::option::of(1i64..2000),
        any::<bool>(),
    )
        .prop_map(|(mut m, args, labels, annotations, inits, cpu_req, v1)| {
            if let Some(c) = m.containers.first_mut() {
                c.args = args;
                if let Some(cpu) = cpu_req {
                    c.resources
                        .get_or_insert_with(Default::default)
                        .requests
                        .insert("cpu".into(), Quantity(format!("{cpu}m")));
                }
            }
            m.labels = labels;
            m.annotations = annotations;
            m.init_containers = inits
                .into_iter()
                .enumerate()
                .map(|(i, mut c)| {
                    c.name = format!("init-{i}");
                    c.liveness_probe = None;
                    c.readiness_probe = None;
                    c
                })
                .collect();
            if v1 {
                m = hostlet_api::v1::as_v1(&m);
            }
            m
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn either_form_reads_back_from_yaml_and_json(m in manifest_of_either_form()) {
        prop_assert_eq!(parse_manifest(to_yaml(&m).as_bytes()).unwrap(), m.clone());
        prop_assert_eq!(parse_manifest(to_json(&m).as_bytes()).unwrap(), m.clone());
        let _ = validate(&m);
    }
}
