//! The template engine: every template embedded at build time, rendered with
//! `UndefinedBehavior::Strict` (a missing variable is an error, never an empty string), no
//! auto-escaping (none of our formats is HTML), and explicit quoting filters:
//!
//! * `q` — a JSON string literal, which is also a valid YAML double-quoted scalar and a TOML
//!   basic string: no value can break the document around it.
//! * `arg` — a systemd command-line word; refuses anything outside a conservative character set
//!   (no whitespace, quotes, `%` specifiers or `$` expansions) so rendering fails instead of
//!   producing a unit that runs something else.

use std::sync::OnceLock;

use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};
use serde::Serialize;

/// A template and its declared inputs: implemented by exactly one context struct each.
pub(crate) trait Template: Serialize {
    /// The template's name (its file name under `templates/`).
    const NAME: &'static str;
}

macro_rules! embedded {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../../templates/", $name)))),*]
    };
}

const TEMPLATES: &[(&str, &str)] = embedded![
    "cluster.env",
    "etcd.service",
    "etcd-bootstrap.env",
    "kubelet.service",
    "kubelet-config.yaml",
    "kube-apiserver.yaml",
    "kube-controller-manager.yaml",
    "kube-scheduler.yaml",
    "bridge-cni.conflist.tmpl",
    "cilium-values.yaml",
    "kube-proxy.yaml",
    "coredns.yaml",
    "rbac.yaml",
    "encryption-config.yaml",
    "audit-policy.yaml",
    "containerd-config.toml",
    "userdata.yaml",
];

fn quote(value: &str) -> String {
    // Serialising a &str to JSON cannot fail.
    serde_json::to_string(value).unwrap_or_else(|_| unreachable!("strings always serialise"))
}

fn systemd_arg(value: &str) -> Result<String, Error> {
    let safe = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/,=@+-[]".contains(&b));
    if safe {
        Ok(value.to_owned())
    } else {
        Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("`{}` is not a safe systemd argument", value.escape_debug()),
        ))
    }
}

fn environment() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_keep_trailing_newline(true);
        env.add_filter("q", |v: String| quote(&v));
        env.add_filter("arg", |v: String| systemd_arg(&v));
        for (name, source) in TEMPLATES {
            // The templates are compiled into the binary and covered by tests: a syntax error
            // is a build defect, caught by every rendering test before it could ship.
            if let Err(e) = env.add_template(name, source) {
                panic!("embedded template {name} does not compile: {e:#}");
            }
        }
        env
    })
}

/// Renders `ctx` with its template.
pub(crate) fn render<T: Template>(ctx: &T) -> Result<String, Error> {
    environment().get_template(T::NAME)?.render(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Probe {
        value: String,
    }

    #[test]
    fn quoting_survives_hostile_values() {
        let q = quote("a: b # c\n\"d\"");
        let parsed: String = serde_json::from_str(&q).unwrap();
        assert_eq!(parsed, "a: b # c\n\"d\"");
    }

    #[test]
    fn systemd_args_refuse_whitespace_and_specifiers() {
        assert!(systemd_arg("--name=cp-1.cluster-42.internal").is_ok());
        assert!(systemd_arg("https://10.0.0.1:2379,https://127.0.0.1:2379").is_ok());
        for bad in ["a b", "%n", "$HOME", "a\"b", "", "a\nb", "a;b"] {
            assert!(systemd_arg(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn undefined_variables_are_errors() {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.add_template("t", "{{ value }} {{ missing }}").unwrap();
        let err = env
            .get_template("t")
            .unwrap()
            .render(Probe { value: "x".into() })
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UndefinedError);
    }

    #[test]
    fn every_embedded_template_compiles() {
        let env = environment();
        for (name, _) in TEMPLATES {
            assert!(env.get_template(name).is_ok(), "{name}");
        }
    }
}
