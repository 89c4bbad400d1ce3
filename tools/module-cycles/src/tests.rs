//! A made-up crate with one trap of each kind a reader of Rust can fall into, and the circles
//! it must find: at the file level, through a `use` group, a child module and `super::super`,
//! and through a macro's tokens after a string holding `//`; at the module level, one more.

#![allow(clippy::unwrap_used, reason = "test code")]

use std::path::Path;

use crate::paths;

const CRATE: &[(&str, &str)] = &[
    (
        "lib.rs",
        "pub mod a; pub mod b; pub mod c; pub mod d; pub mod e; pub mod f; pub mod g; pub mod h; pub mod i;",
    ),
    ("a.rs", "use crate::{b::thing, c as _};\npub fn go() {}\n"),
    (
        "b/mod.rs",
        "mod inner;\npub use self::inner::thing;\npub fn helper() {}\n",
    ),
    (
        "b/inner.rs",
        "pub fn thing() { super::helper(); super::super::a::go(); }\n",
    ),
    (
        "c.rs",
        "pub fn go() -> String {\n    let url = format!(\"https://{}:6443\", 1); crate::e::call(); url\n}\n",
    ),
    (
        "e.rs",
        "pub fn call() { println!(\"{}\", crate::c::go()); }\n",
    ),
    (
        "d.rs",
        concat!(
            "//! Names crate::a::go in its documentation only.\n",
            "/// crate::a::go, in a doc comment\n",
            "pub fn traps<'a>(x: &'a str) -> &'a str {\n",
            "    // crate::a::go in a comment\n",
            "    /* a block /* nested crate::a::go */ crate::a::go */\n",
            "    let quote = '\"'; let text = \"crate::a::go\";\n",
            "    let raw = r#\"crate::a::go \"quoted\" // \"#;\n",
            "    let _ = (quote, text, raw);\n",
            "    crate::f::real();\n",
            "    x\n",
            "}\n",
            "#[cfg(test)]\nmod tests { use crate::a; }\n",
            "#[cfg(test)]\nfn helper() { crate::a::go(); }\n",
        ),
    ),
    ("f.rs", "pub fn real() {}\n"),
    ("g/mod.rs", "pub mod x;\npub fn y() {}\n"),
    ("g/x.rs", "pub fn go() { crate::h::go(); }\n"),
    ("h.rs", "pub fn go() { crate::g::y(); }\n"),
    ("i/mod.rs", "mod j;\npub fn k() { j::go(); }\n"),
    ("i/j.rs", "pub fn go() { crate::i::k(); }\n"),
];

fn made_up() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in CRATE {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

fn module(path: &str) -> paths::Module {
    path.split("::").map(str::to_owned).collect()
}

#[test]
fn every_trap_is_read_as_the_compiler_reads_it() {
    let dir = made_up();
    let files = paths::files(dir.path()).unwrap();
    let named = |m: &str| {
        let text = std::fs::read_to_string(&files[&module(m)]).unwrap();
        paths::named(&module(m), &text, &files).unwrap()
    };
    // Comments, doc comments, strings, raw strings, a char literal holding a quote, lifetimes
    // and test-only items name nothing; the real path after them is found.
    assert_eq!(named("d"), [module("f")].into());
    // A `use` group, `self::` and a child named without a prefix.
    assert_eq!(named("a"), [module("b"), module("c")].into());
    assert_eq!(named("b"), [module("b::inner")].into());
    assert_eq!(named("i"), [module("i::j")].into());
    // `super::super::` climbs twice; a path inside a macro's tokens counts.
    assert_eq!(named("b::inner"), [module("b"), module("a")].into());
    assert_eq!(named("e"), [module("c")].into());
    // After a string holding `//`, the code goes on.
    assert_eq!(named("c"), [module("e")].into());
}

#[test]
fn the_circles_of_the_made_up_crate_are_found_and_nothing_else() {
    let dir = made_up();
    let report = crate::check(dir.path()).unwrap();
    let names = |circles: &[&[&str]]| -> Vec<Vec<String>> {
        circles
            .iter()
            .map(|c| c.iter().map(|s| (*s).to_owned()).collect())
            .collect()
    };
    assert_eq!(
        report.file_circles,
        names(&[&["a", "b", "b::inner"], &["c", "e"]])
    );
    // g::x -> h -> g is no circle of files, but one of modules.
    assert_eq!(
        report.module_circles,
        names(&[&["a", "b"], &["c", "e"], &["g", "h"]])
    );
    // Each module circle names the file dependencies that make it.
    let pairs = |edges: &[(&str, &str)]| -> Vec<(String, String)> {
        edges
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    };
    assert_eq!(report.crossings[2], pairs(&[("g::x", "h"), ("h", "g")]));
    assert_eq!(report.crossings[1], pairs(&[("c", "e"), ("e", "c")]));
    assert!(
        report
            .to_string()
            .contains("  modules: g <-> h\n    g::x -> h\n    h -> g\n")
    );
    assert_eq!(report.circles(), 5);
    // Circles leave no layering.
    assert_eq!(report.layers, None);
}

#[test]
fn the_layers_of_a_crate_without_circles_are_its_longest_paths() {
    let dir = tempfile::tempdir().unwrap();
    for (file, text) in [
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub mod d;\n"),
        ("a.rs", "pub fn go() { crate::b::go(); crate::d::go(); }\n"),
        ("b/mod.rs", "pub mod inner;\npub fn go() { inner::go(); }\n"),
        (
            "b/inner.rs",
            "pub fn go() { crate::c::go(); super::go(); }\n",
        ),
        ("c.rs", "pub fn go() {}\n"),
        ("d.rs", "pub fn go() {}\n"),
    ] {
        let path = dir.path().join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let report = crate::check(dir.path()).unwrap();
    assert_eq!(report.circles(), 0);
    let layer = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    // a uses d (layer 0) and b, which uses c through its child: a is above b, not beside it.
    assert_eq!(
        report.layers,
        Some(vec![
            layer(&["(crate root)", "c", "d"]),
            layer(&["b"]),
            layer(&["a"])
        ])
    );
}

#[test]
fn a_file_that_does_not_parse_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lib.rs"), "pub fn broken( {").unwrap();
    let e = crate::check(Path::new(dir.path())).unwrap_err();
    assert!(e.starts_with("parsing ") && e.contains("lib.rs: "), "{e}");
}
