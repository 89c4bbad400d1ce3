//! The HTTP API's reference page, generated from the OpenAPI document the API serves
//! (`/openapi.json`) and never copied by hand: every operation, grouped by path, with its
//! summary and description, parameters, request body, answers and whether it needs the
//! operator token. `docs/reference/http-api.md` is kept current by the test below
//! (`EXK8S_BLESS=1` rewrites it), beside `docs/reference/openapi.json`, the document itself.

use std::fmt::Write as _;

use serde_json::Value;
use utoipa::OpenApi as _;

/// The schema a `$ref` names (`#/components/schemas/X` → `X`), or the schema's type.
fn schema_name(schema: &Value) -> String {
    if let Some(name) = schema["$ref"].as_str() {
        return format!("`{}`", name.rsplit('/').next().unwrap_or(name));
    }
    if schema["type"] == "array" {
        return format!("array of {}", schema_name(&schema["items"]));
    }
    match &schema["type"] {
        Value::String(t) => format!("`{t}`"),
        Value::Array(types) => types
            .iter()
            .filter_map(Value::as_str)
            .map(|t| format!("`{t}`"))
            .collect::<Vec<_>>()
            .join(" or "),
        _ if schema["oneOf"].is_array() => "one of several shapes".to_owned(),
        _ => "any JSON".to_owned(),
    }
}

/// One line per content type: its media type and schema.
fn contents(content: &Value) -> String {
    content
        .as_object()
        .map(|media| {
            media
                .iter()
                .map(|(kind, body)| {
                    if body["schema"].is_null() {
                        format!("`{kind}`")
                    } else {
                        format!("`{kind}` {}", schema_name(&body["schema"]))
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// The page for `document` (an OpenAPI 3.1 document as JSON).
fn markdown(document: &Value) -> String {
    let mut page = String::from(
        "# HTTP API reference\n\n\
         Generated from the OpenAPI document `exk8s-api` serves at `/openapi.json` (kept beside \
         this page as [openapi.json](openapi.json); `cargo test -p exk8s-api reference` checks \
         both are current, `EXK8S_BLESS=1` rewrites them). The dev stack also serves it \
         browsable at `/docs`. Operations marked *operator* need `Authorization: Bearer` with an \
         operator token; the others authenticate as their description says (a VM's tokens, a \
         node's signature) or are open.\n",
    );
    let Some(paths) = document["paths"].as_object() else {
        return page;
    };
    for (path, item) in paths {
        let _ = write!(page, "\n## `{path}`\n");
        for method in ["get", "put", "post", "patch", "delete"] {
            let operation = &item[method];
            if operation.is_null() {
                continue;
            }
            let operator = operation["security"]
                .as_array()
                .is_some_and(|s| s.iter().any(|r| r.get("operator_token").is_some()));
            let _ = write!(
                page,
                "\n### {} `{path}`{}\n\n",
                method.to_uppercase(),
                if operator { " — *operator*" } else { "" }
            );
            for text in [&operation["summary"], &operation["description"]] {
                if let Some(text) = text.as_str() {
                    let _ = write!(page, "{}\n\n", text.trim());
                }
            }
            let parameters = operation["parameters"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !parameters.is_empty() {
                page.push_str("Parameters:\n\n");
                for p in parameters {
                    let required = if p["required"] == true {
                        ", required"
                    } else {
                        ""
                    };
                    let _ = write!(
                        page,
                        "- `{}` ({}{required}, {})",
                        p["name"].as_str().unwrap_or_default(),
                        p["in"].as_str().unwrap_or_default(),
                        schema_name(&p["schema"])
                    );
                    if let Some(text) = p["description"].as_str() {
                        let _ = write!(page, " — {}", text.replace('\n', " "));
                    }
                    page.push('\n');
                }
                page.push('\n');
            }
            let body = &operation["requestBody"];
            if !body.is_null() {
                let _ = write!(page, "Request body: {}\n\n", contents(&body["content"]));
            }
            if let Some(answers) = operation["responses"].as_object() {
                page.push_str("Answers:\n\n");
                for (status, answer) in answers {
                    let mut line = format!("- `{status}`");
                    if let Some(text) = answer["description"].as_str().filter(|t| !t.is_empty()) {
                        let _ = write!(line, " {}", text.replace('\n', " "));
                    }
                    let shown = contents(&answer["content"]);
                    if !shown.is_empty() {
                        let _ = write!(line, " — {shown}");
                    }
                    page.push_str(&line);
                    page.push('\n');
                }
            }
        }
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/reference/http-api.md` and `openapi.json` are what the served document says now.
    #[test]
    fn the_http_reference_is_current() {
        let document = serde_json::to_value(crate::http::ApiDoc::openapi()).unwrap();
        let json = serde_json::to_string_pretty(&document).unwrap() + "\n";
        let page = markdown(&document);
        for (page, rendered) in [
            ("docs/reference/http-api.md", &page),
            ("docs/reference/openapi.json", &json),
        ] {
            let kept = exk8s_cli_reference::keep(env!("CARGO_MANIFEST_DIR"), page, rendered);
            assert_eq!(kept, Ok(()));
        }
    }

    /// Every operation the document lists is on the page, with its answers.
    #[test]
    fn every_operation_is_on_the_page() {
        let document = serde_json::to_value(crate::http::ApiDoc::openapi()).unwrap();
        let page = markdown(&document);
        let mut operations = 0;
        for (path, item) in document["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                if ["get", "put", "post", "patch", "delete"].contains(&method.as_str()) {
                    operations += 1;
                    let heading = format!("### {} `{path}`", method.to_uppercase());
                    assert!(page.contains(&heading), "{heading}");
                }
            }
        }
        assert!(operations >= 50, "{operations}");
        assert_eq!(page.matches("\n### ").count(), operations);
        assert!(
            page.contains("### POST `/clusters` — *operator*"),
            "{page:.2000}"
        );
    }
}
