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

/// How much of a parameter's name an error repeats: a 60 KB name does not come back whole.
const NAME_SHOWN: usize = 64;

/// A query parameter's name as an error shows it: at most [`NAME_SHOWN`] characters.
fn shown(name: &str) -> String {
    match name.char_indices().nth(NAME_SHOWN) {
        Some((cut, _)) => format!("{}…", &name[..cut]),
        None => name.to_owned(),
    }
}

/// Reads the raw query string `query` into its parameters; a parameter given twice
/// (`limit=1&limit=2`) is refused, never silently resolved one way.
pub fn params(query: Option<&str>) -> Result<BTreeMap<String, String>, ApiError> {
    let mut params = BTreeMap::new();
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if params.contains_key(name.as_ref()) {
            let name = shown(&name);
            return Err(ApiError::invalid(
                &name,
                format!("query parameter `{name}` is given more than once"),
            ));
        }
        params.insert(name.into_owned(), value.into_owned());
    }
    Ok(params)
}

/// Reads `limit` and `cursor`; anything else, or a bad value, is refused naming it.
pub fn parse(params: &BTreeMap<String, String>) -> Result<Page, ApiError> {
    if let Some(unknown) = params
        .keys()
        .find(|k| !matches!(k.as_str(), "limit" | "cursor"))
    {
        let unknown = shown(unknown);
        return Err(ApiError::invalid(
            &unknown,
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

    fn pairs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn pages_are_read_and_bad_ones_named() {
        assert_eq!(
            parse(&pairs(&[])).ok(),
            Some(Page {
                limit: 500,
                after: 0
            })
        );
        assert_eq!(
            parse(&pairs(&[("limit", "20"), ("cursor", "c41")])).ok(),
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
            let refused = parse(&pairs(&[(key, value)])).map(|_| ()).unwrap_err();
            assert!(format!("{refused:?}").contains(key), "{key}={value}");
        }
    }
}

#[cfg(test)]
mod query_tests {
    use super::*;

    #[test]
    fn a_repeated_parameter_is_refused_and_long_names_are_cut() {
        let read = params(Some("limit=1&cursor=c4")).unwrap();
        assert_eq!(read.get("limit").map(String::as_str), Some("1"));
        assert!(params(None).unwrap().is_empty());

        let repeated = format!("{:?}", params(Some("limit=1&limit=2")).unwrap_err());
        assert!(
            repeated.contains("`limit` is given more than once"),
            "{repeated}"
        );

        let long = "x".repeat(60_000);
        let refused = parse(&params(Some(&format!("{long}=1"))).unwrap()).unwrap_err();
        let said = format!("{refused:?}");
        assert!(
            said.len() < 1_000,
            "the name came back whole: {} bytes",
            said.len()
        );
        assert!(said.contains(&format!("`{}…`", "x".repeat(NAME_SHOWN))));
    }
}
