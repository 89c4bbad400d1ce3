//! The API's secret files on disk: the KEK(s) and the bundle-signing key. Written 0600 and never
//! over an existing file; read only when no group or other permission is set, the way OpenSSH
//! treats private keys: a key others could have read is a key that may have leaked, and the
//! operator must hear about it before the service trusts it.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use exk8s_common::BundleSigner;
use zeroize::Zeroizing;

use crate::crypto::{Kek, Keyring};

/// Why a secret file was not used. Never carries the file's content.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} has mode {mode:04o}: a key file must not be readable or writable by group or \
         others (run `chmod 600 {path}`)"
    )]
    TooOpen { path: PathBuf, mode: u32 },
    #[error("{path} is not a regular file")]
    NotAFile { path: PathBuf },
    #[error("creating {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("at least one --kek-file is required")]
    NoKek,
}

/// Reads a secret file after checking that only its owner may read or write it.
pub fn read_secret(path: &Path) -> Result<Zeroizing<String>, KeyFileError> {
    let read = |source| KeyFileError::Read {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(read)?;
    // The mode is read from the open file, so the file checked is the file read.
    let meta = file.metadata().map_err(read)?;
    if !meta.is_file() {
        return Err(KeyFileError::NotAFile {
            path: path.to_owned(),
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    let mut text = Zeroizing::new(String::new());
    file.read_to_string(&mut text).map_err(read)?;
    Ok(text)
}

/// Writes a secret file with mode 0600, refusing to overwrite one.
pub fn write_secret(path: &Path, text: &str) -> Result<(), KeyFileError> {
    let create = |source| KeyFileError::Create {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(create)?;
    file.write_all(text.as_bytes()).map_err(create)?;
    file.sync_all().map_err(create)
}

/// Loads the KEK files; the first seals, all open.
pub fn load_keks(paths: &[PathBuf]) -> Result<Keyring, KeyFileError> {
    let keks = paths
        .iter()
        .map(|path| {
            let text = read_secret(path)?;
            Kek::from_file_text(&text, &path.display().to_string()).map_err(|e| {
                KeyFileError::Invalid {
                    path: path.clone(),
                    message: e.to_string(),
                }
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Keyring::new(keks).ok_or(KeyFileError::NoKek)
}

/// Loads the bundle-signing key.
pub fn load_signer(path: &Path) -> Result<BundleSigner, KeyFileError> {
    let text = read_secret(path)?;
    BundleSigner::from_secret_text(&text).map_err(|e| KeyFileError::Invalid {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn with_mode(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn key_files_open_to_group_or_others_are_refused_naming_file_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        let kek = Kek::generate_file_text("kek-1").unwrap();
        let signer = BundleSigner::generate().unwrap().to_secret_text();
        for mode in [0o644, 0o640, 0o604, 0o660, 0o602] {
            let path = with_mode(dir.path(), &format!("kek-{mode:o}.key"), &kek, mode);
            let error = load_keks(std::slice::from_ref(&path))
                .unwrap_err()
                .to_string();
            assert!(
                error.contains(&path.display().to_string())
                    && error.contains(&format!("{mode:04o}")),
                "{error}"
            );
            assert!(!error.contains(kek.trim()), "the key leaked into: {error}");
            let path = with_mode(dir.path(), &format!("sign-{mode:o}.key"), &signer, mode);
            let error = load_signer(&path).unwrap_err().to_string();
            assert!(error.contains(&format!("mode {mode:04o}")), "{error}");
        }
        for mode in [0o600, 0o400] {
            let path = with_mode(dir.path(), &format!("ok-kek-{mode:o}.key"), &kek, mode);
            load_keks(&[path]).unwrap();
            let path = with_mode(dir.path(), &format!("ok-sign-{mode:o}.key"), &signer, mode);
            load_signer(&path).unwrap();
        }
    }

    #[test]
    fn written_secrets_are_private_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        write_secret(&path, "one").unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(write_secret(&path, "two").is_err());
        assert_eq!(*read_secret(&path).unwrap(), "one");
    }
}
