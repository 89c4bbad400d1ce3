//! `exk8s-api tokens` and `exk8s-api keys`: principal tokens (printed once, stored hashed) and
//! the key files (written 0600, never over an existing file).

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
