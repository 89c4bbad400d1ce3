//! Where a bundle's fresh leaf keys are made ([`KeyMaker`]): in this process, or — for RSA-3072
//! and RSA-4096, in the server — in a helper process that can be killed midway.
//!
//! An RSA-4096 key takes up to seconds of one core, and aws-lc cannot be interrupted while it
//! searches for primes. A bundle whose client has gone stops before its next key, but the key
//! already being made would keep its core busy to the end. In a helper process it does not: the
//! helper is this same binary's hidden `keygen` command ([`write_helper_key`]), which writes one
//! PKCS #8 key to a pipe and exits; the parent polls it and kills it as soon as `stop` says so.
//!
//! A helper costs about 25 ms of CPU before its first prime (most of it aws-lc seeding its
//! random generator from CPU jitter), against 0.2–1.5 s for an RSA-4096 key but only ~40 ms for
//! an RSA-2048 one: RSA-2048 and ECDSA keys are made in this process, where an abandoned one
//! finishes within a tenth of a second anyway.
//!
//! The helper starts with an empty environment (it needs nothing, and must not inherit the
//! server's secrets), and its key crosses only an anonymous pipe into zeroized memory.
//! Should a helper fail to start (a process limit, say), the key is made in this process instead
//! and the reason logged: the helper exists to let keys be abandoned, never to refuse them.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rcgen::{KeyPair, PublicKeyData};
use rustls_pki_types::PrivatePkcs8KeyDer;
use zeroize::Zeroizing;

use super::{KeyAlgorithm, LeafKey, PkiError};

/// The hidden subcommand a helper process runs.
pub const HELPER_COMMAND: &str = "keygen";

/// How often a waiting parent looks at its helper and at `stop`. An RSA-2048 key takes tens
/// of milliseconds, an RSA-4096 key up to seconds: a few milliseconds of latency is noise.
const POLL: Duration = Duration::from_millis(4);

/// How fresh leaf keys are made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeyMaker {
    /// Every key in this process (tests, tools): a key being made is finished even if nobody
    /// waits for it.
    #[default]
    InProcess,
    /// RSA-3072 and RSA-4096 keys in a helper process running `<program> keygen <algorithm>`,
    /// killed when its bundle is abandoned; quicker keys in this process.
    Helper(PathBuf),
}

impl KeyMaker {
    /// This very executable as the helper (`/proc/self/exe`: still the running build when the
    /// file on disk has been replaced by an upgrade).
    pub fn this_binary() -> Self {
        Self::Helper(PathBuf::from("/proc/self/exe"))
    }

    /// One key of `algorithm`; [`PkiError::Stopped`] (and the helper killed) as soon as `stop`
    /// says nobody waits for it.
    pub fn make(
        &self,
        algorithm: KeyAlgorithm,
        stop: &dyn Fn() -> bool,
    ) -> Result<LeafKey, PkiError> {
        match self {
            Self::Helper(program) if worth_a_helper(algorithm) => {
                match Helper::start(program, algorithm) {
                    Ok(helper) => helper.finish(stop),
                    Err(e) => {
                        tracing::warn!(program = %program.display(), error = %e, %algorithm, "the key helper did not start; making the key in this process");
                        LeafKey::generate(algorithm)
                    }
                }
            }
            _ => LeafKey::generate(algorithm),
        }
    }
}

/// Whether a key of `algorithm` takes long enough to be worth a killable helper.
fn worth_a_helper(algorithm: KeyAlgorithm) -> bool {
    matches!(algorithm, KeyAlgorithm::Rsa3072 | KeyAlgorithm::Rsa4096)
}

/// A running helper, killed and reaped if dropped before it finished.
struct Helper {
    child: Child,
    algorithm: KeyAlgorithm,
}

impl Helper {
    fn start(program: &std::path::Path, algorithm: KeyAlgorithm) -> std::io::Result<Self> {
        let child = Command::new(program)
            .arg(HELPER_COMMAND)
            .arg(algorithm.as_str())
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        Ok(Self { child, algorithm })
    }

    /// Waits for the key, looking at `stop` every [`POLL`].
    fn finish(mut self, stop: &dyn Fn() -> bool) -> Result<LeafKey, PkiError> {
        let status = loop {
            if let Some(status) = self
                .child
                .try_wait()
                .map_err(|e| failed(self.algorithm, e))?
            {
                break status;
            }
            if stop() {
                return Err(PkiError::Stopped); // Drop kills and reaps the helper.
            }
            std::thread::sleep(POLL);
        };
        let mut der = Zeroizing::new(Vec::with_capacity(4096));
        if let Some(out) = self.child.stdout.as_mut() {
            out.read_to_end(&mut der)
                .map_err(|e| failed(self.algorithm, e))?;
        }
        if !status.success() {
            let mut said = String::new();
            if let Some(err) = self.child.stderr.as_mut() {
                let _ = err.take(512).read_to_string(&mut said);
            }
            return Err(failed(
                self.algorithm,
                format!("it exited with {status}: {}", said.trim()),
            ));
        }
        let pair = KeyPair::from_pkcs8_der_and_sign_algo(
            &PrivatePkcs8KeyDer::from(der.as_slice()),
            self.algorithm.signature_algorithm(),
        )
        .map_err(|e| failed(self.algorithm, format!("its key does not load: {e}")))?;
        if rsa_bits(&pair) != rsa_bits_of(self.algorithm) {
            return Err(failed(self.algorithm, "its key is not of that size"));
        }
        Ok(LeafKey::from_pair(self.algorithm, pair))
    }
}

fn failed(algorithm: KeyAlgorithm, reason: impl std::fmt::Display) -> PkiError {
    PkiError::KeyHelper {
        algorithm,
        reason: reason.to_string(),
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The modulus size `algorithm` asks for (None for ECDSA).
fn rsa_bits_of(algorithm: KeyAlgorithm) -> Option<usize> {
    match algorithm {
        KeyAlgorithm::Rsa2048 => Some(2048),
        KeyAlgorithm::Rsa3072 => Some(3072),
        KeyAlgorithm::Rsa4096 => Some(4096),
        KeyAlgorithm::EcdsaP256 | KeyAlgorithm::EcdsaP384 => None,
    }
}

/// The modulus size of an RSA key pair (None for any other key).
fn rsa_bits(pair: &KeyPair) -> Option<usize> {
    use x509_parser::prelude::FromDer;
    use x509_parser::public_key::PublicKey;
    let der = pair.subject_public_key_info();
    let (_, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(&der).ok()?;
    match spki.parsed() {
        Ok(PublicKey::RSA(rsa)) => Some(rsa.key_size()),
        _ => None,
    }
}

/// The helper's side: makes one `algorithm` key in this process and writes it to `out` as
/// PKCS #8 DER (the `keygen` command never writes it to a terminal).
pub fn write_helper_key(algorithm: &str, out: &mut dyn Write) -> Result<(), String> {
    let algorithm: KeyAlgorithm = algorithm.parse().map_err(|e: PkiError| e.to_string())?;
    let key = LeafKey::generate(algorithm).map_err(|e| crate::error_chain(&e))?;
    let der = Zeroizing::new(key.pair().serialize_der());
    out.write_all(&der)
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing the key: {e}"))
}
