//! `exk8s kubeconfig NAME --merge`: the cluster's fresh admin kubeconfig merged into the
//! operator's own (`$KUBECONFIG`'s first file, else `~/.kube/config`) the way `kubectl config`
//! would keep it: entries of other clusters stay untouched, this cluster's cluster, user and
//! context entries are replaced by name, and its context becomes the current one. The file is
//! replaced whole (temporary file, rename) with mode 0600.

use std::path::{Path, PathBuf};

use yaml_serde::{Mapping, Value};
use zeroize::Zeroizing;

use crate::error::CliError;

/// The kubeconfig file `--merge` writes to.
pub(crate) fn target() -> Result<PathBuf, CliError> {
    if let Some(list) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        if let Some(first) = std::env::split_paths(&list).find(|p| !p.as_os_str().is_empty()) {
            return Ok(first);
        }
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .ok_or_else(|| CliError::Config("neither KUBECONFIG nor HOME is set".into()))?;
    Ok(PathBuf::from(home).join(".kube").join("config"))
}

fn parse(text: &str, what: &str) -> Result<Mapping, CliError> {
    if text.trim().is_empty() {
        return Ok(Mapping::new());
    }
    match yaml_serde::from_str::<Value>(text) {
        Ok(Value::Mapping(m)) => Ok(m),
        Ok(_) => Err(CliError::Failed(format!(
            "{what} is not a kubeconfig (not a mapping)"
        ))),
        Err(e) => Err(CliError::Failed(format!("{what} is not valid YAML: {e}"))),
    }
}

/// Names each user entry of `doc` after the context that uses it. The API names a kubeconfig's
/// user after its certificate's CN (`exk8s-admin`), the same for every cluster; merged as it
/// is, a second cluster's user would replace the first's, and the first cluster's context would
/// present the second's certificate. Context names are `<user>@<cluster>`, one per cluster.
/// The original names, for the entries an earlier merge left under them.
fn users_named_by_context(doc: &mut Mapping) -> Vec<Value> {
    let mut renamed: Vec<(Value, Value)> = Vec::new();
    let Some(Value::Sequence(contexts)) = doc.get_mut("contexts") else {
        return Vec::new();
    };
    for context in contexts.iter_mut() {
        let Some(name) = context.get("name").cloned() else {
            continue;
        };
        if let Some(user) = context.get_mut("context").and_then(|c| c.get_mut("user")) {
            if *user != name {
                renamed.push((user.clone(), name.clone()));
                *user = name;
            }
        }
    }
    if let Some(Value::Sequence(users)) = doc.get_mut("users") {
        for user in users.iter_mut() {
            let Some(slot) = user.get_mut("name") else {
                continue;
            };
            if let Some((_, new)) = renamed.iter().find(|(old, _)| old == slot) {
                *slot = new.clone();
            }
        }
    }
    renamed.into_iter().map(|(old, _)| old).collect()
}

/// `existing` with `new`'s entries merged in and its context current.
pub(crate) fn merge(existing: &str, new: &str, existing_name: &str) -> Result<String, CliError> {
    let mut into = parse(existing, existing_name)?;
    let mut from = parse(new, "the API's kubeconfig")?;
    let old_names = users_named_by_context(&mut from);
    for key in ["apiVersion", "kind"] {
        if !into.contains_key(key) {
            if let Some(v) = from.get(key) {
                into.insert(key.into(), v.clone());
            }
        }
    }
    for list in ["clusters", "users", "contexts"] {
        let incoming = match from.get(list) {
            Some(Value::Sequence(s)) => s.clone(),
            _ => Vec::new(),
        };
        let entries = into
            .entry(list.into())
            .or_insert_with(|| Value::Sequence(Vec::new()));
        let Value::Sequence(entries) = entries else {
            return Err(CliError::Failed(format!(
                "{existing_name}: `{list}` is not a list"
            )));
        };
        for entry in incoming {
            let name = entry.get("name").cloned();
            match entries.iter_mut().find(|e| e.get("name") == name.as_ref()) {
                Some(slot) => *slot = entry,
                None => entries.push(entry),
            }
        }
    }
    // A user left under the API's name by an earlier merge, that no context uses any more.
    let used: Vec<Value> = match into.get("contexts") {
        Some(Value::Sequence(contexts)) => contexts
            .iter()
            .filter_map(|c| c.get("context").and_then(|c| c.get("user")).cloned())
            .collect(),
        _ => Vec::new(),
    };
    if let Some(Value::Sequence(users)) = into.get_mut("users") {
        users.retain(|u| {
            u.get("name")
                .is_none_or(|n| !old_names.contains(n) || used.contains(n))
        });
    }
    if let Some(current) = from.get("current-context") {
        into.insert("current-context".into(), current.clone());
    }
    yaml_serde::to_string(&Value::Mapping(into))
        .map_err(|e| CliError::Failed(format!("encoding the merged kubeconfig: {e}")))
}

/// Merges `new` into `file` (created when missing); the context it made current.
pub(crate) fn merge_into(file: &Path, new: &str) -> Result<String, CliError> {
    let shown = file.display().to_string();
    let existing = match std::fs::read_to_string(file) {
        Ok(text) => Zeroizing::new(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Zeroizing::new(String::new()),
        Err(e) => return Err(CliError::io(format!("reading {shown}"), e)),
    };
    let merged = Zeroizing::new(merge(&existing, new, &shown)?);
    write_private(file, merged.as_bytes())?;
    let context = parse(new, "the API's kubeconfig")?
        .get("current-context")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    Ok(context)
}

/// Makes `context` current in `file` again (a refresh merges without moving the operator).
pub(crate) fn set_current(file: &Path, context: &str) -> Result<(), CliError> {
    let shown = file.display().to_string();
    let text = Zeroizing::new(
        std::fs::read_to_string(file).map_err(|e| CliError::io(format!("reading {shown}"), e))?,
    );
    let mut doc = parse(&text, &shown)?;
    doc.insert("current-context".into(), context.into());
    let out = Zeroizing::new(
        yaml_serde::to_string(&Value::Mapping(doc))
            .map_err(|e| CliError::Failed(format!("encoding {shown}: {e}")))?,
    );
    write_private(file, out.as_bytes())
}

/// Writes `bytes` to `file` atomically, readable by the user only (its directory made 0700
/// when missing).
pub(crate) fn write_private(file: &Path, bytes: &[u8]) -> Result<(), CliError> {
    crate::private_file::write(file, bytes)
        .map_err(|e| CliError::io(format!("writing {}", file.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OTHER: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: other\n  cluster:\n    server: https://other:6443\nusers:\n- name: me\n  user:\n    token: t\ncontexts:\n- name: other\n  context:\n    cluster: other\n    user: me\ncurrent-context: other\npreferences: {}\n";
    const NEW: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c1\n  cluster:\n    server: https://c1:6443\nusers:\n- name: exk8s-admin\n  user:\n    client-certificate-data: AA==\ncontexts:\n- name: exk8s-admin@c1\n  context:\n    cluster: c1\n    user: exk8s-admin\ncurrent-context: exk8s-admin@c1\n";

    fn names(doc: &str, list: &str) -> Vec<String> {
        let v: Value = yaml_serde::from_str(doc).unwrap_or(Value::Null);
        v[list]
            .as_sequence()
            .map(|s| {
                s.iter()
                    .filter_map(|e| e["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn merging_keeps_other_entries_and_replaces_this_clusters() {
        let once = merge(OTHER, NEW, "config").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(names(&once, "clusters"), ["other", "c1"]);
        assert_eq!(names(&once, "contexts"), ["other", "exk8s-admin@c1"]);
        let twice = merge(&once, NEW, "config").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(names(&twice, "users"), ["me", "exk8s-admin@c1"]);
        let v: Value = yaml_serde::from_str(&twice).unwrap_or(Value::Null);
        assert_eq!(v["current-context"].as_str(), Some("exk8s-admin@c1"));
        assert!(v.get("preferences").is_some());
    }

    #[test]
    fn two_clusters_keep_a_user_each() {
        let second = NEW.replace("c1", "c2").replace("AA==", "BB==");
        let both = merge(
            &merge(OTHER, NEW, "config").unwrap_or_default(),
            &second,
            "config",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            names(&both, "users"),
            ["me", "exk8s-admin@c1", "exk8s-admin@c2"]
        );
        let v: Value = yaml_serde::from_str(&both).unwrap_or(Value::Null);
        let user_of = |context: &str| {
            v["contexts"]
                .as_sequence()
                .and_then(|s| s.iter().find(|c| c["name"].as_str() == Some(context)))
                .and_then(|c| c["context"]["user"].as_str())
                .map(str::to_owned)
        };
        assert_eq!(user_of("exk8s-admin@c1").as_deref(), Some("exk8s-admin@c1"));
        assert_eq!(user_of("exk8s-admin@c2").as_deref(), Some("exk8s-admin@c2"));
        let cert_of = |user: &str| {
            v["users"]
                .as_sequence()
                .and_then(|s| s.iter().find(|u| u["name"].as_str() == Some(user)))
                .and_then(|u| u["user"]["client-certificate-data"].as_str())
                .map(str::to_owned)
        };
        assert_eq!(cert_of("exk8s-admin@c1").as_deref(), Some("AA=="));
        assert_eq!(cert_of("exk8s-admin@c2").as_deref(), Some("BB=="));
        // A file merged before users were named by context: its old entry goes.
        let old = format!(
            "{}users:\n- name: me\n  user:\n    token: t\n- name: exk8s-admin\n  user:\n    \
             client-certificate-data: OLD=\ncontexts:\n- name: exk8s-admin@c1\n  context:\n    \
             cluster: c1\n    user: exk8s-admin\n",
            "apiVersion: v1\nkind: Config\n"
        );
        let renewed = merge(&old, NEW, "config").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(names(&renewed, "users"), ["me", "exk8s-admin@c1"]);
    }

    #[test]
    fn a_broken_kubeconfig_is_refused_not_overwritten() {
        let e = merge("clusters: [", NEW, "~/.kube/config")
            .map(|_| ())
            .unwrap_err();
        assert!(e.to_string().contains("not valid YAML"), "{e}");
        let e = merge("clusters: 5\n", NEW, "~/.kube/config")
            .map(|_| ())
            .unwrap_err();
        assert!(e.to_string().contains("not a list"), "{e}");
    }
}
