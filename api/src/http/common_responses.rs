//! Documents the answers every operation can give, whatever its handler says: 400 when a path
//! parameter, header or body does not parse; 413/415 for an oversized or non-JSON body; 401 when the operation is secured; 503 with
//! `Retry-After` when it needs the database and the database does not answer; 429 with
//! `Retry-After` on the rate-limited bootstrap routes. Added once here so no handler forgets one.

use utoipa::openapi::path::Operation;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, Ref, RefOr, Response};

/// Operations that never touch the database.
const WITHOUT_DATABASE: &[&str] = &["/healthz", "/metrics", "/bootstrap/keys"];

pub(super) struct CommonResponses;

fn error(description: &str, retry_after: bool) -> RefOr<Response> {
    let mut response = ResponseBuilder::new().description(description).content(
        "application/json",
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("ErrorBody")))
            .build(),
    );
    if retry_after {
        response = response.header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(1)),
                )
                .description(Some("Seconds to wait before retrying"))
                .build(),
        );
    }
    RefOr::T(response.build())
}

fn add(operation: &mut Operation, status: &str, response: impl FnOnce() -> RefOr<Response>) {
    operation
        .responses
        .responses
        .entry(status.to_owned())
        .or_insert_with(response);
}

impl utoipa::Modify for CommonResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, item) in &mut openapi.paths.paths {
            let operations = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
                &mut item.patch,
            ];
            for operation in operations.into_iter().flatten() {
                let takes_input = operation.parameters.as_ref().is_some_and(|p| !p.is_empty())
                    || operation.request_body.is_some();
                if takes_input {
                    add(operation, "400", || {
                        error("a parameter, header or body is malformed", false)
                    });
                }
                if operation.request_body.is_some() {
                    add(operation, "413", || {
                        error("the body is larger than 64 KiB", false)
                    });
                    add(operation, "415", || {
                        error("the body is not Content-Type: application/json", false)
                    });
                }
                if operation.security.as_ref().is_some_and(|s| !s.is_empty()) {
                    add(operation, "401", || {
                        error("missing, invalid, expired or revoked credentials", false)
                    });
                }
                if !WITHOUT_DATABASE.contains(&path.as_str()) && path != "/openapi.json" {
                    add(operation, "503", || {
                        error(
                            "the database is unavailable; retry after Retry-After seconds",
                            true,
                        )
                    });
                }
                if path.starts_with("/bootstrap/") && path != "/bootstrap/keys" {
                    operation.responses.responses.insert(
                        "429".to_owned(),
                        error("rate limited; retry after Retry-After seconds", true),
                    );
                    operation.responses.responses.insert(
                        "503".to_owned(),
                        error(
                            "the database is unavailable, the request passed its deadline, or \
                             the VM's node is still being recorded (its cluster being founded); \
                             retry after Retry-After seconds",
                            true,
                        ),
                    );
                }
            }
        }
    }
}
