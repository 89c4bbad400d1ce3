//! `Prefer: wait=N` (RFC 7240): how many seconds a client will wait for work that otherwise
//! answers `202 Accepted` at once. Other preferences (`respond-async`, `return=…`) are
//! understood as the default and ignored; a `wait` that is not a whole number of seconds is a
//! 400 naming the header.

use std::time::Duration;

use axum::http::HeaderMap;

use super::error::ApiError;

/// The longest wait honoured; a longer one is cut to it (RFC 7240 lets the server choose).
pub(super) const MAX_WAIT: Duration = Duration::from_secs(3600);

/// The wait the request prefers: zero when it names none.
pub(super) fn wait(headers: &HeaderMap) -> Result<Duration, ApiError> {
    let mut wait = Duration::ZERO;
    for value in headers.get_all("prefer") {
        let text = value
            .to_str()
            .map_err(|_| ApiError::invalid("Prefer", "Prefer must be visible ASCII"))?;
        for preference in text.split(',') {
            let mut parts = preference.split(';').next().unwrap_or("").splitn(2, '=');
            let token = parts.next().unwrap_or("").trim();
            if !token.eq_ignore_ascii_case("wait") {
                continue;
            }
            let seconds = parts
                .next()
                .map(|v| v.trim().trim_matches('"'))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "Prefer",
                        "Prefer: wait= takes a whole number of seconds (RFC 7240)",
                    )
                })?;
            wait = Duration::from_secs(seconds).min(MAX_WAIT);
        }
    }
    Ok(wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefer(values: &[&str]) -> Result<Duration, ApiError> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append("prefer", v.parse().unwrap());
        }
        wait(&headers)
    }

    #[test]
    fn wait_is_read_from_any_prefer_header_and_capped() {
        assert_eq!(prefer(&[]).unwrap(), Duration::ZERO);
        assert_eq!(prefer(&["respond-async"]).unwrap(), Duration::ZERO);
        assert_eq!(prefer(&["wait=30"]).unwrap(), Duration::from_secs(30));
        assert_eq!(
            prefer(&["respond-async, WAIT = 5"]).unwrap(),
            Duration::from_secs(5)
        );
        assert_eq!(
            prefer(&["return=minimal", "wait=\"7\""]).unwrap(),
            Duration::from_secs(7)
        );
        assert_eq!(prefer(&["wait=999999"]).unwrap(), MAX_WAIT);
    }

    #[test]
    fn a_wait_that_is_not_seconds_is_refused_naming_the_header() {
        for bad in ["wait", "wait=", "wait=-1", "wait=1.5", "wait=soon"] {
            let e = prefer(&[bad]).unwrap_err();
            assert!(
                matches!(&e, ApiError::Invalid { field: Some(f), .. } if f == "Prefer"),
                "{bad}: {e:?}"
            );
        }
    }
}
