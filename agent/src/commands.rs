//! The subcommands: `run` (the boot path), `apply`, `verify` and `prereqs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use exk8s_common::binding::DEFAULT_CLOCK_SKEW_SECS;
use exk8s_common::contract::{BootPhase, BundleKind};
use exk8s_common::limits::{MAX_ENVELOPE_BYTES, read_bounded};
use exk8s_common::{Disposition, Expected, VerifiedBundle, verify};

use crate::apply::host::{RecordingHost, SystemHost};
use crate::apply::{self, Change, Options};
use crate::clock::now;
use crate::config::NetConfig;
use crate::error::AgentError;
use crate::log::log_info;
use crate::machine::{apply_verified, clients, load_keyring};
use crate::report::{Reporter, State as Phase, Target};
use crate::state::{State, marker_path};
use crate::{fetch, imds, nodekey};

/// Reads a bundle file, refusing one over the envelope limit before reading it all.
pub fn read_bundle(path: &Path) -> Result<Vec<u8>, AgentError> {
    let file = std::fs::File::open(path).map_err(|source| AgentError::ReadInput {
        path: path.to_owned(),
        source,
    })?;
    read_bounded(file, MAX_ENVELOPE_BYTES).map_err(|e| match e {
        exk8s_common::limits::ReadLimitError::TooLarge { limit } => AgentError::RefusedOnDisk(
            format!("{} is over the {limit}-byte envelope limit", path.display()),
        ),
        exk8s_common::limits::ReadLimitError::Io(source) => AgentError::ReadInput {
            path: path.to_owned(),
            source,
        },
    })
}

/// Local checks for a bundle file (no request, so no nonce).
pub struct LocalCheck {
    pub vm_id: Option<u64>,
    /// Judge freshness at this time instead of now (for fixture bundles).
    pub at: Option<i64>,
    pub clock_skew_secs: i64,
}

fn check_local(
    bundle: &VerifiedBundle,
    check: &LocalCheck,
    applied_serial: Option<u64>,
) -> Result<Disposition, AgentError> {
    Ok(bundle.check_binding(&Expected {
        vm_id: check.vm_id.unwrap_or(bundle.payload().identity.vm_id),
        nonce: None,
        cluster_id: None,
        org_id: None,
        kind: None,
        now: check.at.unwrap_or_else(now),
        clock_skew_secs: check.clock_skew_secs,
        applied_serial,
    })?)
}

/// `verify --bundle FILE`: signature, type, contents, and the local binding checks.
pub fn verify_file(
    path: &Path,
    keys: &Path,
    check: &LocalCheck,
) -> Result<VerifiedBundle, AgentError> {
    let bytes = read_bundle(path)?;
    let bundle = verify(&bytes, &load_keyring(keys)?)?;
    // A bundle on its own: no applied serial to compare with.
    check_local(&bundle, check, None)?;
    Ok(bundle)
}

fn describe_plan(outcome: &apply::Outcome) -> String {
    let mut out = String::new();
    for (path, change) in &outcome.files {
        let word = match change {
            Change::Create => "create",
            Change::Update => "update",
            Change::Unchanged => "unchanged",
        };
        out.push_str(&format!("{word:>9} {path}\n"));
    }
    out
}

/// `apply --bundle FILE [--root DIR] [--dry-run]`. Returns the text to print.
pub fn apply_file(
    path: &Path,
    keys: &Path,
    root: Option<&Path>,
    dry_run: bool,
    check: &LocalCheck,
) -> Result<String, AgentError> {
    let bytes = read_bundle(path)?;
    let bundle = verify(&bytes, &load_keyring(keys)?)?;
    let root_dir = root.map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
    let applied = State::load(&root_dir)?.applied_serial;
    if check_local(&bundle, check, applied)? == Disposition::AlreadyApplied {
        log_info!(
            "serial {} is already applied; nothing to do",
            bundle.payload().freshness.serial
        );
        return Ok(String::new());
    }
    let options = Options {
        dry_run,
        strict_owner: root.is_none(),
        ..Options::new(root_dir.clone(), BootPhase::Complete)
    };
    let outcome = if root.is_some() || dry_run {
        let mut host = RecordingHost::new(&root_dir, !dry_run);
        let outcome = apply::apply(bundle.payload(), &options, &mut host, &Reporter::none())?;
        if dry_run {
            let mut text = describe_plan(&outcome);
            for action in &host.actions {
                text.push_str(&format!("   action {action}\n"));
            }
            return Ok(text);
        }
        outcome
    } else {
        let mut host = SystemHost::new(root_dir.clone(), Duration::from_secs(30));
        apply::apply(bundle.payload(), &options, &mut host, &Reporter::none())?
    };
    Ok(describe_plan(&outcome))
}

/// `prereqs --bundle FILE [--root DIR]`: artifacts (and packages, on a live system) only.
/// Freshness is not judged: nothing but the signed artifact list is used.
pub fn prereqs(path: &Path, keys: &Path, root: Option<&Path>) -> Result<(), AgentError> {
    let bytes = read_bundle(path)?;
    let bundle = verify(&bytes, &load_keyring(keys)?)?;
    let root_dir = root.map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
    let options = Options {
        strict_owner: root.is_none(),
        ..Options::new(root_dir.clone(), BootPhase::Complete)
    };
    let mut system = SystemHost::new(root_dir.clone(), Duration::from_secs(30));
    if root.is_some() {
        // Packages cannot be installed into a directory tree; an image build installs them.
        let names: Vec<&str> = bundle
            .payload()
            .packages
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        log_info!(
            "packages the image must provide (not installed under --root): {}",
            names.join(" ")
        );
        let state = State::load(&root_dir)?;
        // One artifact after another: nothing beside a download can abandon it.
        let never = std::sync::atomic::AtomicBool::new(false);
        for artifact in &bundle.payload().artifacts {
            if !apply::artifacts::is_installed(&root_dir, &state, artifact) {
                apply::artifacts::install(&root_dir, artifact, Duration::from_secs(300), &never)?;
            }
        }
        return Ok(());
    }
    apply::prerequisites(bundle.payload(), &options, &mut system)
}

/// `run`: the boot path. On a node that finished it, `run` looks for an update instead
/// ([`crate::sync::sync`]).
pub fn run(
    net: &NetConfig,
    keys: &Path,
    root: Option<&Path>,
    clock_skew_secs: i64,
) -> Result<(), AgentError> {
    let started_at = now();
    let root_dir = root.map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
    net.validate()?;
    if crate::state::is_done(&root_dir)? {
        log_info!(
            "{} exists: this node is bootstrapped; looking for an update instead",
            marker_path(&root_dir).display()
        );
        return crate::sync::sync(net, keys, root, clock_skew_secs);
    }
    let _lock = crate::state::lock(&root_dir)?;
    let keyring = load_keyring(keys)?;
    let (api, metadata) = clients(net)?;
    let identity = imds::identity(
        &metadata,
        &net.imds_url,
        Duration::from_secs(net.imds_timeout_secs),
    )?;
    log_info!("this machine is vm {}", identity.vm_id);
    // Made before the first fetch, which registers its public half for every later request.
    let node_key = nodekey::load_or_create(&root_dir)?;
    let reporter = Reporter::to(Target::Bootstrap {
        agent: &api,
        api_url: &net.api_url,
        identity: &identity,
    });
    let state = State::load(&root_dir)?;
    let check = |bytes: &[u8], nonce: &exk8s_common::names::Nonce| {
        verify(bytes, &keyring).and_then(|bundle| {
            let disposition = bundle.check_binding(&Expected {
                vm_id: identity.vm_id,
                nonce: Some(nonce),
                cluster_id: None,
                org_id: None,
                kind: Some(BundleKind::Bootstrap),
                now: started_at,
                clock_skew_secs,
                applied_serial: state.applied_serial,
            })?;
            Ok((bundle, disposition))
        })
    };
    // A failed attempt's bundle, still valid: the same certificates and files again.
    let resumed = match crate::resume::load(&root_dir)? {
        Some(kept) => match check(&kept.bytes, &kept.nonce) {
            Ok((bundle, Disposition::Apply)) => Some(bundle),
            Ok((_, Disposition::AlreadyApplied)) => {
                log_info!("the bundle a failed attempt kept is applied already; fetching afresh");
                crate::resume::forget(&root_dir)?;
                None
            }
            Err(e) => {
                log_info!(
                    "the bundle a failed attempt kept no longer serves ({e}); fetching afresh"
                );
                crate::resume::forget(&root_dir)?;
                None
            }
        },
        None => None,
    };
    let (bundle, disposition) = if let Some(bundle) = resumed {
        log_info!(
            "resuming with the bundle a failed attempt fetched (serial {}, valid until {})",
            bundle.payload().freshness.serial,
            bundle.payload().freshness.expires_at
        );
        reporter.report(
            BootPhase::Fetch,
            Phase::Succeeded,
            "resumed with the bundle the failed attempt fetched",
        );
        (bundle, Disposition::Apply)
    } else {
        let nonce = fetch::new_nonce()?;
        reporter.report(BootPhase::Fetch, Phase::Started, "");
        let bytes = fetch::bundle(
            &api,
            &net.api_url,
            &identity,
            &fetch::Credentials {
                nonce: &nonce,
                node_key: &node_key.public(),
            },
            Duration::from_secs(net.fetch_timeout_secs),
        )
        .inspect_err(|e| {
            reporter.report(BootPhase::Fetch, Phase::Failed, &crate::error::chain(e));
        })?;
        reporter.report(BootPhase::Fetch, Phase::Succeeded, "");
        match check(&bytes, &nonce) {
            Ok(ok) => {
                crate::resume::keep(&root_dir, &nonce, &bytes)?;
                ok
            }
            Err(e) => {
                reporter.report(BootPhase::Verify, Phase::Failed, &e.to_string());
                return Err(e.into());
            }
        }
    };
    let reporter = reporter.with_generation(bundle.payload().identity.generation);
    reporter.report(
        BootPhase::Verify,
        Phase::Succeeded,
        &format!(
            "serial {} signed by {}",
            bundle.payload().freshness.serial,
            bundle.key_id()
        ),
    );
    if disposition == Disposition::AlreadyApplied {
        log_info!(
            "serial {} is already applied; nothing to do",
            bundle.payload().freshness.serial
        );
        return Ok(());
    }
    apply_verified(
        &bundle,
        root,
        Options::new(root_dir.clone(), BootPhase::Complete),
        Duration::from_secs(net.request_timeout_secs),
        &reporter,
    )?;
    crate::resume::forget(&root_dir)
}

pub const DEFAULT_SKEW: i64 = DEFAULT_CLOCK_SKEW_SECS;
