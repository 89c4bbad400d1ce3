//! The documentation's links hold: every link and image in the repository's Markdown files
//! (read with a CommonMark parser, so code blocks and code spans never count) that points into
//! the repository names a file or directory that exists, and a `#fragment` names a heading of
//! its page, as GitHub makes a heading's anchor. Links to other sites are not fetched (nothing
//! outside is reachable in CI); a link out of the repository (`../`) is refused: the reader of
//! a clone, or of the forge's page, has nothing there.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, Parser, Tag, TagEnd};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every Markdown file git tracks, as paths from the root.
fn markdown_files() -> Vec<PathBuf> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "*.md"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(out.status.success(), "git ls-files: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(PathBuf::from)
        .collect()
}

/// GitHub's anchor for a heading's text: lower case, spaces to hyphens, every character but
/// letters, digits, `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// A page's links (destinations) and its headings' anchors.
fn read(text: &str) -> (Vec<String>, BTreeSet<String>) {
    let (mut links, mut anchors) = (Vec::new(), BTreeSet::new());
    let mut heading: Option<String> = None;
    for event in Parser::new(text) {
        match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                links.push(dest_url.into_string());
            }
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                anchors.insert(anchor(&heading.take().unwrap_or_default()));
            }
            _ => {}
        }
    }
    (links, anchors)
}

/// `path` (relative to `base`, a directory inside the root) resolved without touching the
/// disk; `None` when it leaves the root.
fn resolve(base: &Path, path: &str) -> Option<PathBuf> {
    let mut parts: Vec<Component<'_>> = base.components().collect();
    for part in Path::new(path).components() {
        match part {
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            other => parts.push(other),
        }
    }
    Some(parts.iter().collect())
}

#[test]
fn every_link_in_the_documentation_resolves() {
    let root = root();
    let files = markdown_files();
    assert!(
        files.iter().any(|f| f == Path::new("README.md")),
        "{files:?}"
    );
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let (links, own_anchors) = read(&text);
        for link in links {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                Some(file.clone())
            } else {
                resolve(file.parent().unwrap(), path)
            };
            let Some(target) = target else {
                broken.push(format!("{}: {link} leaves the repository", file.display()));
                continue;
            };
            if !root.join(&target).exists() {
                broken.push(format!("{}: {link}: no such file", file.display()));
                continue;
            }
            if fragment.is_empty() {
                continue;
            }
            let anchors = if target == *file {
                own_anchors.clone()
            } else if target.extension().is_some_and(|e| e == "md") {
                read(&std::fs::read_to_string(root.join(&target)).unwrap()).1
            } else {
                broken.push(format!(
                    "{}: {link}: a fragment of a non-Markdown file",
                    file.display()
                ));
                continue;
            };
            if !anchors.contains(fragment) {
                broken.push(format!(
                    "{}: {link}: {} has no heading #{fragment}",
                    file.display(),
                    target.display()
                ));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked >= 20,
        "only {checked} links inside the repository were found"
    );
}

/// The book (`book.toml`; `scripts/test.sh` runs `mdbook build`): its table of contents,
/// `docs/SUMMARY.md`, lists every page under `docs/` exactly once, and no page links out of
/// `docs/` — the built book holds only its pages, so such a link would break there.
#[test]
fn the_book_holds_every_page_and_its_links_stay_inside_it() {
    let root = root();
    let summary = std::fs::read_to_string(root.join("docs/SUMMARY.md")).unwrap();
    let (listed, _) = read(&summary);
    let listed: Vec<PathBuf> = listed.iter().map(|l| Path::new("docs").join(l)).collect();
    let unique: BTreeSet<&PathBuf> = listed.iter().collect();
    assert_eq!(
        unique.len(),
        listed.len(),
        "a page listed twice: {listed:?}"
    );
    let pages: BTreeSet<PathBuf> = markdown_files()
        .into_iter()
        .filter(|f| f.starts_with("docs") && f != Path::new("docs/SUMMARY.md"))
        .collect();
    let listed: BTreeSet<PathBuf> = listed.into_iter().collect();
    assert_eq!(
        listed.difference(&pages).collect::<Vec<_>>(),
        Vec::<&PathBuf>::new(),
        "listed in docs/SUMMARY.md but no page"
    );
    assert_eq!(
        pages.difference(&listed).collect::<Vec<_>>(),
        Vec::<&PathBuf>::new(),
        "pages the book leaves out (add them to docs/SUMMARY.md)"
    );
    let mut outside = Vec::new();
    for page in &pages {
        let (links, _) = read(&std::fs::read_to_string(root.join(page)).unwrap());
        for link in links {
            if link.contains("://") || link.starts_with("mailto:") || link.starts_with('#') {
                continue;
            }
            let path = link.split_once('#').map_or(link.as_str(), |(p, _)| p);
            let inside =
                resolve(page.parent().unwrap(), path).is_some_and(|t| t.starts_with("docs"));
            if !inside {
                outside.push(format!("{}: {link}", page.display()));
            }
        }
    }
    assert!(
        outside.is_empty(),
        "links out of the book:\n{}",
        outside.join("\n")
    );
}

/// The checker itself: code is never a link, anchors are made as GitHub makes them, and a
/// path out of the repository is refused.
#[test]
fn the_checker_reads_markdown_as_github_does() {
    let (links, anchors) = read(
        "# Walkthrough (with `dev` on 127.0.0.1:8080)\n\n[a](b.md#c) `[x](y.md)`\n\n```\n[p](q.md)\n```\n## Day 2: it's here\n",
    );
    assert_eq!(links, ["b.md#c"]);
    assert!(
        anchors.contains("walkthrough-with-dev-on-1270018080"),
        "{anchors:?}"
    );
    assert!(anchors.contains("day-2-its-here"), "{anchors:?}");
    assert_eq!(
        resolve(Path::new("docs"), "../README.md"),
        Some(PathBuf::from("README.md"))
    );
    assert_eq!(resolve(Path::new(""), "../shared/x.md"), None);
}
