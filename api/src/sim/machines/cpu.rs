//! A machine's CPU time capped as a VM's vCPUs cap it (`exk8s-api dev --machine-cpus`):
//! without it every machine shares every core of the host, so machines booting side by side
//! slow each other down as separate VMs would not, and one machine alone gets the whole host.
//! The cap is the CFS quota of the machine's own cgroup (cgroup v1's `cpu` controller, or the
//! unified hierarchy's `cpu.max`), which holds everything the machine runs.

use std::path::Path;

/// The most CPU time a machine gets, in cores (`exk8s-api dev --machine-cpus`): what a VM's
/// vCPUs give it, where machines would otherwise share every core of the host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuShare(f64);

impl CpuShare {
    /// The CFS period the quota is a part of (the kernel's default).
    const PERIOD_US: u64 = 100_000;

    /// A share of `cores` (a hundredth of a core at least, 256 at most).
    pub fn new(cores: f64) -> Result<Self, String> {
        if cores.is_finite() && (0.01..=256.0).contains(&cores) {
            Ok(Self(cores))
        } else {
            Err(format!(
                "--machine-cpus {cores}: a machine's cores are between 0.01 and 256"
            ))
        }
    }

    fn quota_us(self) -> u64 {
        // In range by construction: at most 256 × the period.
        (self.0 * Self::PERIOD_US as f64).round() as u64
    }

    /// Caps the cgroup `dir` of the hierarchy holding `controllers` (cgroup v1's `cpu`
    /// controller, or the unified hierarchy's `cpu.max`); other hierarchies are left alone.
    pub(super) fn limit(self, dir: &Path, controllers: &str) -> std::io::Result<()> {
        let (quota, period) = (self.quota_us(), Self::PERIOD_US);
        if controllers.split(',').any(|c| c == "cpu") {
            std::fs::write(dir.join("cpu.cfs_period_us"), period.to_string())?;
            std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())
        } else if controllers.is_empty() && dir.join("cpu.max").exists() {
            std::fs::write(dir.join("cpu.max"), format!("{quota} {period}"))
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::CpuShare;

    #[test]
    fn a_share_is_a_positive_number_of_cores() {
        for cores in [0.0, -1.0, 0.001, 257.0, f64::NAN, f64::INFINITY] {
            let refused = CpuShare::new(cores).unwrap_err();
            assert!(refused.starts_with("--machine-cpus"), "{refused}");
        }
        assert_eq!(CpuShare::new(0.4).unwrap().quota_us(), 40_000);
        assert_eq!(CpuShare::new(2.0).unwrap().quota_us(), 200_000);
    }

    #[test]
    fn the_quota_is_written_where_the_hierarchy_takes_it() {
        let share = CpuShare::new(0.5).unwrap();
        let v1 = tempfile::tempdir().unwrap();
        share.limit(v1.path(), "cpu,cpuacct").unwrap();
        let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
        assert_eq!(read(v1.path(), "cpu.cfs_quota_us"), "50000");
        assert_eq!(read(v1.path(), "cpu.cfs_period_us"), "100000");
        let unified = tempfile::tempdir().unwrap();
        std::fs::write(unified.path().join("cpu.max"), "max 100000").unwrap();
        share.limit(unified.path(), "").unwrap();
        assert_eq!(read(unified.path(), "cpu.max"), "50000 100000");
        // Another controller's hierarchy, and a unified one without the cpu controller.
        let other = tempfile::tempdir().unwrap();
        share.limit(other.path(), "memory").unwrap();
        share.limit(other.path(), "").unwrap();
        assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0);
    }
}
