//! Image garbage collection against a real Docker engine of the test's own: a second dockerd whose root is a
//! size-limited tmpfs the test mounts, in a network namespace the test makes, so that the filesystem holding
//! the images fills for real and no image of the host's engine (or of another test) is ever a candidate. Throwaway images, each with a random
//! 16 MiB layer of its own, are built in it from this machine's busybox.
//!
//! The agent removes unused images least recently used first (never used, then used earliest) only as far
//! as needed to get under the low threshold; never an image a running pod uses, never the pause image.

mod engine_support;
mod member_support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use engine_support::{TestEngine, MIB};
use member_support::*;

/// The tmpfs under the test engine's root.
const FS_MIB: u64 = 256;
const HIGH: u64 = 45;
const LOW: u64 = 40;
/// Each throwaway image's own layer.
const BLOB_MIB: u64 = 16;
const READY: Duration = Duration::from_secs(60);

fn running(n: &Node, name: &str) {
    eventually(&format!("pod {name} running"), READY, || {
        status(n, name)
            .filter(|s| s["phase"] == "Running")
            .map(|_| ())
    });
}

fn events_text(n: &Node) -> String {
    stdout(&cli(n, &["events", "--node", &n.name, "-o", "json"]))
}

#[test]
fn unused_images_go_least_recently_used_first_and_never_one_a_pod_uses() {
    let mut n = Node::new("image-gc");
    n.image_gc_high_threshold = HIGH as u8;
    let engine = TestEngine::start(&n.dir.join("engine"), FS_MIB);
    let pause = "gc-test/pause:1";
    engine.build(pause, 0);
    for tag in [
        "gc-test/never:1",
        "gc-test/first:1",
        "gc-test/second:1",
        "gc-test/kept:1",
    ] {
        engine.build(tag, BLOB_MIB);
    }
    n.start(&[
        format!("--docker-host=unix://{}", engine.socket().display()),
        format!("--pause-image={pause}"),
        format!("--image-gc-low-threshold={LOW}"),
        "--image-gc-minimum-age=0s".to_string(),
    ]);
    n.wait_ready(READY);

    // kept: runs throughout. first, then second: run and are deleted, in that order. never: never used.
    apply_sleeper(&n, "kept", "gc-test/kept:1", "Never");
    for name in ["first", "second"] {
        apply_sleeper(&n, name, &format!("gc-test/{name}:1"), "Never");
        running(&n, name);
        let o = cli(&n, &["pod", "delete", name]);
        assert!(o.status.success(), "{}", output_text(&o));
        eventually(&format!("pod {name}'s containers gone"), READY, || {
            let o = engine.docker(&[
                "ps",
                "-aq",
                "--filter",
                &format!("ancestor=gc-test/{name}:1"),
            ]);
            stdout(&o).trim().is_empty().then_some(())
        });
    }
    running(&n, "kept");
    assert_eq!(
        engine.images(),
        [
            "gc-test/first:1",
            "gc-test/kept:1",
            "gc-test/never:1",
            "gc-test/pause:1",
            "gc-test/second:1"
        ]
    );

    // Past the high threshold with about 1.5 images' worth to free: the never-used image and the one used
    // earliest go; the one used last stays.
    engine.fill_to(LOW, HIGH, BLOB_MIB * MIB * 3 / 2);
    eventually("the first collection", Duration::from_secs(60), || {
        (!engine.images().contains(&"gc-test/first:1".to_string())).then_some(())
    });
    assert_eq!(
        engine.images(),
        ["gc-test/kept:1", "gc-test/pause:1", "gc-test/second:1"],
        "never used and used earliest go first; {}",
        n.log_tail(40)
    );
    let ev = eventually("an ImagesRemoved event", Duration::from_secs(30), || {
        let ev = events_text(&n);
        ev.contains("ImagesRemoved").then_some(ev)
    });
    assert!(
        ev.contains("gc-test/never:1, gc-test/first:1"),
        "the event names them in order: {ev}"
    );
    assert!(
        !ev.contains("FreeDiskSpaceFailed"),
        "the first collection reached the low threshold: {ev}"
    );

    // Past it again with more to free than may go: the last unused image goes; the running pod's image and
    // the pause image stay, and the shortfall is reported.
    engine.fill_to(LOW, HIGH, BLOB_MIB * MIB * 3 / 2);
    let ev = eventually(
        "a FreeDiskSpaceFailed event",
        Duration::from_secs(60),
        || {
            let ev = events_text(&n);
            ev.contains("FreeDiskSpaceFailed").then_some(ev)
        },
    );
    assert_eq!(
        engine.images(),
        ["gc-test/kept:1", "gc-test/pause:1"],
        "{ev}"
    );
    running(&n, "kept");
    let (_, metrics) = n.get_metrics("/metrics").expect("metrics");
    assert_eq!(
        metric(&metrics, "hostlet_image_gc_removed_images_total"),
        Some(3.0),
        "{metrics}"
    );

    let o = cli(&n, &["pod", "delete", "kept"]);
    assert!(o.status.success(), "{}", output_text(&o));
    n.terminate(Duration::from_secs(30));
}

/// `docker save` of `tag` on the test engine, gzipped into `file`; the image is then removed from the
/// engine, as on a host that never had it.
fn save_and_forget(engine: &TestEngine, tag: &str, file: &Path) {
    let tar = file.with_extension("raw");
    let o = engine.docker(&["save", "-o", tar.to_str().unwrap(), tag]);
    assert!(o.status.success(), "docker save: {}", output_text(&o));
    let o = Command::new("gzip")
        .args(["-1", "-c"])
        .arg(&tar)
        .stdout(std::fs::File::create(file).unwrap())
        .output()
        .unwrap();
    assert!(o.status.success(), "gzip: {}", output_text(&o));
    std::fs::remove_file(&tar).unwrap();
    let o = engine.docker(&["rmi", tag]);
    assert!(o.status.success(), "docker rmi: {}", output_text(&o));
}

#[test]
fn a_tarball_in_the_images_dir_is_loaded_and_its_images_kept_from_collection_while_it_is_there() {
    let mut n = Node::new("image-dir");
    n.image_gc_high_threshold = HIGH as u8;
    let engine = TestEngine::start(&n.dir.join("engine"), FS_MIB);
    let pause = "dir-test/pause:1";
    engine.build(pause, 0);
    for tag in ["dir-test/shipped:1", "dir-test/other:1"] {
        engine.build(tag, BLOB_MIB);
    }
    let staging = n.dir.join("staging");
    std::fs::create_dir_all(&staging).unwrap();
    let shipped = staging.join("shipped.tar.gz");
    save_and_forget(&engine, "dir-test/shipped:1", &shipped);
    let extra = n.dir.join("more-images");
    std::fs::create_dir_all(&extra).unwrap();
    // Not an image archive: reported, and nothing else disturbed.
    std::fs::write(extra.join("notes.tar"), "not a tarball").unwrap();
    n.start(&[
        format!("--docker-host=unix://{}", engine.socket().display()),
        format!("--pause-image={pause}"),
        format!("--image-gc-low-threshold={LOW}"),
        "--image-gc-minimum-age=0s".to_string(),
        format!("--images-dir={}", extra.display()),
    ]);
    n.wait_ready(READY);
    let ev = eventually("an ImageFileFailed event", READY, || {
        let ev = events_text(&n);
        ev.contains("ImageFileFailed").then_some(ev)
    });
    assert!(ev.contains("notes.tar"), "the event names the file: {ev}");

    // A pod names the image before any host has it: it waits (ErrImageNeverPull) and starts once the
    // tarball is dropped in, renamed into place as the guide advises.
    apply_sleeper(&n, "app", "dir-test/shipped:1", "Never");
    eventually("the pod waiting for its image", READY, || {
        let s = status(&n, "app")?;
        s.to_string().contains("ErrImageNeverPull").then_some(())
    });
    let dropped = extra.join("shipped.tar.gz");
    std::fs::rename(&shipped, &dropped).unwrap();
    running(&n, "app");
    assert!(engine.images().contains(&"dir-test/shipped:1".to_string()));
    let ev = events_text(&n);
    assert!(
        ev.contains("ImageFileLoaded") && ev.contains("dir-test/shipped:1"),
        "{ev}"
    );
    let (_, metrics) = n.get_metrics("/metrics").expect("metrics");
    assert_eq!(
        metric(&metrics, "hostlet_images_dir_pinned_images"),
        Some(1.0),
        "{metrics}"
    );

    // Unused now, but its file is there: a collection takes the other unused image and leaves it.
    let o = cli(&n, &["pod", "delete", "app"]);
    assert!(o.status.success(), "{}", output_text(&o));
    eventually("the pod's containers gone", READY, || {
        let o = engine.docker(&["ps", "-aq", "--filter", "ancestor=dir-test/shipped:1"]);
        stdout(&o).trim().is_empty().then_some(())
    });
    engine.fill_to(LOW, HIGH, BLOB_MIB * MIB * 3 / 2);
    eventually(
        "a FreeDiskSpaceFailed event",
        Duration::from_secs(60),
        || {
            events_text(&n)
                .contains("FreeDiskSpaceFailed")
                .then_some(())
        },
    );
    assert_eq!(
        engine.images(),
        ["dir-test/pause:1", "dir-test/shipped:1"],
        "{}",
        n.log_tail(40)
    );

    // The file goes: the image is an ordinary unused image, and the next collection takes it.
    std::fs::remove_file(&dropped).unwrap();
    eventually("the image no longer pinned", READY, || {
        let (_, metrics) = n.get_metrics("/metrics")?;
        (metric(&metrics, "hostlet_images_dir_pinned_images") == Some(0.0)).then_some(())
    });
    engine.fill_to(LOW, HIGH, BLOB_MIB * MIB * 3 / 2);
    eventually(
        "the image collected once its file is gone",
        Duration::from_secs(90),
        || (engine.images() == ["dir-test/pause:1"]).then_some(()),
    );
    // The record no longer names it, and is the agent's alone.
    let record = n.data_dir.join("image-loads.json");
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(!text.contains("shipped.tar.gz"), "{text}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&record).unwrap().permissions().mode() & 0o777,
        0o600
    );
    n.terminate(Duration::from_secs(30));
}
