//! Waiting out a busy API. An answer of 503 (Service Unavailable), 429 (Too Many Requests) or
//! 409 `wait` (the first request under the same `Idempotency-Key` still in progress) that says
//! when to come back (`Retry-After`, in seconds) is sent again after that long, a few times —
//! but only when sending it again cannot do its work twice: a GET, HEAD, PUT or DELETE, or a
//! request carrying an `Idempotency-Key`. Every wait is told on stderr.

#![allow(
    clippy::result_large_err,
    reason = "ureq::Error as ureq returns it: boxing it per request gains nothing"
)]

use std::time::Duration;

use crate::error::CliError;

/// At most this many waits for one request.
pub(crate) const MAX_WAITS: u32 = 5;

/// A wait longer than this is not waited out: the refusal is shown instead.
pub(crate) const LONGEST_WAIT: Duration = Duration::from_secs(60);

/// Whether sending a `method` request again cannot do its work twice (`keyed`: it carries an
/// `Idempotency-Key`).
pub(crate) fn resendable(method: &str, keyed: bool) -> bool {
    keyed || matches!(method, "GET" | "HEAD" | "PUT" | "DELETE")
}

/// How long to wait before sending again an answer of `status` with the `Retry-After` value
/// `retry_after`, after `waited` waits already; `None` when the answer stands. A 409 is waited
/// only when it says how long (the API's `wait`; a conflict of another kind says nothing).
pub(crate) fn wait_for(status: u16, retry_after: Option<&str>, waited: u32) -> Option<Duration> {
    if !matches!(status, 409 | 429 | 503) || waited >= MAX_WAITS {
        return None;
    }
    // Delta-seconds, as the exk8s API sends it (RFC 9110 §10.2.3); an HTTP-date is not waited.
    let seconds: u64 = retry_after?.trim().parse().ok()?;
    let wait = Duration::from_secs(seconds.max(1));
    (wait <= LONGEST_WAIT).then_some(wait)
}

/// Sends (`send`) until the answer stands: a refusal [`wait_for`] says to wait out is told with
/// `tell` and waited out with `pause`, then sent again, when the request is [`resendable`].
pub(crate) fn send_while_busy(
    method: &str,
    keyed: bool,
    mut send: impl FnMut() -> Result<ureq::Response, ureq::Error>,
    mut pause: impl FnMut(Duration),
    mut tell: impl FnMut(u16, Duration, u32),
) -> Result<ureq::Response, ureq::Error> {
    let mut waited = 0;
    loop {
        match send() {
            Err(ureq::Error::Status(status, response)) if resendable(method, keyed) => {
                match wait_for(status, response.header("retry-after"), waited) {
                    Some(wait) => {
                        waited += 1;
                        tell(status, wait, waited);
                        pause(wait);
                    }
                    None => return Err(ureq::Error::Status(status, response)),
                }
            }
            other => return other,
        }
    }
}

/// A new `Idempotency-Key` for one command: its retries, the CLI's own or the operator's with
/// the same key, do its work once.
pub(crate) fn new_key() -> Result<String, CliError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| CliError::Unexpected(format!("no random bytes for a request key: {e}")))?;
    Ok(format!(
        "exk8s-cli-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::cell::RefCell;

    use super::*;

    fn answer(status: u16, retry_after: Option<&str>) -> Result<ureq::Response, ureq::Error> {
        let header = retry_after.map_or(String::new(), |r| format!("Retry-After: {r}\r\n"));
        let response: ureq::Response =
            format!("HTTP/1.1 {status} Whatever\r\n{header}Content-Length: 0\r\n\r\n")
                .parse()
                .unwrap();
        if status >= 400 {
            Err(ureq::Error::Status(status, response))
        } else {
            Ok(response)
        }
    }

    /// Sends `method` against `answers` in turn; the status it ends with and the waits taken.
    fn run(method: &str, keyed: bool, answers: Vec<(u16, Option<&str>)>) -> (u16, Vec<u64>) {
        let answers = RefCell::new(answers.into_iter());
        let (paused, told) = (RefCell::new(Vec::new()), RefCell::new(Vec::new()));
        let ended = send_while_busy(
            method,
            keyed,
            || {
                let (status, retry_after) = answers.borrow_mut().next().expect("sent too often");
                answer(status, retry_after)
            },
            |wait| paused.borrow_mut().push(wait.as_secs()),
            |status, wait, n| told.borrow_mut().push((status, wait.as_secs(), n)),
        );
        let status = match ended {
            Ok(response) => response.status(),
            Err(ureq::Error::Status(status, _)) => status,
            Err(e) => panic!("{e}"),
        };
        let paused = paused.into_inner();
        let told: Vec<u64> = told.into_inner().iter().map(|t| t.1).collect();
        assert_eq!(paused, told, "every wait is told before it is taken");
        (status, paused)
    }

    #[test]
    fn a_busy_api_is_waited_out_as_long_as_it_asks() {
        let busy = vec![(503, Some("3")), (429, Some("1")), (200, None)];
        assert_eq!(run("GET", false, busy), (200, vec![3, 1]));
        // "0" still waits a second: never a loop of refusals.
        assert_eq!(
            run("DELETE", false, vec![(503, Some("0")), (204, None)]),
            (204, vec![1])
        );
    }

    #[test]
    fn a_key_still_in_progress_is_waited_for() {
        // The first sending's claim on its key is still being let go after its 503.
        let busy = vec![(503, Some("2")), (409, Some("1")), (202, None)];
        assert_eq!(run("POST", true, busy), (202, vec![2, 1]));
    }

    #[test]
    fn a_post_is_sent_again_only_with_an_idempotency_key() {
        let busy = || vec![(503, Some("2")), (202, None)];
        assert_eq!(run("POST", true, busy()), (202, vec![2]));
        assert_eq!(run("PATCH", true, busy()), (202, vec![2]));
        assert_eq!(run("POST", false, busy()), (503, vec![]));
        assert_eq!(run("PATCH", false, busy()), (503, vec![]));
    }

    #[test]
    fn a_refusal_stands_without_a_usable_retry_after_or_past_the_waits_allowed() {
        assert_eq!(run("GET", false, vec![(503, None)]), (503, vec![]));
        assert_eq!(
            run(
                "GET",
                false,
                vec![(503, Some("Fri, 31 Dec 1999 23:59:59 GMT"))]
            ),
            (503, vec![])
        );
        assert_eq!(run("GET", false, vec![(503, Some("61"))]), (503, vec![]));
        assert_eq!(run("GET", false, vec![(500, Some("1"))]), (500, vec![]));
        assert_eq!(run("POST", true, vec![(409, None)]), (409, vec![]));
        assert_eq!(run("POST", false, vec![(409, Some("1"))]), (409, vec![]));
        let always_busy = vec![(503, Some("60")); 6];
        assert_eq!(run("GET", false, always_busy), (503, vec![60; 5]));
    }

    #[test]
    fn each_command_has_its_own_key() {
        let (a, b) = (new_key().unwrap(), new_key().unwrap());
        assert_ne!(a, b);
        assert!(
            a.starts_with("exk8s-cli-") && a.len() == "exk8s-cli-".len() + 32,
            "{a}"
        );
    }
}
