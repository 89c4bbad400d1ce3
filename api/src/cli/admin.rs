//! `exk8s-api tokens`, `exk8s-api orgs` and `exk8s-api keys`: principal tokens (printed once,
//! stored hashed), an org's own settings, and the key files (written 0600, never over an
//! existing file).

use std::path::PathBuf;

use clap::Subcommand;
use exk8s_common::BundleSigner;

use super::{DbArgs, load_signer, parse_ttl, write_secret_file};
use crate::crypto::Kek;
use crate::db::{self, Db};
use crate::tokens::{self, Scope};

#[derive(Debug, Subcommand)]
pub(super) enum TokensCommand {
    /// Create a token and print it once.
    Create {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        org: i64,
        #[arg(long)]
        principal: String,
        #[arg(long, value_enum)]
        scope: Scope,
        /// Lifetime: seconds, or a number with s/m/h/d (e.g. 30d).
        #[arg(long, default_value = "30d")]
        ttl: String,
    },
    /// List tokens (never their values).
    List {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Revoke a token by id.
    Revoke {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        id: i64,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum OrgsCommand {
    /// Set an org's own settings (the API's hold for what it does not set).
    Set {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        org: i64,
        /// Days the org's deleted clusters are kept for recovery, instead of the API's
        /// --keep-deleted-days; 0 purges them at the reconciler's next pass. A cluster's time
        /// is fixed when it is deleted: this applies to later deletes.
        #[arg(long, value_parser = clap::value_parser!(u32).range(0..=3650))]
        keep_deleted_days: u32,
    },
    /// Forget an org's own settings: the API's hold again.
    Reset {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        org: i64,
    },
    /// List the orgs with settings of their own.
    List {
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum KeysCommand {
    /// Generate an ed25519 bundle-signing key (written 0600) and print its public line.
    Generate {
        /// Where to write it; never over an existing file. The packaged service reads
        /// /etc/exk8s/credentials/signing-key.
        #[arg(long)]
        out: PathBuf,
    },
    /// Print the `.pub` line agents trust for a signing key.
    Public {
        #[arg(long, env = "EXK8S_SIGNING_KEY")]
        signing_key: PathBuf,
    },
    /// Generate a key-encryption key file (written 0600). To rotate: serve with
    /// `--kek-file NEW,OLD` (NEW seals, both open), then drop OLD once re-sealed.
    GenerateKek {
        /// Where to write it; never over an existing file. The packaged service reads
        /// /etc/exk8s/credentials/kek.
        #[arg(long)]
        out: PathBuf,
        /// The KEK's id, stored beside every ciphertext it seals.
        #[arg(long, default_value = "kek-1")]
        id: String,
    },
}

#[allow(
    clippy::print_stdout,
    reason = "tokens and keys are the commands' output"
)]
pub(super) async fn tokens_command(command: TokensCommand) -> Result<(), String> {
    match command {
        TokensCommand::Create {
            db,
            org,
            principal,
            scope,
            ttl,
        } => {
            if org <= 0 {
                return Err("--org must be positive".into());
            }
            let ttl = parse_ttl(&ttl)?;
            let db = Db::connect(&db.url()?).map_err(|e| crate::error_chain(&e))?;
            db.migrate().await.map_err(|e| crate::error_chain(&e))?;
            let prefix = match scope {
                Scope::Operator => "exk8s_op",
                Scope::Bootstrap => "exk8s_bs",
            };
            let token = tokens::generate(prefix).map_err(|e| e.to_string())?;
            let now = db::now();
            let id = db::tokens::insert_api_token(
                &db.pool,
                &tokens::hash(&token),
                org,
                &principal,
                scope,
                now,
                now + ttl,
            )
            .await
            .map_err(|e| crate::error_chain(&e))?;
            eprintln!(
                "token {id} for {principal} (org {org}, {}) — shown once:",
                scope.as_str()
            );
            println!("{}", token.as_str());
            Ok(())
        }
        TokensCommand::List { db } => {
            let db = Db::connect(&db.url()?).map_err(|e| crate::error_chain(&e))?;
            let tokens = db::tokens::list_api_tokens(&db.pool)
                .await
                .map_err(|e| crate::error_chain(&e))?;
            println!("   id    org scope      expires_at          state principal");
            let now = db::now();
            for t in tokens {
                let state = if t.revoked {
                    "revoked"
                } else if t.expires_at <= now {
                    "expired"
                } else {
                    "active"
                };
                println!(
                    "{:>5} {:>6} {:<10} {:<12} {:>12} {}",
                    t.id,
                    t.org_id,
                    t.scope.as_str(),
                    t.expires_at,
                    state,
                    t.principal
                );
            }
            Ok(())
        }
        TokensCommand::Revoke { db, id } => {
            let db = Db::connect(&db.url()?).map_err(|e| crate::error_chain(&e))?;
            if db::tokens::revoke_api_token(&db.pool, id)
                .await
                .map_err(|e| crate::error_chain(&e))?
            {
                eprintln!("token {id} revoked");
                Ok(())
            } else {
                Err(format!("no token with id {id}"))
            }
        }
    }
}

#[allow(clippy::print_stdout, reason = "the settings are the list's output")]
pub(super) async fn orgs_command(command: OrgsCommand) -> Result<(), String> {
    let fail = |e: db::DbError| crate::error_chain(&e);
    match command {
        OrgsCommand::Set {
            db,
            org,
            keep_deleted_days,
        } => {
            let db = open_for_org(&db, org).await?;
            db::orgs::set_keep_deleted_days(&db.pool, org, keep_deleted_days, db::now())
                .await
                .map_err(fail)?;
            eprintln!("org {org}: its deleted clusters are kept {keep_deleted_days} days");
        }
        OrgsCommand::Reset { db, org } => {
            let db = open_for_org(&db, org).await?;
            if db::orgs::reset(&db.pool, org).await.map_err(fail)? {
                eprintln!("org {org}: the API's settings hold again");
            } else {
                eprintln!("org {org} had no settings of its own");
            }
        }
        OrgsCommand::List { db } => {
            let db = Db::connect(&db.url()?).map_err(|e| crate::error_chain(&e))?;
            println!("   org keep_deleted_days   updated_at");
            for o in db::orgs::list(&db.pool).await.map_err(fail)? {
                let days = o
                    .keep_deleted_days
                    .map_or_else(|| "api".to_owned(), |d| d.to_string());
                println!("{:>6} {:>17} {:>12}", o.org_id, days, o.updated_at);
            }
        }
    }
    Ok(())
}

/// The database, migrated, for a change to org `org` (which must be positive).
async fn open_for_org(db: &DbArgs, org: i64) -> Result<Db, String> {
    if org <= 0 {
        return Err("--org must be positive".into());
    }
    let db = Db::connect(&db.url()?).map_err(|e| crate::error_chain(&e))?;
    db.migrate().await.map_err(|e| crate::error_chain(&e))?;
    Ok(db)
}

#[allow(clippy::print_stdout, reason = "public keys are the commands' output")]
pub(super) fn keys_command(command: KeysCommand) -> Result<(), String> {
    match command {
        KeysCommand::Generate { out } => {
            let signer = BundleSigner::generate().map_err(|e| e.to_string())?;
            write_secret_file(&out, &signer.to_secret_text())?;
            eprintln!("wrote {} (key id {})", out.display(), signer.key_id());
            println!("{}", signer.pub_line("exk8s bundle signing key"));
            Ok(())
        }
        KeysCommand::Public { signing_key } => {
            println!(
                "{}",
                load_signer(&signing_key)?.pub_line("exk8s bundle signing key")
            );
            Ok(())
        }
        KeysCommand::GenerateKek { out, id } => {
            let text = Kek::generate_file_text(&id).map_err(|e| e.to_string())?;
            write_secret_file(&out, &text)?;
            eprintln!("wrote {} (KEK id {id})", out.display());
            Ok(())
        }
    }
}
