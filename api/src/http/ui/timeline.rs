//! The certificates page: every certificate of a cluster (the API's inventory) as a bar of its
//! life on a time axis, with today marked and its earlier lives (the renewals and rotations it
//! replaced, as the history keeps them) beside it — the CAs on one axis (years), the leaves and
//! client certificates on another (months), so each scale is readable; the CA rotation under
//! way with its phases, and the rotations before it with when each phase began. Bars are laid
//! out here, in thousandths of the axis, and drawn by the template as SVG (no inline style: the
//! console's Content-Security-Policy allows none).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use minijinja::context;
use serde::Serialize;

use super::render::{error_page, page};
use super::session::Console;
use crate::app::AppState;
use crate::db::{self, history::PastLife};
use crate::http::error::ApiError;
use crate::http::extract::ApiPath;
use exk8s_api_types::CertificateView;

/// One certificate's row and bar.
#[derive(Debug, Serialize, PartialEq)]
pub(super) struct Bar {
    pub name: String,
    pub vm_id: Option<i64>,
    pub kind: String,
    pub issuer: String,
    pub not_before: String,
    pub not_after: String,
    pub days_left: i64,
    /// Where the bar starts and how long it is, in thousandths of the axis.
    pub x: i64,
    pub width: i64,
    pub expired: bool,
    /// The lives this certificate replaced, oldest first.
    pub earlier: Vec<Earlier>,
}

/// An earlier life of a bar's certificate, on the same axis.
#[derive(Debug, Serialize, PartialEq)]
pub(super) struct Earlier {
    pub generation: i64,
    pub not_before: String,
    pub not_after: String,
    pub x: i64,
    pub width: i64,
}

/// Certificates on one axis.
#[derive(Debug, Serialize, PartialEq)]
pub(super) struct Axis {
    pub from: String,
    pub to: String,
    /// Today, in thousandths of the axis.
    pub now: i64,
    pub bars: Vec<Bar>,
}

/// An axis and what it holds.
#[derive(Debug, Serialize)]
pub(super) struct Group {
    pub caption: &'static str,
    pub axis: Axis,
}

/// `certificates` on one axis from the earliest start to the latest end (today and their
/// earlier lives in `past` included: a past life belongs to the certificate of its node and name).
pub(super) fn axis(certificates: &[&CertificateView], past: &[PastLife], now: i64) -> Option<Axis> {
    let earlier_of = |c: &CertificateView| -> Vec<&PastLife> {
        past.iter()
            .filter(|p| p.vm_id == c.vm_id && p.name == c.name)
            .collect()
    };
    let lives = certificates
        .iter()
        .flat_map(|c| {
            let earlier = earlier_of(c);
            std::iter::once((c.not_before, c.not_after))
                .chain(earlier.into_iter().map(|p| (p.not_before, p.not_after)))
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>();
    let start = lives.iter().map(|l| l.0).min()?.min(now);
    let end = lives.iter().map(|l| l.1).max()?.max(now);
    let span = (end - start).max(1);
    let at = |t: i64| ((t - start).saturating_mul(1000) / span).clamp(0, 1000);
    // At least a sliver: a certificate of hours still shows.
    let width = |from: i64, to: i64| (at(to) - at(from)).max(2);
    let bars = certificates
        .iter()
        .map(|c| Bar {
            name: c.name.clone(),
            vm_id: c.vm_id,
            kind: c.kind.clone(),
            issuer: c.issuer.clone(),
            not_before: day(c.not_before),
            not_after: day(c.not_after),
            days_left: c.days_left,
            x: at(c.not_before),
            width: width(c.not_before, c.not_after),
            expired: c.not_after <= now,
            earlier: earlier_of(c)
                .into_iter()
                .map(|p| Earlier {
                    generation: p.generation,
                    not_before: day(p.not_before),
                    not_after: day(p.not_after),
                    x: at(p.not_before),
                    width: width(p.not_before, p.not_after),
                })
                .collect(),
        })
        .collect();
    Some(Axis {
        from: day(start),
        to: day(end),
        now: at(now),
        bars,
    })
}

/// A CA rotation the history keeps, as the page lists it: when each phase began.
#[derive(Debug, Serialize, PartialEq)]
pub(super) struct PastRotation {
    pub ca: String,
    pub started: String,
    pub sign_new: Option<String>,
    pub drop_old: Option<String>,
    pub finished: Option<String>,
}

impl PastRotation {
    fn of(r: db::history::PastRotation) -> Self {
        let at = crate::http::conditions::rfc3339;
        Self {
            ca: r.ca,
            started: at(r.started_at),
            sign_new: r.sign_new_at.map(at),
            drop_old: r.drop_old_at.map(at),
            finished: r.finished_at.map(at),
        }
    }
}

/// The UTC day of unix time `t` (`2026-12-02`).
fn day(t: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(t) {
        Ok(at) => format!(
            "{:04}-{:02}-{:02}",
            at.year(),
            u8::from(at.month()),
            at.day()
        ),
        Err(_) => t.to_string(),
    }
}

/// The phases of a CA rotation, in order.
const PHASES: [&str; 3] = ["trust-both", "sign-new", "drop-old"];

/// A CA rotation under way, as the page shows it: its phases in order, the one it is in marked.
#[derive(Debug, Serialize, PartialEq)]
pub(super) struct Rotation {
    pub ca: String,
    pub started: String,
    pub since: String,
    pub waiting_for: Option<String>,
    /// Each phase and whether it is done, current or to come.
    pub phases: Vec<(&'static str, &'static str)>,
}

impl Rotation {
    fn of(r: exk8s_api_types::CaRotationView) -> Self {
        let current = PHASES.iter().position(|p| *p == r.phase);
        let phases = PHASES
            .iter()
            .enumerate()
            .map(|(i, phase)| {
                let step = match current {
                    Some(c) if i < c => "done",
                    Some(c) if i == c => "current",
                    _ => "next",
                };
                (*phase, step)
            })
            .collect();
        Self {
            ca: r.ca,
            started: crate::http::conditions::rfc3339(r.started_at),
            since: crate::http::conditions::rfc3339(r.updated_at),
            waiting_for: r.waiting_for,
            phases,
        }
    }
}

/// The cluster's certificates page; another org's cluster is not found.
pub(super) async fn certificates(
    State(state): State<AppState>,
    console: Console,
    ApiPath(id): ApiPath<i64>,
) -> Response {
    let principal = console.operator.principal.as_str();
    let shown = async {
        let row = console.cluster(&state, id).await?;
        let inventory =
            crate::http::certificates::inventory_of(&state, console.operator.org_id, id).await?;
        let name = row.name.clone();
        let rotation = crate::http::cluster_view::view(&state, row)
            .await?
            .ca_rotation
            .map(Rotation::of);
        let past = db::history::lives(&state.db.pool, id).await?;
        let rotations: Vec<PastRotation> = db::history::rotations(&state.db.pool, id)
            .await?
            .into_iter()
            // The rotation under way is shown with its phases above.
            .filter(|r| r.finished_at.is_some())
            .map(PastRotation::of)
            .collect();
        Ok::<_, ApiError>((name, inventory, rotation, past, rotations))
    };
    match shown.await {
        Ok((name, inventory, rotation, past, rotations)) => {
            let now = crate::db::now();
            let (cas, leaves): (Vec<_>, Vec<_>) =
                inventory.certificates.iter().partition(|c| c.kind == "ca");
            let groups: Vec<Group> = [
                ("Certificate authorities", axis(&cas, &past, now)),
                ("Serving and client certificates", axis(&leaves, &past, now)),
            ]
            .into_iter()
            .filter_map(|(caption, axis)| axis.map(|axis| Group { caption, axis }))
            .collect();
            page(
                StatusCode::OK,
                "certificates.html",
                context! {
                    principal,
                    id,
                    name,
                    sa_key_age_days => inventory.service_account_key_age_days,
                    groups,
                    no_leaves => leaves.is_empty(),
                    rotation,
                    rotations,
                },
            )
        }
        Err(e) => error_page(Some(principal), &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(name: &str, not_before: i64, not_after: i64) -> CertificateView {
        CertificateView {
            vm_id: Some(101),
            generation: 1,
            name: name.to_owned(),
            kind: "serving".to_owned(),
            subject: String::new(),
            issuer: "kubernetes".to_owned(),
            serial: "01".to_owned(),
            not_before,
            not_after,
            days_left: (not_after - 500) / 86_400,
        }
    }

    #[test]
    fn a_rotation_marks_the_phases_done_and_the_one_it_is_in() {
        let view = |phase: &str| exk8s_api_types::CaRotationView {
            ca: "cluster".to_owned(),
            phase: phase.to_owned(),
            started_at: 0,
            updated_at: 86_400,
            waiting_for: Some("cp-101".to_owned()),
        };
        let sign_new = Rotation::of(view("sign-new"));
        assert_eq!(
            sign_new.phases,
            [
                ("trust-both", "done"),
                ("sign-new", "current"),
                ("drop-old", "next")
            ]
        );
        assert_eq!(
            (sign_new.started.as_str(), sign_new.since.as_str()),
            ("1970-01-01T00:00:00Z", "1970-01-02T00:00:00Z")
        );
        assert_eq!(Rotation::of(view("trust-both")).phases[0].1, "current");
        assert!(
            Rotation::of(view("a-phase-from-a-newer-api"))
                .phases
                .iter()
                .all(|(_, step)| *step == "next")
        );
    }

    #[test]
    fn bars_sit_on_the_axis_in_proportion_with_today_marked() {
        let old = certificate("apiserver", 0, 1_000);
        let new = certificate("apiserver", 500, 2_000);
        let axis = axis(&[&old, &new], &[], 1_000).unwrap();
        assert_eq!((axis.bars[0].x, axis.bars[0].width), (0, 500));
        assert_eq!((axis.bars[1].x, axis.bars[1].width), (250, 750));
        assert_eq!(axis.now, 500);
        assert!(axis.bars[0].expired && !axis.bars[1].expired);
        assert_eq!(axis.from, "1970-01-01");
        // A certificate of a moment is still a sliver; none is nothing.
        let moment = certificate("x", 0, 0);
        assert_eq!(super::axis(&[&moment], &[], 0).unwrap().bars[0].width, 2);
        assert_eq!(super::axis(&[], &[], 0), None);
    }

    #[test]
    fn earlier_lives_sit_beside_their_certificate_and_widen_the_axis() {
        let now = certificate("apiserver", 1_000, 2_000);
        let other = certificate("kubelet", 1_000, 2_000);
        let life = |vm_id: Option<i64>, name: &str, generation: i64| PastLife {
            vm_id,
            generation,
            name: name.to_owned(),
            kind: "serving".to_owned(),
            issuer: "kubernetes".to_owned(),
            serial: "00".to_owned(),
            not_before: 0,
            not_after: 1_200,
            superseded_at: 1_000,
        };
        // Its own earlier life, another node's life of the same name, another name's.
        let past = [
            life(Some(101), "apiserver", 1),
            life(Some(102), "apiserver", 1),
        ];
        let axis = axis(&[&now, &other], &past, 1_500).unwrap();
        assert_eq!(axis.from, "1970-01-01");
        assert_eq!((axis.bars[0].x, axis.bars[0].width), (500, 500));
        assert_eq!(
            axis.bars[0].earlier,
            [Earlier {
                generation: 1,
                not_before: "1970-01-01".to_owned(),
                not_after: "1970-01-01".to_owned(),
                x: 0,
                width: 600,
            }]
        );
        assert!(axis.bars[1].earlier.is_empty());
        // Without a current certificate, a past life is not drawn (nor widens the axis).
        let alone = super::axis(&[&other], &past, 1_500).unwrap();
        assert_eq!(alone.bars[0].x, 0);
    }

    #[test]
    fn a_past_rotation_lists_when_each_phase_began() {
        let kept = PastRotation::of(db::history::PastRotation {
            ca: "etcd".to_owned(),
            started_at: 0,
            sign_new_at: Some(86_400),
            drop_old_at: None,
            finished_at: Some(172_800),
        });
        assert_eq!(kept.started, "1970-01-01T00:00:00Z");
        assert_eq!(kept.sign_new.as_deref(), Some("1970-01-02T00:00:00Z"));
        assert_eq!(kept.drop_old, None);
        assert_eq!(kept.finished.as_deref(), Some("1970-01-03T00:00:00Z"));
    }
}
