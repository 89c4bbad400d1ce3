//! Regenerates `common/tests/data/*/` from `tests/support/fixtures.rs`.
//!
//! `cargo run -p exk8s-common --features sign --example make-fixtures`

#![allow(
    clippy::unwrap_used,
    reason = "a developer tool; a failure should stop it loudly"
)]

#[path = "../tests/support/fixtures.rs"]
mod fixtures;

fn main() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let keys = data.join("trusted-keys");
    std::fs::create_dir_all(&keys).unwrap();
    std::fs::write(keys.join("test-key.pub"), fixtures::test_key_pub_text()).unwrap();
    for fixture in fixtures::all() {
        let dir = data.join(fixture.name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("envelope.json"), &fixture.envelope).unwrap();
        let expect = fixture.expect.unwrap_or("ok");
        std::fs::write(dir.join("expect"), format!("{expect}\n")).unwrap();
        std::fs::write(dir.join("ABOUT"), format!("{}\n", fixture.about)).unwrap();
        eprintln!("wrote {}", dir.display());
    }
}
