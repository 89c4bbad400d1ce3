//! What an agent says of itself on its bundle fetches: the bundle formats it reads (`Accept`)
//! and its release (`User-Agent: exk8s-agent/<version>`). A bundle is handed only to an agent
//! that reads this API's format; one that reads none of what this API renders is refused (406)
//! with a reason its node reports, before any serial is spent. Agents from before the
//! announcement send no `Accept`: they read the v2 format, the only one rendered so far
//! (docs/upgrading-exk8s.md, "The agents").

use axum::http::{HeaderMap, header};
use exk8s_common::envelope::BUNDLE_PAYLOAD_TYPE;

use super::error::ApiError;

/// The `User-Agent` product name of exk8s's agent.
const AGENT_PRODUCT: &str = "exk8s-agent/";
/// The longest version recorded (a semver with a pre-release and build is far shorter).
const MAX_VERSION: usize = 64;

/// Refuses a fetch whose agent reads none of the formats this API renders; otherwise the
/// agent's release, when it said it.
pub(super) fn check(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    if let Some(accept) = headers.get(header::ACCEPT) {
        let accept = accept
            .to_str()
            .map_err(|_| ApiError::invalid("Accept", "the Accept header is not ASCII"))?;
        if !reads_ours(accept) {
            return Err(ApiError::NotAcceptable(format!(
                "this agent reads {accept:?}; this API renders {BUNDLE_PAYLOAD_TYPE} (read by \
                 exk8s-agent 0.1 and later): put an agent that reads it on the node \
                 (docs/upgrading-exk8s.md, \"The agents\")"
            )));
        }
    }
    Ok(agent_version(headers))
}

/// Whether an `Accept` value admits this API's bundle format: named, or `*/*`,
/// `application/*` or `application/json` (the DSSE envelope is JSON: a client that asks for any
/// JSON is not an agent that reads another format), with a weight above zero (RFC 9110,
/// section 12.5.1). A member that is not a media type is ignored, as servers ignore what they
/// cannot parse there.
fn reads_ours(accept: &str) -> bool {
    let ours: mime::Mime = BUNDLE_PAYLOAD_TYPE
        .parse()
        .unwrap_or(mime::APPLICATION_JSON);
    accept
        .split(',')
        .filter_map(|member| member.trim().parse::<mime::Mime>().ok())
        .filter(|m| m.get_param("q").is_none_or(|q| !is_zero(q.as_str())))
        .any(|m| {
            (m.type_() == mime::STAR && m.subtype() == mime::STAR)
                || (m.type_() == ours.type_()
                    && (m.subtype() == mime::STAR
                        || m.essence_str() == ours.essence_str()
                        || m.essence_str() == mime::APPLICATION_JSON.essence_str()))
        })
}

/// A weight of zero (`qvalue` of RFC 9110: "0" with up to three decimals, all zero).
fn is_zero(q: &str) -> bool {
    match q.strip_prefix('0') {
        Some("") => true,
        Some(rest) => rest
            .strip_prefix('.')
            .is_some_and(|d| d.len() <= 3 && d.chars().all(|c| c == '0')),
        None => false,
    }
}

/// The release named by `User-Agent: exk8s-agent/<version> ...`, when it is one.
fn agent_version(headers: &HeaderMap) -> Option<String> {
    let agent = headers.get(header::USER_AGENT)?.to_str().ok()?;
    let version = agent
        .strip_prefix(AGENT_PRODUCT)?
        .split_whitespace()
        .next()?;
    let printable = version
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'));
    (printable && !version.is_empty() && version.len() <= MAX_VERSION).then(|| version.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(name.clone(), value.parse().unwrap());
        }
        map
    }

    #[test]
    fn agents_that_read_the_format_or_do_not_say_are_served() {
        for accept in [
            BUNDLE_PAYLOAD_TYPE,
            "application/vnd.exk8s.bundle.v3+json, application/vnd.exk8s.bundle.v2+json;q=0.5",
            "*/*",
            "application/*;q=0.1",
            "application/json",
            "text/plain, not a media type, application/vnd.exk8s.bundle.v2+json",
        ] {
            assert!(reads_ours(accept), "{accept}");
            assert!(check(&headers(&[(header::ACCEPT, accept)])).is_ok());
        }
        assert_eq!(check(&HeaderMap::new()).unwrap(), None, "no Accept: v2");
    }

    #[test]
    fn agents_that_read_other_formats_only_are_refused_with_the_reason() {
        for accept in [
            "application/vnd.exk8s.bundle.v3+json",
            "application/vnd.exk8s.bundle.v2+json;q=0",
            "application/vnd.exk8s.bundle.v2+json; q=0.000, text/*",
            "text/*",
            "",
        ] {
            assert!(!reads_ours(accept), "{accept}");
            let refused = check(&headers(&[(header::ACCEPT, accept)])).unwrap_err();
            assert_eq!(
                refused.status_code(),
                axum::http::StatusCode::NOT_ACCEPTABLE
            );
            let said = refused.to_string();
            assert!(
                said.contains(BUNDLE_PAYLOAD_TYPE) && said.contains("put an agent"),
                "{said}"
            );
        }
    }

    #[test]
    fn weights_of_zero_are_told_apart() {
        for zero in ["0", "0.", "0.0", "0.000"] {
            assert!(is_zero(zero), "{zero}");
        }
        for not in ["0.001", "1", "0.5", "00", ".0", "0.0.0x"] {
            assert!(!is_zero(not), "{not}");
        }
    }

    #[test]
    fn the_agents_release_is_read_from_its_user_agent() {
        let version = |ua: &str| agent_version(&headers(&[(header::USER_AGENT, ua)]));
        assert_eq!(version("exk8s-agent/0.1.0").as_deref(), Some("0.1.0"));
        assert_eq!(
            version("exk8s-agent/1.2.3-rc.1+abc ureq/2").as_deref(),
            Some("1.2.3-rc.1+abc")
        );
        assert_eq!(version("curl/8.0"), None);
        assert_eq!(version("exk8s-agent/"), None);
        assert_eq!(version("exk8s-agent/1.0;rm"), None);
        assert_eq!(version(&format!("exk8s-agent/{}", "9".repeat(65))), None);
    }
}
