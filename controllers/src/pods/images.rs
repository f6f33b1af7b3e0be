//! The image garbage collector, as the kubelet's: when the filesystem holding Docker's images is used past
//! `--image-gc-high-threshold`, unused images are removed, the least recently used first, until it is
//! back under `--image-gc-low-threshold`. Never an image a container uses (any container on the engine,
//! hostlet's or not, running or not), never one a desired pod of this host names, never the pause image,
//! never one a file of the images directory holds, never one first seen less than `--image-gc-minimum-age`
//! ago. What it cannot judge (the desired pods not yet known, Docker not answering) it leaves alone.
//!
//! "Last used" is kept in memory, as the kubelet does: the time this agent last created a container from the
//! image, or last saw one using it. An image never seen in use goes first, then by that time, oldest first.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::runtime::RuntimeError;
use crate::events::{EventKind, EventRecorder};

/// `--image-gc-high-threshold`'s default (the kubelet's).
pub const DEFAULT_HIGH_PERCENT: u8 = 85;
/// `--image-gc-low-threshold`'s default (the kubelet's).
pub const DEFAULT_LOW_PERCENT: u8 = 80;
/// `--image-gc-minimum-age`'s default (the kubelet's `--minimum-image-ttl-duration`).
pub const DEFAULT_MINIMUM_AGE: Duration = Duration::from_secs(120);
/// How often the filesystem is looked at.
pub const CHECK_PERIOD: Duration = Duration::from_secs(10);
/// How often images and containers are listed to keep "first seen" and "last used" current.
pub const DETECT_PERIOD: Duration = Duration::from_secs(60);

/// When images are removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// Usage (percent of the filesystem) at which collection starts; 100 turns it off.
    pub high_percent: u8,
    /// Usage collection brings the filesystem down to.
    pub low_percent: u8,
    /// An image first seen less than this long ago is kept.
    pub minimum_age: Duration,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        ImageGcPolicy {
            high_percent: DEFAULT_HIGH_PERCENT,
            low_percent: DEFAULT_LOW_PERCENT,
            minimum_age: DEFAULT_MINIMUM_AGE,
        }
    }
}

impl ImageGcPolicy {
    /// Checks the thresholds as the flags give them; the error names the flag.
    pub fn new(high: u8, low: u8, minimum_age: Duration) -> Result<Self, String> {
        if high > 100 {
            return Err(format!(
                "--image-gc-high-threshold: {high} is not a percentage (0 to 100)"
            ));
        }
        if low >= high {
            return Err(format!(
                "--image-gc-low-threshold ({low}) must be below --image-gc-high-threshold ({high})"
            ));
        }
        Ok(ImageGcPolicy {
            high_percent: high,
            low_percent: low,
            minimum_age,
        })
    }

    /// Collection is on unless the high threshold is 100 %.
    pub fn enabled(&self) -> bool {
        self.high_percent < 100
    }
}

/// One image on the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    pub id: String,
    /// `repo:tag` names; empty for an untagged image.
    pub tags: Vec<String>,
    pub size: u64,
    /// Unix seconds.
    pub created: i64,
}

impl ImageInfo {
    /// The image as a person would name it.
    pub fn name(&self) -> String {
        match self.tags.first() {
            Some(t) => t.clone(),
            None => short_id(&self.id).to_string(),
        }
    }
}

fn short_id(id: &str) -> &str {
    let id = id.strip_prefix("sha256:").unwrap_or(id);
    &id[..id.len().min(12)]
}

/// The filesystem holding the engine's images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub capacity: u64,
    pub available: u64,
}

impl Usage {
    /// Percent used, rounded down.
    pub fn percent_used(&self) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        let used = self.capacity.saturating_sub(self.available);
        (u128::from(used) * 100 / u128::from(self.capacity)) as u64
    }

    /// Bytes to free to be at `low_percent` used.
    pub fn to_free(&self, low_percent: u8) -> u64 {
        let target_available =
            (u128::from(self.capacity) * u128::from(100 - low_percent.min(100)) / 100) as u64;
        target_available.saturating_sub(self.available)
    }
}

/// What the collector asks of the engine.
pub trait ImageEngine: Send + Sync + 'static {
    /// The filesystem holding the engine's images.
    fn usage(&self) -> impl Future<Output = Result<Usage, RuntimeError>> + Send;
    fn images(&self) -> impl Future<Output = Result<Vec<ImageInfo>, RuntimeError>> + Send;
    /// The ids of the images of every container on the engine, whoever made it, running or not.
    fn images_in_use(&self) -> impl Future<Output = Result<HashSet<String>, RuntimeError>> + Send;
    /// The id `reference` names, `None` when no such image is present.
    fn image_id(
        &self,
        reference: &str,
    ) -> impl Future<Output = Result<Option<String>, RuntimeError>> + Send;
    /// Removes the image without force: the engine refuses while a container uses it.
    fn remove_image(
        &self,
        image: &ImageInfo,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;
}

/// When this agent last created a container from each image reference; the pod controller touches it.
#[derive(Debug, Clone, Default)]
pub struct ImageUses(Arc<Mutex<HashMap<String, Instant>>>);

impl ImageUses {
    pub fn touch(&self, reference: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(reference.to_string(), Instant::now());
    }

    fn take(&self) -> HashMap<String, Instant> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// What the collector knows of one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub first_seen: Instant,
    pub last_used: Option<Instant>,
}

/// Which images to remove, least recently used first, to free `usage.to_free(low)` bytes; empty while the
/// filesystem is under the high threshold. `keep` holds the ids that must stay.
pub fn plan(
    images: &[ImageInfo],
    records: &HashMap<String, Record>,
    keep: &HashSet<String>,
    usage: Usage,
    policy: &ImageGcPolicy,
    now: Instant,
) -> Vec<ImageInfo> {
    if !policy.enabled() || usage.percent_used() < u64::from(policy.high_percent) {
        return Vec::new();
    }
    let needed = usage.to_free(policy.low_percent);
    let mut candidates: Vec<(&ImageInfo, Record)> = images
        .iter()
        .filter(|i| !keep.contains(&i.id))
        .filter_map(|i| records.get(&i.id).map(|r| (i, *r)))
        .filter(|(_, r)| now.saturating_duration_since(r.first_seen) >= policy.minimum_age)
        .collect();
    // Never used before used; then the least recently used; then the first seen; then the oldest built.
    candidates.sort_by(|(a, ra), (b, rb)| {
        (ra.last_used, ra.first_seen, a.created, &a.id).cmp(&(
            rb.last_used,
            rb.first_seen,
            b.created,
            &b.id,
        ))
    });
    let mut freed = 0u64;
    let mut out = Vec::new();
    for (i, _) in candidates {
        if freed >= needed {
            break;
        }
        freed = freed.saturating_add(i.size);
        out.push(i.clone());
    }
    out
}

/// The collector's metrics.
#[derive(Clone)]
pub struct ImageGcMetrics {
    runs: IntCounterVec,
    removed: IntCounter,
    freed: IntCounter,
}

impl ImageGcMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = ImageGcMetrics {
            runs: IntCounterVec::new(
                Opts::new(
                    "hostlet_image_gc_runs_total",
                    "Image collections by result: ok (under the low threshold after), short (not enough \
                     unused images to get there), error (the engine did not answer; nothing removed)",
                ),
                &["result"],
            )?,
            removed: IntCounter::new(
                "hostlet_image_gc_removed_images_total",
                "Unused images removed by the image collector",
            )?,
            freed: IntCounter::new(
                "hostlet_image_gc_freed_bytes_total",
                "Bytes of the images the image collector removed",
            )?,
        };
        // Every result exported from the start, so a rate over them works before the first collection.
        for r in ["ok", "short", "error"] {
            m.runs.with_label_values(&[r]);
        }
        registry.register(Box::new(m.runs.clone()))?;
        registry.register(Box::new(m.removed.clone()))?;
        registry.register(Box::new(m.freed.clone()))?;
        Ok(m)
    }
}

/// The image references a desired pod of this host names, `None` until every manifest source has answered
/// once (until then nothing is removed).
pub type DesiredImages = Arc<dyn Fn() -> Option<Vec<String>> + Send + Sync>;

/// The collector: one per agent.
pub struct ImageGc<E> {
    engine: Arc<E>,
    policy: ImageGcPolicy,
    uses: ImageUses,
    desired: DesiredImages,
    pause_image: String,
    /// The images the images directory's files hold.
    pinned: super::image_dir::PinnedImages,
    events: Option<EventRecorder>,
    metrics: ImageGcMetrics,
    records: HashMap<String, Record>,
    last_detect: Option<Instant>,
    /// Set while a collection fell short, so that it is reported once until the usage drops.
    short: bool,
    /// Set while looks fail, so that it is logged once.
    failing: bool,
}

/// How one collection went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Under the high threshold: nothing to do.
    Idle,
    /// Images removed (possibly none) and the filesystem now under the low threshold.
    Freed { removed: Vec<String>, bytes: u64 },
    /// Everything removable removed and still above the low threshold.
    Short {
        removed: Vec<String>,
        bytes: u64,
        usage: Usage,
    },
}

impl<E: ImageEngine> ImageGc<E> {
    pub fn new(
        engine: Arc<E>,
        policy: ImageGcPolicy,
        uses: ImageUses,
        desired: DesiredImages,
        pause_image: &str,
        events: Option<EventRecorder>,
        metrics: ImageGcMetrics,
    ) -> Self {
        ImageGc {
            engine,
            policy,
            uses,
            desired,
            pause_image: pause_image.to_string(),
            pinned: super::image_dir::PinnedImages::default(),
            events,
            metrics,
            records: HashMap::new(),
            last_detect: None,
            short: false,
            failing: false,
        }
    }

    /// Keeps the images the images directory's files hold.
    pub fn with_pinned(mut self, pinned: super::image_dir::PinnedImages) -> Self {
        self.pinned = pinned;
        self
    }

    /// The records, for tests.
    pub fn records(&self) -> &HashMap<String, Record> {
        &self.records
    }

    /// Lists the images and the containers: new images get their "first seen", images in use (and those
    /// containers were created from since the last look) their "last used". Returns the images and the ids
    /// in use.
    pub async fn detect(&mut self) -> Result<(Vec<ImageInfo>, HashSet<String>), RuntimeError> {
        let now = Instant::now();
        let touched = self.uses.take();
        let images = self.engine.images().await?;
        let in_use = self.engine.images_in_use().await?;
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| present.contains(id.as_str()));
        for i in &images {
            self.records.entry(i.id.clone()).or_insert(Record {
                first_seen: now,
                last_used: None,
            });
        }
        for id in &in_use {
            if let Some(r) = self.records.get_mut(id) {
                r.last_used = Some(now);
            }
        }
        for (reference, at) in touched {
            if let Ok(Some(id)) = self.engine.image_id(&reference).await {
                if let Some(r) = self.records.get_mut(&id) {
                    r.last_used = Some(r.last_used.map_or(at, |u| u.max(at)));
                }
            }
        }
        self.last_detect = Some(now);
        Ok((images, in_use))
    }

    /// The ids that must stay besides those in use: the desired pods' images, the pause image and those the
    /// images directory's files hold. `None` while the desired pods are not known.
    async fn kept(&self) -> Result<Option<HashSet<String>>, RuntimeError> {
        let Some(mut references) = (self.desired)() else {
            return Ok(None);
        };
        references.push(self.pause_image.clone());
        let mut ids = self.pinned.ids();
        for r in references {
            if let Some(id) = self.engine.image_id(&r).await? {
                ids.insert(id);
            }
        }
        Ok(Some(ids))
    }

    /// One look: keeps the records current and collects when the filesystem is past the high threshold.
    pub async fn check(&mut self) -> Result<Outcome, RuntimeError> {
        let usage = self.engine.usage().await?;
        let over = usage.percent_used() >= u64::from(self.policy.high_percent);
        let detect_due = self
            .last_detect
            .is_none_or(|t| t.elapsed() >= DETECT_PERIOD);
        if !over {
            self.short = false;
            if detect_due {
                self.detect().await?;
            }
            return Ok(Outcome::Idle);
        }
        let Some(mut keep) = self.kept().await? else {
            return Ok(Outcome::Idle);
        };
        let (images, in_use) = self.detect().await?;
        keep.extend(in_use);
        let chosen = plan(
            &images,
            &self.records,
            &keep,
            usage,
            &self.policy,
            Instant::now(),
        );
        let mut removed = Vec::new();
        let mut bytes = 0u64;
        for image in chosen {
            match self.engine.remove_image(&image).await {
                Ok(()) => {
                    tracing::info!(image = %image.name(), id = %image.id, size = image.size, "unused image removed");
                    self.records.remove(&image.id);
                    bytes = bytes.saturating_add(image.size);
                    removed.push(image.name());
                }
                // Used since the list (a container was just created from it), or gone already.
                Err(e) => tracing::info!(image = %image.name(), error = %e, "image not removed"),
            }
        }
        self.metrics.removed.inc_by(removed.len() as u64);
        self.metrics.freed.inc_by(bytes);
        let after = self.engine.usage().await.unwrap_or(usage);
        if after.percent_used() > u64::from(self.policy.low_percent) {
            Ok(Outcome::Short {
                removed,
                bytes,
                usage: after,
            })
        } else {
            Ok(Outcome::Freed { removed, bytes })
        }
    }

    fn report(&mut self, outcome: &Result<Outcome, RuntimeError>) {
        let (result, removed, bytes) = match outcome {
            Ok(Outcome::Idle) => {
                self.failing = false;
                return;
            }
            Ok(Outcome::Freed { removed, bytes }) => ("ok", removed, *bytes),
            Ok(Outcome::Short { removed, bytes, .. }) => ("short", removed, *bytes),
            Err(e) => {
                self.metrics.runs.with_label_values(&["error"]).inc();
                // Once per episode: a containerised agent that cannot see Docker's root fails every look.
                if !self.failing {
                    self.failing = true;
                    tracing::warn!(error = %e, "image collection cannot look; nothing is removed until it can");
                }
                return;
            }
        };
        self.failing = false;
        self.metrics.runs.with_label_values(&[result]).inc();
        let thresholds = format!(
            "--image-gc-high-threshold {} %, --image-gc-low-threshold {} %",
            self.policy.high_percent, self.policy.low_percent
        );
        if !removed.is_empty() {
            if let Some(ev) = &self.events {
                ev.record_now(
                    None,
                    None,
                    EventKind::Normal,
                    "ImagesRemoved",
                    format!(
                        "removed {} unused image(s), {} ({thresholds}): {}",
                        removed.len(),
                        bytesize::ByteSize(bytes).display().iec(),
                        removed.join(", ")
                    ),
                );
            }
        }
        if let Ok(Outcome::Short { usage, .. }) = outcome {
            if !self.short {
                self.short = true;
                tracing::warn!(
                    used_percent = usage.percent_used(),
                    "image collection fell short"
                );
                if let Some(ev) = &self.events {
                    ev.record_now(
                        None,
                        None,
                        EventKind::Warning,
                        "FreeDiskSpaceFailed",
                        format!(
                            "the filesystem holding Docker's images is {} % used after removing every unused \
                             image that may go ({thresholds})",
                            usage.percent_used()
                        ),
                    );
                }
            }
        }
    }

    /// Looks every [`CHECK_PERIOD`] until `cancel` fires.
    pub async fn run(mut self, cancel: CancellationToken) {
        if !self.policy.enabled() {
            return;
        }
        loop {
            let outcome = self.check().await;
            self.report(&outcome);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(CHECK_PERIOD) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, size: u64, created: i64) -> ImageInfo {
        ImageInfo {
            id: id.to_string(),
            tags: vec![format!("{id}:1")],
            size,
            created,
        }
    }

    const GIB: u64 = 1 << 30;

    fn usage(used_percent: u64) -> Usage {
        Usage {
            capacity: 100 * GIB,
            available: (100 - used_percent) * GIB,
        }
    }

    #[test]
    fn thresholds_are_checked_with_the_flag_named() {
        assert!(ImageGcPolicy::new(85, 80, DEFAULT_MINIMUM_AGE).is_ok());
        let e = ImageGcPolicy::new(80, 80, DEFAULT_MINIMUM_AGE).unwrap_err();
        assert!(e.contains("--image-gc-low-threshold (80)"), "{e}");
        let e = ImageGcPolicy::new(101, 80, DEFAULT_MINIMUM_AGE).unwrap_err();
        assert!(e.contains("--image-gc-high-threshold"), "{e}");
        assert!(!ImageGcPolicy::new(100, 0, DEFAULT_MINIMUM_AGE)
            .unwrap()
            .enabled());
    }

    #[test]
    fn usage_and_what_to_free() {
        let u = usage(90);
        assert_eq!(u.percent_used(), 90);
        assert_eq!(u.to_free(80), 10 * GIB);
        assert_eq!(usage(70).to_free(80), 0);
        let empty = Usage {
            capacity: 0,
            available: 0,
        };
        assert_eq!(empty.percent_used(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_plan_takes_never_used_then_least_recently_used_until_enough_is_freed() {
        let t0 = Instant::now();
        tokio::time::advance(Duration::from_secs(600)).await;
        let now = Instant::now();
        let policy = ImageGcPolicy::new(85, 80, Duration::from_secs(120)).unwrap();
        let images = vec![
            image("used-late", 4 * GIB, 1),
            image("used-early", 4 * GIB, 2),
            image("never", 4 * GIB, 3),
            image("in-use", 4 * GIB, 0),
            image("too-new", 4 * GIB, 0),
        ];
        let rec = |first: Instant, last: Option<Instant>| Record {
            first_seen: first,
            last_used: last,
        };
        let records = HashMap::from([
            (
                "used-late".to_string(),
                rec(t0, Some(t0 + Duration::from_secs(300))),
            ),
            (
                "used-early".to_string(),
                rec(t0, Some(t0 + Duration::from_secs(100))),
            ),
            ("never".to_string(), rec(t0, None)),
            ("in-use".to_string(), rec(t0, None)),
            ("too-new".to_string(), rec(now, None)),
        ]);
        let keep = HashSet::from(["in-use".to_string()]);
        let ids = |v: Vec<ImageInfo>| v.into_iter().map(|i| i.id).collect::<Vec<_>>();

        // 84 %: under the high threshold, nothing.
        assert!(plan(&images, &records, &keep, usage(84), &policy, now).is_empty());
        // 86 % → 80 %: 6 GiB, so two images of 4 GiB: never used first, then the earliest used.
        assert_eq!(
            ids(plan(&images, &records, &keep, usage(86), &policy, now)),
            ["never", "used-early"]
        );
        // 99 %: everything that may go, and never what is kept or too new.
        assert_eq!(
            ids(plan(&images, &records, &keep, usage(99), &policy, now)),
            ["never", "used-early", "used-late"]
        );
        // Unknown images (no record yet) are not candidates.
        assert!(plan(&images, &HashMap::new(), &keep, usage(99), &policy, now).is_empty());
        // Off at 100 %.
        let off = ImageGcPolicy::new(100, 80, Duration::ZERO).unwrap();
        assert!(plan(&images, &records, &keep, usage(100), &off, now).is_empty());
    }

    /// An engine in memory: removing an image frees its size.
    #[derive(Default)]
    struct FakeEngine {
        st: Mutex<FakeState>,
    }

    #[derive(Default)]
    struct FakeState {
        capacity: u64,
        used_by_others: u64,
        images: Vec<ImageInfo>,
        in_use: HashSet<String>,
        removed: Vec<String>,
        refuse: HashSet<String>,
        down: bool,
    }

    impl FakeEngine {
        fn st(&self) -> std::sync::MutexGuard<'_, FakeState> {
            self.st.lock().unwrap()
        }
        fn check_up(&self) -> Result<(), RuntimeError> {
            if self.st().down {
                Err(RuntimeError::Unreachable("down".into()))
            } else {
                Ok(())
            }
        }
    }

    impl ImageEngine for FakeEngine {
        async fn usage(&self) -> Result<Usage, RuntimeError> {
            self.check_up()?;
            let st = self.st();
            let used = st.used_by_others + st.images.iter().map(|i| i.size).sum::<u64>();
            Ok(Usage {
                capacity: st.capacity,
                available: st.capacity.saturating_sub(used),
            })
        }
        async fn images(&self) -> Result<Vec<ImageInfo>, RuntimeError> {
            self.check_up()?;
            Ok(self.st().images.clone())
        }
        async fn images_in_use(&self) -> Result<HashSet<String>, RuntimeError> {
            self.check_up()?;
            Ok(self.st().in_use.clone())
        }
        async fn image_id(&self, reference: &str) -> Result<Option<String>, RuntimeError> {
            self.check_up()?;
            Ok(self
                .st()
                .images
                .iter()
                .find(|i| i.tags.iter().any(|t| t == reference))
                .map(|i| i.id.clone()))
        }
        async fn remove_image(&self, image: &ImageInfo) -> Result<(), RuntimeError> {
            self.check_up()?;
            let mut st = self.st();
            if st.refuse.contains(&image.id) || st.in_use.contains(&image.id) {
                return Err(RuntimeError::Conflict("in use".into()));
            }
            st.images.retain(|i| i.id != image.id);
            st.removed.push(image.id.clone());
            Ok(())
        }
    }

    fn gc(
        engine: &Arc<FakeEngine>,
        uses: &ImageUses,
        desired: Option<Vec<String>>,
        policy: ImageGcPolicy,
    ) -> ImageGc<FakeEngine> {
        let desired = Arc::new(Mutex::new(desired));
        ImageGc::new(
            engine.clone(),
            policy,
            uses.clone(),
            Arc::new(move || desired.lock().unwrap().clone()),
            "pause:1",
            None,
            ImageGcMetrics::register(&Registry::new()).unwrap(),
        )
    }

    /// 100 GiB; others use 70; images of 4 GiB each (a..e, the pause image) → 94 %.
    fn engine() -> Arc<FakeEngine> {
        let e = Arc::new(FakeEngine::default());
        {
            let mut st = e.st();
            st.capacity = 100 * GIB;
            st.used_by_others = 70 * GIB;
            for (n, id) in ["a", "b", "c", "d", "e", "pause"].iter().enumerate() {
                st.images.push(image(id, 4 * GIB, n as i64));
            }
        }
        e
    }

    #[tokio::test(start_paused = true)]
    async fn a_collection_removes_in_order_of_use_and_keeps_what_pods_and_containers_use() {
        let e = engine();
        let uses = ImageUses::default();
        let mut g = gc(
            &e,
            &uses,
            Some(vec!["e:1".into()]),
            ImageGcPolicy::new(85, 80, Duration::ZERO).unwrap(),
        );
        // First look: every image seen now.
        g.detect().await.unwrap();
        assert_eq!(g.records().len(), 6);
        // c used, then b (containers created from them); d in use by some container now.
        tokio::time::advance(Duration::from_secs(5)).await;
        uses.touch("c:1");
        tokio::time::advance(Duration::from_secs(5)).await;
        uses.touch("b:1");
        e.st().in_use.insert("d".into());
        // 94 % → 80 %: 14 GiB, four images: a (never used), c, b, and nothing more may go (d in use,
        // e desired, the pause image kept).
        let out = g.check().await.unwrap();
        assert_eq!(e.st().removed, ["a", "c", "b"]);
        assert!(
            matches!(&out, Outcome::Short { removed, .. } if removed == &["a:1", "c:1", "b:1"]),
            "{out:?}"
        );
        // Reported once per episode.
        g.report(&Ok(out.clone()));
        assert!(g.short);
        // Under the high threshold again: idle, and the episode is over.
        e.st().used_by_others = 50 * GIB;
        assert_eq!(g.check().await.unwrap(), Outcome::Idle);
        assert!(!g.short);
    }

    #[tokio::test(start_paused = true)]
    async fn an_image_a_file_of_the_images_directory_holds_stays_until_the_file_goes() {
        let e = engine();
        let pinned = crate::pods::image_dir::PinnedImages::default();
        let file = std::path::Path::new("/images/a.tar");
        pinned.set(file, vec!["a".into(), "b".into()]);
        let mut g = gc(
            &e,
            &ImageUses::default(),
            Some(Vec::new()),
            ImageGcPolicy::new(85, 80, Duration::ZERO).unwrap(),
        )
        .with_pinned(pinned.clone());
        g.detect().await.unwrap();
        // 94 % → 80 %: a and b would go first (never used, oldest); they are pinned, so c, d and e go.
        g.check().await.unwrap();
        assert_eq!(e.st().removed, ["c", "d", "e"]);
        // The file is gone: its images are ordinary unused images again.
        pinned.remove(file);
        e.st().used_by_others = 80 * GIB;
        g.check().await.unwrap();
        assert_eq!(e.st().removed, ["c", "d", "e", "a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_removed_before_the_desired_pods_are_known_or_while_the_engine_is_away() {
        let e = engine();
        let uses = ImageUses::default();
        let mut g = gc(
            &e,
            &uses,
            None,
            ImageGcPolicy::new(85, 80, Duration::ZERO).unwrap(),
        );
        g.detect().await.unwrap();
        assert_eq!(g.check().await.unwrap(), Outcome::Idle);
        assert!(e.st().removed.is_empty());

        let mut g = gc(
            &e,
            &uses,
            Some(vec![]),
            ImageGcPolicy::new(85, 80, Duration::ZERO).unwrap(),
        );
        e.st().down = true;
        assert!(g.check().await.is_err());
        assert!(e.st().removed.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn images_first_seen_lately_wait_for_the_minimum_age_and_a_refused_removal_is_skipped() {
        let e = engine();
        let uses = ImageUses::default();
        let mut g = gc(
            &e,
            &uses,
            Some(vec![]),
            ImageGcPolicy::new(85, 80, Duration::from_secs(120)).unwrap(),
        );
        // Seen just now: too new.
        let out = g.check().await.unwrap();
        assert!(
            matches!(out, Outcome::Short { ref removed, .. } if removed.is_empty()),
            "{out:?}"
        );
        assert!(e.st().removed.is_empty());
        tokio::time::advance(Duration::from_secs(121)).await;
        // `a` is refused by the engine (a container created from it since the list): the next goes.
        e.st().refuse.insert("a".into());
        g.check().await.unwrap();
        let removed = e.st().removed.clone();
        assert!(!removed.contains(&"a".to_string()), "{removed:?}");
        assert!(!removed.contains(&"pause".to_string()), "{removed:?}");
        assert_eq!(removed.first().map(String::as_str), Some("b"));
    }
}
