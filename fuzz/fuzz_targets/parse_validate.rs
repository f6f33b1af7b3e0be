#![no_main]
//! Any bytes through the manifest parser (either form: the 2014 manifest or a v1 Pod), then validation, naming and the merge of the pods found.

use hostlet_api::manifest::Form;
use hostlet_api::naming::{container_spec_hash, ContainerName};
use hostlet_api::validation::{resolve, validate, SourceKind, SourcedPod};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = hostlet_api::parse_manifest(data);
    let Ok(items) = hostlet_api::parse_manifest_list(data) else {
        return;
    };
    let mut pods = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let Ok(m) = item else { continue };
        let errors = validate(&m);
        for c in &m.containers {
            let _ = container_spec_hash(&m, c);
            let name = ContainerName { container: c.name.clone(), pod_id: m.id.clone(), suffix: "00000000".into() };
            if errors.is_empty() {
                assert_eq!(ContainerName::parse(&name.render()).as_ref(), Some(&name));
            }
        }
        // Serialising and reading back must give the same manifest.
        let again = hostlet_api::parse_manifest(hostlet_api::parse::to_json(&m).as_bytes());
        assert_eq!(again.as_ref().ok(), Some(&m));
        // Either form of the same pod (a 2014 manifest shown as a v1 Pod, or the reverse) reads back. A
        // valid pod stays valid in its own form and as a v1 Pod; shown in the 2014 form, a v1 Pod may use
        // what that form lacks (securityContext, lifecycle, a hostPath type), which its validation refuses.
        for form in [Form::Legacy, Form::V1] {
            let shown = hostlet_api::parse::to_yaml_as(&m, form);
            let back = hostlet_api::parse_manifest(shown.as_bytes());
            assert!(back.is_ok(), "{shown}");
            if let Ok(back) = back {
                assert_eq!(back.form, form);
                if form == Form::V1 || m.form == Form::Legacy {
                    assert!(!errors.is_empty() || validate(&back).is_empty(), "{shown}");
                }
            }
        }
        if errors.is_empty() {
            pods.push(SourcedPod { source: SourceKind::File, origin: "fuzz".into(), ordinal: i, manifest: m });
        }
    }
    let n = pods.len();
    let r = resolve(pods);
    assert_eq!(r.accepted.len() + r.rejected.len(), n);
});
