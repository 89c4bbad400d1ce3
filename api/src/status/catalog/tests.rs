//! The catalog against the code: every condition type and reason the status module (and the
//! health verdicts' reasons it passes on) can give is listed, and nothing else; the generated
//! page is current. The code is read with a Rust parser (`syn`): a CamelCase string literal
//! outside its tests is a type or a reason.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test")]

use std::collections::BTreeSet;
use std::path::Path;

use syn::visit::Visit;

use super::{CONDITIONS, page};

/// The CamelCase string literals of a file's items, tests left out; with `only_fn`, those of
/// the functions so named.
struct Literals<'a> {
    only_fn: Option<&'a str>,
    inside: bool,
    found: BTreeSet<String>,
}

impl<'ast> Visit<'ast> for Literals<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let test = m.attrs.iter().any(|a| {
            a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
        });
        if !test {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        let was = self.inside;
        self.inside = was || self.only_fn.is_some_and(|name| f.sig.ident == name);
        syn::visit::visit_impl_item_fn(self, f);
        self.inside = was;
    }

    fn visit_lit_str(&mut self, lit: &'ast syn::LitStr) {
        let text = lit.value();
        let camel = text.len() > 1
            && text.starts_with(|c: char| c.is_ascii_uppercase())
            && text.chars().all(|c| c.is_ascii_alphanumeric())
            && text.chars().any(|c| c.is_ascii_lowercase());
        if camel && (self.only_fn.is_none() || self.inside) {
            self.found.insert(text);
        }
    }
}

fn literals(file: &Path, only_fn: Option<&str>) -> BTreeSet<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut visitor = Literals {
        only_fn,
        inside: false,
        found: BTreeSet::new(),
    };
    visitor.visit_file(&parsed);
    visitor.found
}

#[test]
fn the_catalog_lists_every_type_and_reason_the_code_gives() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut given = BTreeSet::new();
    for entry in std::fs::read_dir(src.join("status")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap();
        // The module itself holds the statuses' own words (`True`, ...); the catalog is what
        // is checked.
        if path.extension().is_some_and(|e| e == "rs") && name != "mod.rs" && name != "catalog.rs" {
            given.extend(literals(&path, None));
        }
    }
    // The health verdicts' reasons, which `HealthCheckSucceeded` and `RemediationAllowed` give.
    for file in ["health/judge.rs", "health/mod.rs"] {
        given.extend(literals(&src.join(file), Some("reason")));
    }
    assert!(given.len() > 50, "{given:?}");
    let listed: BTreeSet<String> = CONDITIONS
        .iter()
        .flat_map(|c| std::iter::once(c.type_).chain(c.reasons.iter().map(|r| r.name)))
        .map(str::to_owned)
        .collect();
    let missing: Vec<&String> = given.difference(&listed).collect();
    let stale: Vec<&String> = listed.difference(&given).collect();
    assert!(
        missing.is_empty(),
        "given by the code, not in the catalog: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "in the catalog, given by nothing: {stale:?}"
    );
    let types: BTreeSet<&str> = CONDITIONS.iter().map(|c| c.type_).collect();
    assert_eq!(types.len(), CONDITIONS.len(), "a type listed twice");
    for c in CONDITIONS {
        let names: BTreeSet<&str> = c.reasons.iter().map(|r| r.name).collect();
        assert_eq!(names.len(), c.reasons.len(), "{}: a reason twice", c.type_);
    }
}

#[test]
fn the_conditions_page_is_current() {
    let kept = exk8s_cli_reference::keep(
        env!("CARGO_MANIFEST_DIR"),
        "docs/reference/conditions.md",
        &page(),
    );
    assert_eq!(kept, Ok(()));
}
