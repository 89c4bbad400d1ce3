//! Kubernetes' version skew policy (kubernetes.io, "Version Skew Policy"), as exk8s enforces it
//! before an upgrade starts. A refusal names the rule, the versions, and what to do first.
//!
//! - The control plane moves one minor at a time, never down a minor, and to the newest patch
//!   of its own minor before the next minor (as kubeadm advises).
//! - A kubelet is never newer than the oldest kube-apiserver, and at most three minors older:
//!   so workers follow the control plane, and the control plane may not leave a pool more than
//!   three minors behind.
//! - kube-controller-manager and kube-scheduler run beside each apiserver at its version: they
//!   are never newer than the apiservers they talk to.
//! - etcd (each release runs the etcd `render::etcd_for` names) moves one minor at a time and
//!   never down a minor, as etcd's upgrade guides require: a member that ran a newer minor
//!   cannot go back to the one before (etcd's downgrade is a procedure of its own). Before a
//!   new minor, every member runs at least the patch that minor's upgrade guide names
//!   ([`ETCD_MINOR_FLOORS`]).

use std::fmt;
use std::str::FromStr;

/// A Kubernetes release, `v1.MINOR.PATCH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Release {
    pub minor: u32,
    pub patch: u32,
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v1.{}.{}", self.minor, self.patch)
    }
}

/// A version that is not a Kubernetes release exk8s installs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a Kubernetes release of the form v1.MINOR.PATCH")]
pub struct NotARelease(String);

impl FromStr for Release {
    type Err = NotARelease;

    fn from_str(s: &str) -> Result<Self, NotARelease> {
        let (minor, patch) =
            minor_and_patch(s, "v1.").ok_or_else(|| NotARelease(s.chars().take(40).collect()))?;
        Ok(Self { minor, patch })
    }
}

/// How many minors a kubelet may lag the oldest apiserver.
pub const KUBELET_MINORS_BEHIND: u32 = 3;

/// Why a version change breaks the skew policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkewError {
    #[error("{to} is not offered by this API (offered: {offered})")]
    NotOffered { to: Release, offered: String },
    #[error("the control plane runs {from}; going down a minor to {to} is not supported")]
    MinorDowngrade { from: Release, to: Release },
    #[error(
        "the control plane runs {from}; {to} skips a minor: upgrade to v1.{next}.x first, one minor at a time"
    )]
    SkipsMinor {
        from: Release,
        to: Release,
        next: u32,
    },
    #[error(
        "the control plane runs {from}; upgrade to {latest}, the newest patch of its minor, before {to}"
    )]
    PatchFirst {
        from: Release,
        to: Release,
        latest: Release,
    },
    #[error(
        "pool `{pool}` runs kubelet {kubelet}; with the control plane at {to} it would be more than \
         {KUBELET_MINORS_BEHIND} minors behind: upgrade the pool to at least v1.{needed}.x first"
    )]
    PoolTooFarBehind {
        pool: String,
        kubelet: Release,
        to: Release,
        needed: u32,
    },
    #[error(
        "a kubelet may not be newer than the control plane: the oldest kube-apiserver runs \
         {apiserver}, so pool `{pool}` may not go to {to}; upgrade the control plane first"
    )]
    KubeletAhead {
        pool: String,
        to: Release,
        apiserver: Release,
    },
    #[error(
        "pool `{pool}` may run a kubelet at most {KUBELET_MINORS_BEHIND} minors older than the \
         control plane ({apiserver}); {to} is too old"
    )]
    KubeletTooOld {
        pool: String,
        to: Release,
        apiserver: Release,
    },
    #[error(
        "{to} runs etcd {to_etcd}, {from} runs etcd {from_etcd}: etcd moves one minor at a \
         time; upgrade to a release that runs etcd 3.{next}.x first"
    )]
    EtcdSkipsMinor {
        from: Release,
        to: Release,
        from_etcd: String,
        to_etcd: String,
        next: u32,
    },
    #[error(
        "{to} runs etcd {to_etcd}; etcd's upgrade guide asks every member to run {required} or \
         later before that minor, and {from} runs etcd {from_etcd}: upgrade to a release that \
         runs etcd {required} or later first"
    )]
    EtcdPatchFirst {
        from: Release,
        to: Release,
        from_etcd: String,
        to_etcd: String,
        required: &'static str,
    },
    #[error("`{etcd}`, the etcd {release} runs, is not an etcd release of the form v3.MINOR.PATCH")]
    NotAnEtcdRelease { release: Release, etcd: String },
    #[error(
        "{to} runs etcd {to_etcd}, a minor below the etcd {from_etcd} that {from} runs: etcd \
         members cannot go down a minor"
    )]
    EtcdMinorDowngrade {
        from: Release,
        to: Release,
        from_etcd: String,
        to_etcd: String,
    },
}

/// Releases as an operator reads them: `v1.34.6, v1.35.3`.
pub fn listed(releases: &[Release]) -> String {
    releases
        .iter()
        .map(Release::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The minor and patch of an etcd release `v3.MINOR.PATCH`; anything else is refused, naming
/// the Kubernetes `release` it was given for (never read as 0: a malformed version would pass
/// every minor rule).
fn etcd_release(release: Release, etcd: &str) -> Result<(u32, u32), SkewError> {
    minor_and_patch(etcd, "v3.").ok_or_else(|| SkewError::NotAnEtcdRelease {
        release,
        etcd: etcd.chars().take(40).collect(),
    })
}

/// The minor and patch of `version`, `{major}MINOR.PATCH` (`major` is `v1.` or `v3.`), each
/// one to four digits; None for anything else.
fn minor_and_patch(version: &str, major: &str) -> Option<(u32, u32)> {
    let (minor, patch) = version.strip_prefix(major)?.split_once('.')?;
    let number = |t: &str| {
        (!t.is_empty() && t.len() <= 4 && t.bytes().all(|b| b.is_ascii_digit()))
            .then(|| t.parse::<u32>().ok())
            .flatten()
    };
    Some((number(minor)?, number(patch)?))
}

/// For an etcd minor, the oldest release of the minor before it that may upgrade to it, from
/// etcd's upgrade guides ("Upgrade etcd from v3.5 to v3.6": every member at 3.5.26 or later;
/// "from v3.6 to v3.7": 3.6.11 or later).
pub const ETCD_MINOR_FLOORS: [(u32, &str); 2] = [(6, "v3.5.26"), (7, "v3.6.11")];

/// May etcd go from `from_etcd` (what Kubernetes `from` runs) to `to_etcd` (what `to` runs)?
pub fn etcd(from: Release, to: Release, from_etcd: &str, to_etcd: &str) -> Result<(), SkewError> {
    let running = etcd_release(from, from_etcd)?;
    let ((a, _), (b, _)) = (running, etcd_release(to, to_etcd)?);
    let floor = match ETCD_MINOR_FLOORS
        .iter()
        .find(|(minor, _)| b == a + 1 && *minor == b)
    {
        Some((_, floor)) if running < etcd_release(to, floor)? => Some(*floor),
        _ => None,
    };
    let (from_etcd, to_etcd) = (from_etcd.to_owned(), to_etcd.to_owned());
    if let Some(required) = floor {
        return Err(SkewError::EtcdPatchFirst {
            from,
            to,
            from_etcd,
            to_etcd,
            required,
        });
    }
    if b < a {
        return Err(SkewError::EtcdMinorDowngrade {
            from,
            to,
            from_etcd,
            to_etcd,
        });
    }
    if b > a + 1 {
        return Err(SkewError::EtcdSkipsMinor {
            from,
            to,
            from_etcd,
            to_etcd,
            next: a + 1,
        });
    }
    Ok(())
}

/// May a control plane whose oldest apiserver runs `from` go to `to`, with its pools' kubelets
/// at `pools` (name, oldest kubelet), and `offered` the releases this API installs?
pub fn control_plane(
    from: Release,
    to: Release,
    offered: &[Release],
    pools: &[(&str, Release)],
) -> Result<(), SkewError> {
    if !offered.contains(&to) {
        return Err(SkewError::NotOffered {
            to,
            offered: listed(offered),
        });
    }
    if to.minor < from.minor {
        return Err(SkewError::MinorDowngrade { from, to });
    }
    if to.minor > from.minor + 1 {
        return Err(SkewError::SkipsMinor {
            from,
            to,
            next: from.minor + 1,
        });
    }
    if to.minor == from.minor + 1 {
        let latest = offered
            .iter()
            .filter(|r| r.minor == from.minor)
            .max()
            .copied()
            .unwrap_or(from);
        if latest > from {
            return Err(SkewError::PatchFirst { from, to, latest });
        }
    }
    let needed = to.minor.saturating_sub(KUBELET_MINORS_BEHIND);
    if let Some((pool, kubelet)) = pools.iter().find(|(_, kubelet)| kubelet.minor < needed) {
        return Err(SkewError::PoolTooFarBehind {
            pool: (*pool).to_owned(),
            kubelet: *kubelet,
            to,
            needed,
        });
    }
    Ok(())
}

/// May pool `pool` run kubelet `to`, beside a control plane whose oldest apiserver runs
/// `apiserver`?
pub fn pool(pool: &str, to: Release, apiserver: Release) -> Result<(), SkewError> {
    if to > apiserver {
        return Err(SkewError::KubeletAhead {
            pool: pool.to_owned(),
            to,
            apiserver,
        });
    }
    if to.minor + KUBELET_MINORS_BEHIND < apiserver.minor {
        return Err(SkewError::KubeletTooOld {
            pool: pool.to_owned(),
            to,
            apiserver,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> Release {
        text.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    const OFFERED: [&str; 5] = ["v1.35.3", "v1.35.4", "v1.36.1", "v1.36.3", "v1.37.2"];

    fn offered() -> Vec<Release> {
        OFFERED.map(r).to_vec()
    }

    #[test]
    fn releases_parse_and_order_by_minor_then_patch() {
        assert_eq!(
            r("v1.35.4"),
            Release {
                minor: 35,
                patch: 4
            }
        );
        assert_eq!(r("v1.36.1").to_string(), "v1.36.1");
        assert!(r("v1.35.10") > r("v1.35.9") && r("v1.36.0") > r("v1.35.10"));
        for bad in [
            "1.35.3",
            "v2.1.0",
            "v1.35",
            "v1.35.3-rc.1",
            "v1..3",
            "v1.35.x",
            "",
        ] {
            assert!(bad.parse::<Release>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_control_plane_moves_one_minor_at_a_time_from_its_newest_patch() {
        let (all, none) = (offered(), []);
        assert_eq!(
            control_plane(r("v1.35.3"), r("v1.35.4"), &all, &none),
            Ok(())
        );
        assert_eq!(
            control_plane(r("v1.35.4"), r("v1.36.3"), &all, &none),
            Ok(())
        );
        assert!(matches!(
            control_plane(r("v1.35.3"), r("v1.36.1"), &all, &none),
            Err(SkewError::PatchFirst { latest, .. }) if latest == r("v1.35.4")
        ));
        assert!(matches!(
            control_plane(r("v1.35.4"), r("v1.37.2"), &all, &none),
            Err(SkewError::SkipsMinor { next: 36, .. })
        ));
        assert!(matches!(
            control_plane(r("v1.36.1"), r("v1.35.4"), &all, &none),
            Err(SkewError::MinorDowngrade { .. })
        ));
        // A patch down within a minor is not a minor downgrade (a rollback of a bad patch).
        assert_eq!(
            control_plane(r("v1.36.3"), r("v1.36.1"), &all, &none),
            Ok(())
        );
        let refused = control_plane(r("v1.35.4"), r("v1.36.2"), &all, &none).unwrap_err();
        assert!(matches!(refused, SkewError::NotOffered { .. }));
        assert!(refused.to_string().contains("v1.36.3"), "{refused}");
    }

    #[test]
    fn the_control_plane_leaves_no_pool_more_than_three_minors_behind() {
        let all = [r("v1.35.4"), r("v1.36.1")];
        let old = [("batch", r("v1.32.9"))];
        let refused = control_plane(r("v1.35.4"), r("v1.36.1"), &all, &old).unwrap_err();
        assert!(matches!(
            refused,
            SkewError::PoolTooFarBehind { needed: 33, .. }
        ));
        assert!(refused.to_string().contains("pool `batch`"), "{refused}");
        let fine = [("batch", r("v1.33.0"))];
        assert_eq!(
            control_plane(r("v1.35.4"), r("v1.36.1"), &all, &fine),
            Ok(())
        );
    }

    #[test]
    fn workers_follow_the_control_plane_within_three_minors() {
        let apiserver = r("v1.36.1");
        assert_eq!(pool("blue", r("v1.36.1"), apiserver), Ok(()));
        assert_eq!(pool("blue", r("v1.33.0"), apiserver), Ok(()));
        assert!(matches!(
            pool("blue", r("v1.36.3"), apiserver),
            Err(SkewError::KubeletAhead { .. })
        ));
        assert!(matches!(
            pool("blue", r("v1.32.9"), apiserver),
            Err(SkewError::KubeletTooOld { .. })
        ));
    }

    #[test]
    fn etcd_moves_one_minor_at_a_time_and_never_back() {
        let (from, to) = (r("v1.36.3"), r("v1.37.2"));
        assert_eq!(etcd(from, to, "v3.6.10", "v3.6.14"), Ok(()));
        assert_eq!(etcd(from, to, "v3.6.14", "v3.7.3"), Ok(()));
        assert_eq!(etcd(from, to, "v3.6.11", "v3.7.0"), Ok(()));
        assert_eq!(etcd(from, to, "v3.5.26", "v3.6.10"), Ok(()));
        // Before a new minor, the patch its upgrade guide names.
        let early = etcd(from, to, "v3.6.10", "v3.7.3").unwrap_err();
        assert!(
            matches!(
                early,
                SkewError::EtcdPatchFirst {
                    required: "v3.6.11",
                    ..
                }
            ),
            "{early:?}"
        );
        assert!(
            early
                .to_string()
                .contains("runs etcd v3.6.11 or later first"),
            "{early}"
        );
        let early = etcd(from, to, "v3.5.24", "v3.6.14").unwrap_err();
        assert!(matches!(
            early,
            SkewError::EtcdPatchFirst {
                required: "v3.5.26",
                ..
            }
        ));
        let skipped = etcd(from, to, "v3.5.24", "v3.7.3").unwrap_err();
        assert!(matches!(skipped, SkewError::EtcdSkipsMinor { next: 6, .. }));
        assert!(
            skipped.to_string().contains("etcd 3.6.x first"),
            "{skipped}"
        );
        let back = etcd(to, from, "v3.7.3", "v3.6.14").unwrap_err();
        assert!(matches!(back, SkewError::EtcdMinorDowngrade { .. }));
        assert!(
            back.to_string().contains("cannot go down a minor"),
            "{back}"
        );
        // The etcd each release runs never makes the next minor's upgrade impossible.
        for minor in 30..40 {
            let etcd_of = |m: u32| {
                let release = exk8s_common::names::Version::new(format!("v1.{m}.0")).unwrap();
                crate::render::etcd_for(&release).as_str().to_owned()
            };
            let (a, b) = (
                r(&format!("v1.{minor}.0")),
                r(&format!("v1.{}.0", minor + 1)),
            );
            assert_eq!(etcd(a, b, &etcd_of(minor), &etcd_of(minor + 1)), Ok(()));
        }
        // A patch of etcd may go either way (a rollback within a minor).
        assert_eq!(etcd(to, from, "v3.6.14", "v3.6.10"), Ok(()));
    }

    #[test]
    fn a_malformed_etcd_version_is_refused_naming_it() {
        let (from, to) = (r("v1.36.3"), r("v1.37.2"));
        for bad in [
            "3.7.0",
            "v3.x.1",
            "v3.7",
            "v3.7.",
            "v4.0.0",
            "v3.7.0-rc.1",
            "",
        ] {
            let refused = etcd(from, to, "v3.6.14", bad).unwrap_err();
            assert_eq!(
                refused,
                SkewError::NotAnEtcdRelease {
                    release: to,
                    etcd: bad.into()
                },
                "{bad}"
            );
            assert!(
                refused
                    .to_string()
                    .contains(&format!("`{bad}`, the etcd v1.37.2 runs"))
            );
            let refused = etcd(from, to, bad, "v3.6.14").unwrap_err();
            assert!(
                matches!(&refused, SkewError::NotAnEtcdRelease { release, .. } if *release == from),
                "{refused:?}"
            );
        }
    }
}
