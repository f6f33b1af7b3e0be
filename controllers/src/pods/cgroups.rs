//! The cgroup every pod container is made under, and the share of the host it may use: what
//! `--pods-reserved-cpu` and `--pods-reserved-memory` keep back for the etcd member and the agent (the
//! kubelet's node allocatable, with hostlet's own processes as the system reserve).
//!
//! Docker's cgroupfs driver takes a path (`/hostlet-pods`) and makes the container's cgroup below it in
//! every hierarchy; its systemd driver takes a slice (`hostlet-pods.slice`). The agent writes the limits
//! of that parent: cgroup files under cgroupfs (v1 or v2), `systemctl set-property --runtime` under
//! systemd.

use std::path::{Path, PathBuf};

/// The parent the agent picks when `--pods-cgroup-parent` is not given, by Docker's cgroup driver.
pub fn default_parent(driver: &str) -> &'static str {
    if driver == "systemd" {
        "hostlet-pods.slice"
    } else {
        "/hostlet-pods"
    }
}

/// What the pods' parent cgroup may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodsAllocatable {
    /// Thousandths of a core; `None`: no limit.
    pub cpu_millis: Option<i64>,
    /// Bytes; `None`: no limit.
    pub memory_bytes: Option<i64>,
}

/// The host's capacity minus the reserves; an error when a reserve leaves the pods nothing.
pub fn allocatable(
    host_cpu_millis: i64,
    host_memory_bytes: i64,
    reserved_cpu_millis: Option<i64>,
    reserved_memory_bytes: Option<i64>,
) -> Result<PodsAllocatable, String> {
    let cpu = match reserved_cpu_millis {
        None => None,
        Some(r) if r >= host_cpu_millis => {
            return Err(format!(
                "--pods-reserved-cpu {r}m leaves the pods nothing: the host has {host_cpu_millis}m"
            ))
        }
        Some(r) => Some(host_cpu_millis - r),
    };
    let memory = match reserved_memory_bytes {
        None => None,
        Some(r) if r >= host_memory_bytes => {
            return Err(format!(
                "--pods-reserved-memory {r} bytes leaves the pods nothing: the host has {host_memory_bytes} bytes"
            ))
        }
        Some(r) => Some(host_memory_bytes - r),
    };
    Ok(PodsAllocatable {
        cpu_millis: cpu,
        memory_bytes: memory,
    })
}

/// The host's memory in bytes, from `/proc/meminfo`.
pub fn host_memory_bytes() -> Result<i64, String> {
    let text =
        std::fs::read_to_string("/proc/meminfo").map_err(|e| format!("/proc/meminfo: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<i64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| "/proc/meminfo: no MemTotal".to_string())
}

/// The host's CPUs in thousandths of a core.
pub fn host_cpu_millis() -> i64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as i64) * 1000
}

/// CFS period of the parent's CPU quota (100 ms, as for containers).
const CPU_PERIOD_MICROS: i64 = 100_000;

/// Writes the limits of `parent` under the cgroupfs hierarchy at `root` (`/sys/fs/cgroup`), creating
/// the parent where missing; `version` is Docker's `CgroupVersion` (`1` or `2`). A limit that is `None`
/// is lifted, so that dropping a flag takes effect at the next start.
pub fn apply_cgroupfs(
    root: &Path,
    version: &str,
    parent: &str,
    limits: PodsAllocatable,
) -> Result<(), String> {
    let rel = parent.trim_start_matches('/');
    if rel.is_empty() || rel.split('/').any(|p| p == ".." || p.is_empty()) {
        return Err(format!(
            "--pods-cgroup-parent {parent:?}: a cgroup path such as /hostlet-pods"
        ));
    }
    let quota = limits
        .cpu_millis
        .map(|m| (m * CPU_PERIOD_MICROS / 1000).max(1000));
    let writes: Vec<(PathBuf, String)> = if version == "2" {
        let dir = root.join(rel);
        vec![
            (
                dir.join("memory.max"),
                limits
                    .memory_bytes
                    .map_or("max".to_string(), |b| b.to_string()),
            ),
            (
                dir.join("cpu.max"),
                match quota {
                    Some(q) => format!("{q} {CPU_PERIOD_MICROS}"),
                    None => format!("max {CPU_PERIOD_MICROS}"),
                },
            ),
        ]
    } else {
        vec![
            (
                root.join("memory").join(rel).join("memory.limit_in_bytes"),
                limits
                    .memory_bytes
                    .map_or("-1".to_string(), |b| b.to_string()),
            ),
            (
                root.join("cpu").join(rel).join("cpu.cfs_period_us"),
                CPU_PERIOD_MICROS.to_string(),
            ),
            (
                root.join("cpu").join(rel).join("cpu.cfs_quota_us"),
                quota.map_or("-1".to_string(), |q| q.to_string()),
            ),
        ]
    };
    for (file, value) in writes {
        let Some(dir) = file.parent() else { continue };
        if version == "2" {
            // Controllers must be enabled on every level above for the parent's files to exist.
            let mut up = root.to_path_buf();
            for part in rel.split('/') {
                let _ = std::fs::write(up.join("cgroup.subtree_control"), "+cpu +memory +pids");
                up.push(part);
            }
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        std::fs::write(&file, &value)
            .map_err(|e| format!("writing {value} to {}: {e}", file.display()))?;
    }
    Ok(())
}

/// Sets the limits of a systemd slice for this boot (Docker's systemd driver makes the slice).
pub fn apply_systemd(parent: &str, limits: PodsAllocatable) -> Result<(), String> {
    if !parent.ends_with(".slice") {
        return Err(format!(
            "--pods-cgroup-parent {parent:?}: Docker's systemd cgroup driver needs a slice such as hostlet-pods.slice"
        ));
    }
    let memory = limits
        .memory_bytes
        .map_or("MemoryMax=infinity".to_string(), |b| {
            format!("MemoryMax={b}")
        });
    let cpu = limits
        .cpu_millis
        .map_or("CPUQuota=".to_string(), |m| format!("CPUQuota={}%", m / 10));
    let out = std::process::Command::new("systemctl")
        .args(["set-property", "--runtime", parent, &memory, &cpu])
        .output()
        .map_err(|e| format!("running systemctl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "systemctl set-property {parent}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_come_off_the_host_and_may_not_take_it_all() {
        assert_eq!(
            allocatable(2000, 8 << 30, Some(500), Some(1 << 30)),
            Ok(PodsAllocatable {
                cpu_millis: Some(1500),
                memory_bytes: Some(7 << 30)
            })
        );
        assert_eq!(
            allocatable(2000, 8 << 30, None, None),
            Ok(PodsAllocatable::default())
        );
        assert!(allocatable(2000, 8 << 30, Some(2000), None).is_err());
        assert!(allocatable(2000, 8 << 30, None, Some(8 << 30)).is_err());
    }

    #[test]
    fn the_driver_picks_the_parent() {
        assert_eq!(default_parent("cgroupfs"), "/hostlet-pods");
        assert_eq!(default_parent("systemd"), "hostlet-pods.slice");
    }

    #[test]
    fn cgroupfs_v1_files_are_written_and_lifted() {
        let root = tempfile::tempdir().unwrap();
        let limits = PodsAllocatable {
            cpu_millis: Some(1500),
            memory_bytes: Some(1 << 30),
        };
        apply_cgroupfs(root.path(), "1", "/hostlet-pods", limits).unwrap();
        let read = |p: &str| std::fs::read_to_string(root.path().join(p)).unwrap();
        assert_eq!(
            read("memory/hostlet-pods/memory.limit_in_bytes"),
            "1073741824"
        );
        assert_eq!(read("cpu/hostlet-pods/cpu.cfs_quota_us"), "150000");
        apply_cgroupfs(
            root.path(),
            "1",
            "/hostlet-pods",
            PodsAllocatable::default(),
        )
        .unwrap();
        assert_eq!(read("memory/hostlet-pods/memory.limit_in_bytes"), "-1");
        assert!(apply_cgroupfs(root.path(), "1", "/../etc", limits).is_err());
    }
}
