//! The Kubernetes v1 Pod form: the documentation's examples read as written, fields outside the subset
//! refused with their path, validation speaking the form's paths, and both forms written back faithfully.

use hostlet_api::manifest::{Form, PodManifest};
use hostlet_api::parse::{parse_manifest, parse_manifest_list, to_json, to_yaml, to_yaml_as};
use hostlet_api::validation::validate;

const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/manifests");

fn read(name: &str) -> Vec<u8> {
    std::fs::read(format!("{MANIFESTS}/{name}")).unwrap()
}

fn errors(m: &PodManifest) -> Vec<String> {
    validate(m).iter().map(ToString::to_string).collect()
}

#[test]
fn the_documentation_examples_are_valid_and_read_in_full() {
    for f in [
        "k8s-simple-pod.yaml",
        "k8s-two-containers.yaml",
        "k8s-init-containers.yaml",
        "k8s-liveness-exec.yaml",
        "k8s-tcp-liveness-readiness.yaml",
        "k8s-configmap-env.yaml",
        "k8s-configmap-envfrom.yaml",
        "k8s-configmap-command.yaml",
        "k8s-configmap-volume.yaml",
        "k8s-secret-pod.yaml",
        "k8s-secret-env.yaml",
        "k8s-lifecycle.yaml",
        "k8s-sidecar.yaml",
        "k8s-sidecar-job.yaml",
    ] {
        let m = parse_manifest(&read(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(m.form, Form::V1, "{f}");
        assert_eq!(m.version, "v1", "{f}");
        assert!(errors(&m).is_empty(), "{f}: {:?}", errors(&m));
    }
    let m = parse_manifest(&read("k8s-init-containers.yaml")).unwrap();
    assert_eq!(m.id, "init-demo");
    assert_eq!(m.labels["app"], "init-demo");
    assert_eq!(m.annotations["example.com/origin"], "kubernetes-docs");
    let inits: Vec<&str> = m.init_containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(inits, ["install", "check"]);
    assert_eq!(m.containers[0].name, "nginx");
    assert!(m.volumes[0].effective_source().empty_dir.is_some());
    assert!(m.containers[0].readiness_probe.is_some());

    let two = parse_manifest(&read("k8s-two-containers.yaml")).unwrap();
    assert_eq!(two.containers[1].command, ["/bin/sh"]);
    assert_eq!(
        two.containers[1].args,
        [
            "-c",
            "echo Hello from the debian container > /pod-data/index.html"
        ]
    );

    let live = parse_manifest(&read("k8s-liveness-exec.yaml")).unwrap();
    assert!(live.containers[0].command.is_empty());
    assert_eq!(live.containers[0].args[0], "/bin/sh");

    let tcp = parse_manifest(&read("k8s-tcp-liveness-readiness.yaml")).unwrap();
    assert_eq!(tcp.containers[0].cpu_request_millis(), Some(100));
    assert_eq!(tcp.containers[0].memory_request_bytes(), Some(16 << 20));
    assert_eq!(tcp.containers[0].memory_bytes(), Some(64 << 20));
}

#[test]
fn fields_outside_the_subset_are_refused_with_their_path() {
    let e = parse_manifest(&read("k8s-node-affinity.yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("spec.affinity: unknown field"), "{e}");
    for (yaml, path) in [
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: x}\nspec: {containers: [{name: a, image: b}]}\n",
            "metadata.namespace",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, image: b, env: [{name: X, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]}]}\n",
            "spec.containers[0].env[0].valueFrom.fieldRef",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {initContainers: [{name: i, image: b, securityContext: {seLinuxOptions: {}}}], containers: [{name: a, image: b}]}\n",
            "spec.initContainers[0].securityContext.seLinuxOptions",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, image: b}]}\nstatus: {phase: Running}\n",
            "status",
        ),
        // The 2014 top-level fields are not fields of a v1 Pod.
        (
            "apiVersion: v1\nkind: Pod\nid: p\nmetadata: {name: p}\nspec: {containers: [{name: a, image: b}]}\n",
            "id",
        ),
        // Nor are the 2014 form's spellings and fields inside a container.
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, image: b, env: [{key: X, value: y}]}]}\n",
            "spec.containers[0].env[0].key",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, image: b, ports: [{containerPort: 80, hostPort: 8080, hostIp: 127.0.0.1}]}]}\n",
            "spec.containers[0].ports[0].hostIp",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {volumes: [{name: v, emptyDir: {}}], initContainers: [{name: i, image: b, volumeMounts: [{name: v, path: /v}]}], containers: [{name: a, image: b}]}\n",
            "spec.initContainers[0].volumeMounts[0].path",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {volumes: [{name: v, emptyDir: {}}], containers: [{name: a, image: b, volumeMounts: [{name: v, mountPath: /v, mountType: LOCAL}]}]}\n",
            "spec.containers[0].volumeMounts[0].mountType",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, image: b, readinessProbe: {type: tcp, tcpSocket: {port: 80}}}]}\n",
            "spec.containers[0].readinessProbe.type",
        ),
    ] {
        let e = parse_manifest(yaml.as_bytes()).unwrap_err().to_string();
        assert!(e.contains(&format!("{path}: unknown field")), "{path}: {e}");
    }
}

#[test]
fn the_2014_restart_policy_object_is_not_a_v1_field() {
    let e = parse_manifest(
        b"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {restartPolicy: {always: {}}, containers: [{name: a, image: b}]}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("spec.restartPolicy: must be Always"), "{e}");
}

#[test]
fn the_2014_pull_policy_spellings_are_read_in_the_2014_form_only() {
    use hostlet_api::manifest::PullPolicy;
    for (old, new) in [
        ("PullAlways", PullPolicy::Always),
        ("PullIfNotPresent", PullPolicy::IfNotPresent),
        ("PullNever", PullPolicy::Never),
    ] {
        for version in ["v1beta1", "v1beta2"] {
            let text = format!(
                "version: {version}\nid: p\ncontainers: [{{name: a, image: busybox, imagePullPolicy: {old}}}]\n"
            );
            let m = parse_manifest(text.as_bytes()).unwrap_or_else(|e| panic!("{old}: {e}"));
            assert_eq!(m.containers[0].image_pull_policy, Some(new), "{old}");
            assert!(errors(&m).is_empty(), "{old}: {:?}", errors(&m));
        }
        let v1 = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec: {{containers: [{{name: a, image: b, imagePullPolicy: {old}}}]}}\n"
        );
        let e = parse_manifest(v1.as_bytes()).unwrap_err().to_string();
        assert!(
            e.contains("spec.containers[0].imagePullPolicy") && e.contains(old),
            "{e}"
        );
    }
}

/// A 2014 manifest with fields only that form has, shown as a v1 Pod, reads back as a v1 Pod that runs
/// the same probes.
#[test]
fn a_2014_manifest_shown_as_v1_drops_what_only_that_form_has() {
    let m = parse_manifest(
        b"version: v1beta2\nid: p\nvolumes: [{name: v, source: {emptyDir: {}}}]\ncontainers:\n- name: a\n  image: b\n  volumeMounts: [{name: v, path: /v, mountType: LOCAL}]\n  livenessProbe: {type: tcp, httpGet: {port: 80}, tcpSocket: {port: 81}}\n",
    )
    .unwrap();
    assert!(errors(&m).is_empty(), "{:?}", errors(&m));
    let shown = to_yaml_as(&m, Form::V1);
    assert!(
        !shown.contains("mountType") && !shown.contains("type:"),
        "{shown}"
    );
    let back = parse_manifest(shown.as_bytes()).unwrap_or_else(|e| panic!("{e}\n{shown}"));
    assert_eq!(back.form, Form::V1);
    assert!(errors(&back).is_empty(), "{:?}", errors(&back));
    assert_eq!(back.containers[0].volume_mounts[0].mount_path, "/v");
    assert_eq!(
        back.containers[0].liveness_probe.as_ref().unwrap().action(),
        m.containers[0].liveness_probe.as_ref().unwrap().action()
    );
}

#[test]
fn only_v1_pods_are_taken() {
    let e = parse_manifest(
        b"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: 2}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("apiVersion") && e.contains("apps/v1"), "{e}");
    let e = parse_manifest(b"apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("kind: \"Service\" is not supported"), "{e}");
    let e = parse_manifest(b"kind: Pod\nmetadata: {name: s}\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("apiVersion: required"), "{e}");
}

#[test]
fn validation_names_the_v1_paths() {
    let m = parse_manifest(
        b"apiVersion: v1
kind: Pod
metadata:
  name: Bad_Name
  labels: {'bad key!': x, ok: 'not ok!'}
spec:
  terminationGracePeriodSeconds: -1
  volumes:
  - name: h
    hostPath: {path: relative}
  - name: both
    emptyDir: {}
    hostPath: {path: /srv}
  initContainers:
  - name: web
    image: busybox
    readinessProbe: {exec: {command: [true]}}
    ports: [{containerPort: 80, hostPort: 8080}]
  containers:
  - name: web
    image: ''
    resources: {requests: {cpu: lots}}
",
    )
    .unwrap();
    let e = errors(&m);
    for want in [
        "metadata.name: ",
        "metadata.labels.bad key!: ",
        "metadata.labels.ok: ",
        "spec.terminationGracePeriodSeconds: must not be negative",
        "spec.volumes[0].hostPath.path: \"relative\" must be an absolute path",
        "spec.volumes[1]: give exactly one of emptyDir, hostPath, configMap and secret",
        "spec.initContainers[0].readinessProbe: not supported for init containers",
        "spec.initContainers[0].ports[0].hostPort: not supported for init containers",
        "spec.containers[0].name: duplicate container name \"web\"",
        "spec.containers[0].image: required",
        "spec.containers[0].resources.requests.cpu: ",
    ] {
        assert!(
            e.iter().any(|x| x.starts_with(want)),
            "{want} not in {e:#?}"
        );
    }
    let empty = parse_manifest(b"apiVersion: v1\nkind: Pod\nmetadata: {}\nspec: {}\n").unwrap();
    let e = errors(&empty);
    assert!(e.contains(&"metadata.name: required".to_string()), "{e:?}");
    assert!(
        e.contains(&"spec.containers: at least one container is required".to_string()),
        "{e:?}"
    );
}

#[test]
fn both_forms_are_written_back_and_read_the_same() {
    let m = parse_manifest(&read("k8s-init-containers.yaml")).unwrap();
    // As written: the v1 form.
    let yaml = to_yaml(&m);
    assert!(yaml.starts_with("apiVersion: v1\nkind: Pod\n"), "{yaml}");
    assert_eq!(parse_manifest(yaml.as_bytes()).unwrap(), m);
    assert_eq!(parse_manifest(to_json(&m).as_bytes()).unwrap(), m);
    // The 2014 form of the same pod, with today's extra fields, reads back as the same pod.
    let legacy = to_yaml_as(&m, Form::Legacy);
    assert!(
        legacy.contains("version: v1beta2") && legacy.contains("initContainers:"),
        "{legacy}"
    );
    let back = parse_manifest(legacy.as_bytes()).unwrap();
    assert_eq!(back.form, Form::Legacy);
    assert!(validate(&back).is_empty(), "{:?}", validate(&back));
    assert_eq!(
        (
            &back.id,
            &back.labels,
            &back.init_containers,
            &back.containers
        ),
        (&m.id, &m.labels, &m.init_containers, &m.containers)
    );
    // And a 2014 manifest shown as a v1 Pod.
    let old = parse_manifest(&read("kubelet-2014.yaml")).unwrap();
    let v1 = to_yaml_as(&old, Form::V1);
    let again = parse_manifest(v1.as_bytes()).unwrap();
    assert_eq!(again.form, Form::V1);
    // The same containers, less what only the 2014 form has (a probe's type, a mount's type).
    assert_eq!(
        (&again.id, &again.uuid, &again.containers),
        (&old.id, &old.uuid, &hostlet_api::v1::as_v1(&old).containers)
    );
    for (a, o) in again.containers.iter().zip(&old.containers) {
        let probe = |c: &hostlet_api::manifest::Container| {
            c.liveness_probe
                .as_ref()
                .and_then(|p| p.action())
                .map(|a| format!("{a:?}"))
        };
        assert_eq!(probe(a), probe(o));
    }
    assert!(validate(&again).is_empty(), "{:?}", validate(&again));
}

#[test]
fn streams_and_lists_mix_the_forms() {
    let text = format!(
        "{}\n---\nversion: v1beta1\nid: old\ncontainers: [{{name: a, image: busybox}}]\n",
        String::from_utf8(read("k8s-simple-pod.yaml")).unwrap()
    );
    let items = parse_manifest_list(text.as_bytes()).unwrap();
    let ids: Vec<String> = items
        .iter()
        .map(|i| i.as_ref().unwrap().id.clone())
        .collect();
    assert_eq!(ids, ["nginx", "old"]);
    let list = br#"[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"busybox"}]}},
                   {"apiVersion":"v1","kind":"Pod","metadata":{"name":"b"},"spec":{"containers":[{"name":"c","image":"busybox"}],"hostNetwork":true}}]"#;
    let items = parse_manifest_list(list).unwrap();
    assert_eq!(items[0].as_ref().unwrap().id, "a");
    let e = items[1].as_ref().unwrap_err().to_string();
    assert!(
        e.contains("[1]") && e.contains("spec.hostNetwork: unknown field"),
        "{e}"
    );
}

#[test]
fn parse_errors_of_the_v1_form_carry_line_and_column() {
    let e = parse_manifest(b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: a\n    image: b\n    ports: [{containerPort: abc}]\n")
        .unwrap_err();
    assert_eq!(e.line, Some(9), "{e}");
    assert!(e.column.is_some(), "{e}");
}

#[test]
fn config_and_secret_references_are_read_and_checked_with_their_paths() {
    let m = parse_manifest(&read("k8s-configmap-volume.yaml")).unwrap();
    let refs: Vec<String> = m
        .config_refs()
        .iter()
        .map(|(k, n)| format!("{}/{n}", k.noun()))
        .collect();
    assert_eq!(refs, ["configmap/special-config"]);
    let m = parse_manifest(&read("k8s-secret-env.yaml")).unwrap();
    let refs: Vec<String> = m
        .config_refs()
        .iter()
        .map(|(k, n)| format!("{}/{n}", k.noun()))
        .collect();
    assert_eq!(refs, ["secret/backend-user"]);
    // Written back in the form it came in, the references survive.
    assert_eq!(parse_manifest(to_yaml(&m).as_bytes()).unwrap(), m);

    let bad = parse_manifest(
        br#"apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  volumes:
  - {name: c, configMap: {name: "", items: [{key: "../k", path: "../x", mode: 4096}], defaultMode: -1}}
  - {name: s, secret: {secretName: s}, emptyDir: {}}
  containers:
  - name: a
    image: busybox
    env:
    - {name: X, value: "v", valueFrom: {configMapKeyRef: {name: m, key: k}}}
    - {name: Y, valueFrom: {}}
    - {name: Z, valueFrom: {secretKeyRef: {name: s, key: "a/b"}}}
    envFrom:
    - {configMapRef: {name: m}, secretRef: {name: s}}
"#,
    )
    .unwrap();
    let paths: Vec<String> = validate(&bad).into_iter().map(|e| e.path).collect();
    for want in [
        "spec.volumes[0].configMap.name",
        "spec.volumes[0].configMap.defaultMode",
        "spec.volumes[0].configMap.items[0].key",
        "spec.volumes[0].configMap.items[0].path",
        "spec.volumes[0].configMap.items[0].mode",
        "spec.volumes[1]",
        "spec.containers[0].env[0].value",
        "spec.containers[0].env[1].valueFrom",
        "spec.containers[0].env[2].valueFrom.secretKeyRef.key",
        "spec.containers[0].envFrom[0]",
    ] {
        assert!(paths.iter().any(|p| p == want), "{want} not in {paths:?}");
    }
}

#[test]
fn lifecycle_hooks_and_stop_signals_are_checked_with_their_paths() {
    let pod = |lifecycle: &str, init: &str| {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  initContainers: [{{name: i, image: busybox{init}}}]\n  containers:\n  - name: a\n    image: busybox\n    lifecycle: {lifecycle}\n"
        );
        errors(&parse_manifest(text.as_bytes()).unwrap())
    };
    assert!(pod(
        "{stopSignal: SIGRTMIN+3, postStart: {sleep: {seconds: 0}}, preStop: {httpGet: {port: 80, path: /quit}}}",
        ""
    )
    .is_empty());
    assert_eq!(
        pod(
            "{stopSignal: TERM, postStart: {sleep: {seconds: 1}, exec: {command: [true]}}, preStop: {sleep: {seconds: -1}}}",
            ", lifecycle: {preStop: {sleep: {seconds: 1}}}"
        ),
        vec![
            "spec.initContainers[0].lifecycle.preStop: init containers take no lifecycle hooks, sidecars apart (as in Kubernetes)",
            "spec.containers[0].lifecycle.postStart: give exactly one of exec, httpGet and sleep",
            "spec.containers[0].lifecycle.preStop.sleep.seconds: -1 is out of range 0-31536000",
            "spec.containers[0].lifecycle.stopSignal: \"TERM\" is not a signal name (e.g. SIGTERM, SIGQUIT, SIGUSR1, SIGRTMIN+3)",
        ]
    );
    assert_eq!(
        pod("{preStop: {httpGet: {port: web}, exec: {command: []}}}", ""),
        vec!["spec.containers[0].lifecycle.preStop: give exactly one of exec, httpGet and sleep"]
    );
    assert_eq!(
        pod("{preStop: {httpGet: {port: web}}, postStart: {exec: {command: []}}}", ""),
        vec![
            "spec.containers[0].lifecycle.postStart.exec.command: required",
            "spec.containers[0].lifecycle.preStop.httpGet.port: must be a port number 1-65535 or the name of one of the container's ports",
        ]
    );
}

#[test]
fn the_on_config_change_annotation_is_checked() {
    let pod = |value: &str| {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: {{hostlet.io/on-config-change: \"{value}\"}}\nspec:\n  containers: [{{name: a, image: busybox}}]\n"
        );
        errors(&parse_manifest(text.as_bytes()).unwrap())
    };
    assert!(pod("restart").is_empty());
    assert!(pod("signal:SIGHUP").is_empty());
    for bad in ["sometimes", "signal:HUP", "signal:"] {
        let errs = pod(bad);
        assert_eq!(errs.len(), 1, "{bad}: {errs:?}");
        assert!(
            errs[0].starts_with("metadata.annotations[hostlet.io/on-config-change]: "),
            "{errs:?}"
        );
    }
}

#[test]
fn a_host_path_type_is_a_directory_or_a_device() {
    let pod = |kind: &str| {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  volumes: [{{name: d, hostPath: {{path: /dev/ttyUSB0, type: {kind}}}}}]\n  containers: [{{name: a, image: busybox, volumeMounts: [{{name: d, mountPath: /dev/ttyUSB0}}]}}]\n"
        );
        let m = parse_manifest(text.as_bytes()).unwrap();
        (errors(&m), m)
    };
    for ok in ["CharDevice", "BlockDevice", "DirectoryOrCreate", "\"\""] {
        assert!(pod(ok).0.is_empty(), "{ok}: {:?}", pod(ok).0);
    }
    let (char_errs, m) = pod("CharDevice");
    assert!(char_errs.is_empty());
    let src = m.volumes[0].effective_source();
    assert_eq!(src.device_path(), Some("/dev/ttyUSB0"));
    assert_eq!(src.host_path(), None, "a device is no host dir");
    assert_eq!(
        pod("Socket").0,
        vec!["spec.volumes[0].hostPath.type: \"Socket\" is not supported: expected DirectoryOrCreate (or \"\"), CharDevice or BlockDevice"]
    );
}

#[test]
fn gpus_are_asked_in_whole_numbers_in_limits() {
    let pod = |resources: &str| {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers: [{{name: a, image: busybox, resources: {resources}}}]\n"
        );
        let m = parse_manifest(text.as_bytes()).unwrap();
        (errors(&m), m.containers[0].gpus())
    };
    assert_eq!(pod("{limits: {nvidia.com/gpu: 1}}"), (vec![], Some(1)));
    assert_eq!(
        pod("{limits: {nvidia.com/gpu: 2}, requests: {nvidia.com/gpu: 2}}"),
        (vec![], Some(2))
    );
    assert_eq!(
        pod("{limits: {nvidia.com/gpu: 500m}}").0,
        vec!["spec.containers[0].resources.limits.nvidia.com/gpu: \"500m\" is not a whole number of GPUs, 1 to 64"]
    );
    assert_eq!(
        pod("{requests: {nvidia.com/gpu: 1}}").0,
        vec!["spec.containers[0].resources.requests.nvidia.com/gpu: must equal resources.limits.nvidia.com/gpu (GPUs are not overcommitted)"]
    );
    assert_eq!(
        pod("{limits: {amd.com/gpu: 1}}").0,
        vec!["spec.containers[0].resources.limits.amd.com/gpu: unknown resource, expected cpu, memory or nvidia.com/gpu"]
    );
}

#[test]
fn a_sidecar_is_an_init_container_with_restart_policy_always_and_nothing_else_is() {
    let pod = |init: &str, app: &str| {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  initContainers: [{{name: i, image: busybox{init}}}]\n  containers: [{{name: a, image: busybox{app}}}]\n"
        );
        errors(&parse_manifest(text.as_bytes()).unwrap())
    };
    // A sidecar may be probed and hooked, as in Kubernetes.
    let sidecar = ", restartPolicy: Always, readinessProbe: {exec: {command: [true]}}, \
                   startupProbe: {tcpSocket: {port: 80}}, livenessProbe: {httpGet: {port: 80}}, \
                   lifecycle: {preStop: {sleep: {seconds: 1}}}";
    assert_eq!(pod(sidecar, ""), Vec::<String>::new());
    assert_eq!(
        pod(
            ", restartPolicy: OnFailure, readinessProbe: {exec: {command: [true]}}, ports: [{containerPort: 80, hostPort: 8080}]",
            ", restartPolicy: Always"
        ),
        vec![
            "spec.initContainers[0].restartPolicy: \"OnFailure\": an init container takes only Always (a sidecar)",
            "spec.initContainers[0].readinessProbe: not supported for init containers (they run to completion; a sidecar, restartPolicy: Always, may have one)",
            "spec.initContainers[0].ports[0].hostPort: not supported for init containers, sidecars included (give host ports to an app container)",
            "spec.containers[0].restartPolicy: only an init container takes one (Always, for a sidecar); the pod's spec.restartPolicy rules the app containers",
        ]
    );
    // The 2014 form has no sidecars.
    let legacy = "version: v1beta2\nid: p\ninitContainers: [{name: i, image: busybox, restartPolicy: Always}]\ncontainers: [{name: a, image: busybox}]\n";
    assert_eq!(
        errors(&parse_manifest(legacy.as_bytes()).unwrap()),
        vec![
            "initContainers[0].restartPolicy: not in the 2014 form (write a v1 Pod for a sidecar)"
        ]
    );
}
