//! Pages of `GET /clusters`: `limit` (1–500, default 500) and `cursor`, opaque to clients,
//! taken from the previous page's `Link: <…>; rel="next"` header. A page without that header is
//! the last. Rows come in id order, so a cursor stays valid while clusters come and go.

use std::collections::BTreeMap;

use super::error::ApiError;

/// The most rows one page holds.
pub const MAX_LIMIT: i64 = 500;

/// One page asked for: at most `limit` rows with an id above `after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub limit: i64,
    pub after: i64,
}

/// Reads `limit` and `cursor`; anything else, or a bad value, is refused naming it.
pub fn parse(params: &BTreeMap<String, String>) -> Result<Page, ApiError> {
    if let Some(unknown) = params
        .keys()
        .find(|k| !matches!(k.as_str(), "limit" | "cursor"))
    {
        return Err(ApiError::invalid(
            unknown,
            format!("unknown query parameter `{unknown}` (expected limit, cursor)"),
        ));
    }
    let limit = match params.get("limit") {
        None => MAX_LIMIT,
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|l| (1..=MAX_LIMIT).contains(l))
            .ok_or_else(|| {
                ApiError::invalid(
                    "limit",
                    format!("limit must be an integer from 1 to {MAX_LIMIT}"),
                )
            })?,
    };
    let after = match params.get("cursor") {
        None => 0,
        Some(text) => text
            .strip_prefix("c")
            .and_then(|id| id.parse::<i64>().ok())
            .filter(|id| *id > 0)
            .ok_or_else(|| {
                ApiError::invalid(
                    "cursor",
                    "cursor is not one this API made: take it from the previous page's Link header",
                )
            })?,
    };
    Ok(Page { limit, after })
}

/// The `Link` header naming the page after the one that ended with `last_id`.
pub fn next_link(path: &str, page: Page, last_id: i64) -> String {
    format!(
        "<{path}?limit={}&cursor=c{last_id}>; rel=\"next\"",
        page.limit
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn pages_are_read_and_bad_ones_named() {
        assert_eq!(
            parse(&params(&[])).ok(),
            Some(Page {
                limit: 500,
                after: 0
            })
        );
        assert_eq!(
            parse(&params(&[("limit", "20"), ("cursor", "c41")])).ok(),
            Some(Page {
                limit: 20,
                after: 41
            })
        );
        for (key, value) in [
            ("limit", "0"),
            ("limit", "501"),
            ("limit", "ten"),
            ("cursor", "41"),
            ("cursor", "c-1"),
            ("page", "2"),
        ] {
            let refused = parse(&params(&[(key, value)])).map(|_| ()).unwrap_err();
            assert!(format!("{refused:?}").contains(key), "{key}={value}");
        }
    }
}
