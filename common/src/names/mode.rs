//! File permission modes, written in bundles as four octal digits (`"0644"`).
//!
//! A bundle never needs setuid, setgid or sticky bits, nor files others may write, so those are
//! refused outright rather than trusted to the signer.

use std::fmt;

use super::shown;

/// Why a mode was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModeError {
    #[error("mode `{0}` is not four octal digits like \"0644\"")]
    NotOctal(String),
    #[error("mode {0:04o} sets setuid, setgid or sticky bits")]
    SpecialBits(u32),
    #[error("mode {0:04o} lets group or others write")]
    GroupOrWorldWritable(u32),
}

/// A permission mode without special bits and without group/other write.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileMode(u32);

impl FileMode {
    /// Private keys and kubeconfigs.
    pub const SECRET: Self = Self(0o600);
    /// Certificates and configuration.
    pub const PUBLIC: Self = Self(0o644);
    /// Executables.
    pub const EXECUTABLE: Self = Self(0o755);

    pub fn from_bits(bits: u32) -> Result<Self, ModeError> {
        if bits > 0o7777 {
            return Err(ModeError::NotOctal(format!("{bits:o}")));
        }
        if bits & 0o7000 != 0 {
            return Err(ModeError::SpecialBits(bits));
        }
        if bits & 0o022 != 0 {
            return Err(ModeError::GroupOrWorldWritable(bits));
        }
        Ok(Self(bits))
    }

    pub fn bits(self) -> u32 {
        self.0
    }

    /// True when nobody but the owner may read.
    pub fn is_private(self) -> bool {
        self.0 & 0o077 == 0
    }
}

impl std::str::FromStr for FileMode {
    type Err = ModeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 4 || !s.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
            return Err(ModeError::NotOctal(shown(s)));
        }
        let bits = u32::from_str_radix(s, 8).map_err(|_| ModeError::NotOctal(shown(s)))?;
        Self::from_bits(bits)
    }
}

impl fmt::Display for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl fmt::Debug for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileMode({:04o})", self.0)
    }
}

impl serde::Serialize for FileMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for FileMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        raw.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_four_octal_digits() {
        for s in ["0600", "0644", "0755", "0700", "0400", "0640"] {
            let m: FileMode = s.parse().unwrap();
            assert_eq!(m.to_string(), s);
        }
        assert!(FileMode::SECRET.is_private());
        assert!(!FileMode::PUBLIC.is_private());
    }

    #[test]
    fn refuses_bad_modes() {
        for s in ["644", "00644", "0x644", "0800", "", "-644", "06 4"] {
            assert!(
                matches!(s.parse::<FileMode>(), Err(ModeError::NotOctal(_))),
                "{s}"
            );
        }
        for s in ["4755", "2755", "1755"] {
            assert!(
                matches!(s.parse::<FileMode>(), Err(ModeError::SpecialBits(_))),
                "{s}"
            );
        }
        for s in ["0666", "0664", "0777", "0646"] {
            assert!(
                matches!(
                    s.parse::<FileMode>(),
                    Err(ModeError::GroupOrWorldWritable(_))
                ),
                "{s}"
            );
        }
    }
}
