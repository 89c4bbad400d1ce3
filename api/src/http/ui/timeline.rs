//! The certificates page: every certificate of a cluster (the API's inventory) as a bar of its
//! life on a time axis, with today marked — the CAs on one axis (years), the leaves and
//! client certificates on another (months), so each scale is readable. Bars are laid out here,
//! in thousandths of the axis, and drawn by the template as SVG (no inline style: the console's
//! Content-Security-Policy allows none).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use minijinja::context;
use serde::Serialize;

use super::render::{error_page, page};
use super::session::Console;
use crate::app::AppState;
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

/// `certificates` on one axis from the earliest start to the latest end (today included).
pub(super) fn axis(certificates: &[&CertificateView], now: i64) -> Option<Axis> {
    let start = certificates.iter().map(|c| c.not_before).min()?.min(now);
    let end = certificates.iter().map(|c| c.not_after).max()?.max(now);
    let span = (end - start).max(1);
    let at = |t: i64| ((t - start).saturating_mul(1000) / span).clamp(0, 1000);
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
            // At least a sliver: a certificate of hours still shows.
            width: (at(c.not_after) - at(c.not_before)).max(2),
            expired: c.not_after <= now,
        })
        .collect();
    Some(Axis {
        from: day(start),
        to: day(end),
        now: at(now),
        bars,
    })
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
        Ok::<_, ApiError>((name, inventory, rotation))
    };
    match shown.await {
        Ok((name, inventory, rotation)) => {
            let now = crate::db::now();
            let (cas, leaves): (Vec<_>, Vec<_>) =
                inventory.certificates.iter().partition(|c| c.kind == "ca");
            let groups: Vec<Group> = [
                ("Certificate authorities", axis(&cas, now)),
                ("Serving and client certificates", axis(&leaves, now)),
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
        let axis = axis(&[&old, &new], 1_000).unwrap();
        assert_eq!((axis.bars[0].x, axis.bars[0].width), (0, 500));
        assert_eq!((axis.bars[1].x, axis.bars[1].width), (250, 750));
        assert_eq!(axis.now, 500);
        assert!(axis.bars[0].expired && !axis.bars[1].expired);
        assert_eq!(axis.from, "1970-01-01");
        // A certificate of a moment is still a sliver; none is nothing.
        let moment = certificate("x", 0, 0);
        assert_eq!(super::axis(&[&moment], 0).unwrap().bars[0].width, 2);
        assert_eq!(super::axis(&[], 0), None);
    }
}
