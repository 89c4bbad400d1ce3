//! The console's session: the operator's own API token, given once on the login form and kept
//! in a cookie the browser sends only to `/ui` of this origin (`HttpOnly`: no page script can
//! read it; `SameSite=Strict`: no other site's page can make the browser send it; `Secure`
//! when the API's public URL is HTTPS), for no longer than the token itself lives, at most
//! [`MAX_AGE_SECS`]. A form post whose `Origin` names another site is refused, so another
//! site cannot log a browser in as someone else either. Each request checks the token as the
//! API does (revoked, expired or not an operator's: back to the login page).

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use minijinja::context;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::render::{error_page, page};
use crate::app::AppState;
use crate::http::error::ApiError;
use crate::http::extract::Operator;

const COOKIE: &str = "exk8s_console";
/// The longest a console session lasts, whatever the token's own life.
const MAX_AGE_SECS: i64 = 12 * 3600;
/// The longest form a console page sends (an SSH public key is the longest field).
pub(super) const MAX_FORM_BYTES: usize = 16 * 1024;

/// A signed-in console request: the operator the cookie's token is, and the token itself for
/// the console's own calls of the API ([`super::client`]). Not `Debug`: the token is never
/// shown or logged.
pub(super) struct Console {
    pub operator: Operator,
    token: String,
}

impl Console {
    /// The operator's org's cluster `id`; another org's is not found.
    pub(super) async fn cluster(
        &self,
        state: &AppState,
        id: i64,
    ) -> Result<crate::db::clusters::ClusterRow, ApiError> {
        crate::db::clusters::get(&state.db.pool, self.operator.org_id, id)
            .await?
            .ok_or(ApiError::NotFound)
    }

    /// The operator's token, for an API call made on its behalf.
    pub(super) fn token(&self) -> &str {
        &self.token
    }

    /// The key every form of this session carries ([`Console::check_form`]): derived from the
    /// token by a one-way hash, so a page shows it without showing the token, and another
    /// site, which can read neither the cookie nor the console's pages, cannot know it.
    pub(super) fn form_key(&self) -> String {
        let mut hash = Sha256::new();
        hash.update(b"exk8s console form key v1\n");
        hash.update(self.token.as_bytes());
        hex::encode(hash.finalize())
    }

    /// Whether a form that changes something is this session's own: sent from this origin and
    /// carrying this session's [`form key`](Console::form_key) (the cookie alone is not
    /// enough: it is `SameSite=Strict`, and the key guards browsers and proxies that would
    /// not honour that).
    pub(super) fn check_form(&self, headers: &HeaderMap, form: &Form) -> Result<(), ApiError> {
        if !same_origin(headers) {
            return Err(ApiError::Forbidden("this form was sent by another site"));
        }
        let sent = form.get("form_key").unwrap_or_default();
        if !bool::from(sent.as_bytes().ct_eq(self.form_key().as_bytes())) {
            return Err(ApiError::Forbidden(
                "this form is not from this session (it may be from before a new log-in): open the page again and resend",
            ));
        }
        Ok(())
    }
}

/// A form the browser sent, as its name and value pairs.
pub(super) struct Form(Vec<(String, String)>);

impl Form {
    /// The form in `body`; one larger than [`MAX_FORM_BYTES`] is refused.
    pub(super) fn parse(body: &[u8]) -> Result<Self, &'static str> {
        if body.len() > MAX_FORM_BYTES {
            return Err("the form is too large");
        }
        Ok(Self(
            form_urlencoded::parse(body)
                .map(|(name, value)| (name.into_owned(), value.into_owned()))
                .collect(),
        ))
    }

    /// The first value sent for `name`.
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.as_str())
    }
}

impl FromRequestParts<AppState> for Console {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let Some(token) = cookie(&parts.headers) else {
            return Err(Redirect::to("/ui/login").into_response());
        };
        match Operator::of_token(state, token).await {
            Ok(operator) => Ok(Self {
                operator,
                token: token.to_owned(),
            }),
            Err(ApiError::Unauthorized | ApiError::Forbidden(_)) => {
                Err(([(header::SET_COOKIE, clear())], Redirect::to("/ui/login")).into_response())
            }
            Err(e) => Err(error_page(None, &e)),
        }
    }
}

/// The session cookie's token, if the request carries one.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty())
}

/// A cookie that ends the session.
fn clear() -> HeaderValue {
    HeaderValue::from_static("exk8s_console=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// Whether a form post comes from this origin: a browser names the page's origin in `Origin`
/// on every POST; one naming another host is another site's form.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        // Not a browser's cross-site post (browsers always send it on POST).
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, host)| host);
    matches!((origin_host, host), (Some(a), Some(b)) if a == b)
}

/// `POST /ui/login` with `token=…`: checks the token as the API would, then keeps it.
pub(super) async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !same_origin(&headers) {
        return refused(StatusCode::FORBIDDEN, "this form was sent by another site");
    }
    let form = match Form::parse(&body) {
        Ok(form) => form,
        Err(why) => return refused(StatusCode::PAYLOAD_TOO_LARGE, why),
    };
    let token = form.get("token").unwrap_or_default().trim().to_owned();
    // Tokens are base64url: anything else is not one, and could not live in a cookie.
    let shaped = !token.is_empty()
        && token.len() <= 256
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !shaped {
        return refused(StatusCode::UNAUTHORIZED, "that is not an exk8s token");
    }
    let operator = match Operator::of_token(&state, &token).await {
        Ok(operator) => operator,
        Err(ApiError::Unauthorized) => {
            return refused(
                StatusCode::UNAUTHORIZED,
                "that token is unknown, expired or revoked",
            );
        }
        Err(ApiError::Forbidden(why)) => return refused(StatusCode::FORBIDDEN, why),
        Err(e) => return error_page(None, &e),
    };
    let lives = (operator.expires_at - crate::db::now()).clamp(0, MAX_AGE_SECS);
    let secure = if state.config.public_url.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    let set =
        format!("{COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={lives}{secure}");
    match HeaderValue::from_str(&set) {
        Ok(set) => ([(header::SET_COOKIE, set)], Redirect::to("/ui/clusters")).into_response(),
        Err(_) => refused(StatusCode::UNAUTHORIZED, "that is not an exk8s token"),
    }
}

/// `POST /ui/logout`: the cookie goes (the token itself stays valid for the API).
pub(super) async fn logout(headers: HeaderMap) -> Response {
    if !same_origin(&headers) {
        return refused(StatusCode::FORBIDDEN, "this form was sent by another site");
    }
    ([(header::SET_COOKIE, clear())], Redirect::to("/ui/login")).into_response()
}

/// The login page again, saying why.
fn refused(status: StatusCode, why: &str) -> Response {
    page(
        status,
        "login.html",
        context! { principal => (), error => why },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let h = headers(&[(header::COOKIE, "a=1; exk8s_console=tok_en-1; b=2")]);
        assert_eq!(cookie(&h), Some("tok_en-1"));
        assert_eq!(
            cookie(&headers(&[(header::COOKIE, "exk8s_console=")])),
            None
        );
        assert_eq!(cookie(&headers(&[(header::COOKIE, "other=1")])), None);
        assert_eq!(cookie(&HeaderMap::new()), None);
    }

    #[test]
    fn a_post_from_another_site_is_told_apart() {
        let host = (header::HOST, "127.0.0.1:8080");
        assert!(same_origin(&headers(std::slice::from_ref(&host))));
        assert!(same_origin(&headers(&[
            host.clone(),
            (header::ORIGIN, "http://127.0.0.1:8080")
        ])));
        assert!(!same_origin(&headers(&[
            host.clone(),
            (header::ORIGIN, "https://evil.example")
        ])));
        assert!(!same_origin(&headers(&[host, (header::ORIGIN, "null")])));
    }
}
