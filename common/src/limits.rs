//! Size limits every bundle consumer enforces before it reads further, and a bounded reader
//! that enforces them on a stream (a 1 GiB response must fail early with bounded memory).

use std::io::Read;

/// Largest envelope accepted, in bytes (the whole JSON document).
pub const MAX_ENVELOPE_BYTES: u64 = 4 * 1024 * 1024;
/// Most files one bundle may carry.
pub const MAX_FILES: usize = 512;
/// Largest single file content, in bytes (after base64 decoding).
pub const MAX_FILE_BYTES: usize = 1024 * 1024;
/// Most artifacts, packages, plan steps and signatures a bundle may carry.
pub const MAX_ARTIFACTS: usize = 64;
pub const MAX_PACKAGES: usize = 64;
pub const MAX_PLAN_STEPS: usize = 128;
pub const MAX_SIGNATURES: usize = 8;

/// The longest base64 text (standard alphabet, padded) that can decode to `max_bytes`.
pub const fn base64_len_for(max_bytes: usize) -> usize {
    max_bytes.div_ceil(3) * 4
}

/// Reading more than a limit allows.
#[derive(Debug, thiserror::Error)]
pub enum ReadLimitError {
    #[error("input exceeds the {limit}-byte limit")]
    TooLarge { limit: u64 },
    #[error("reading input")]
    Io(#[source] std::io::Error),
}

/// Reads `reader` to its end, refusing (without buffering the excess) anything over `limit` bytes.
pub fn read_bounded(reader: impl Read, limit: u64) -> Result<Vec<u8>, ReadLimitError> {
    let mut buf = Vec::new();
    let read = reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(ReadLimitError::Io)?;
    if read as u64 > limit {
        return Err(ReadLimitError::TooLarge { limit });
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_bound_is_tight() {
        assert_eq!(base64_len_for(3), 4);
        assert_eq!(base64_len_for(4), 8);
        assert_eq!(base64_len_for(MAX_FILE_BYTES), 1_398_104);
    }

    #[test]
    fn read_bounded_stops_one_byte_past_the_limit() {
        let endless = std::io::repeat(7);
        let err = read_bounded(endless, 1024).unwrap_err();
        assert!(matches!(err, ReadLimitError::TooLarge { limit: 1024 }));
        assert_eq!(read_bounded(&[1u8; 1024][..], 1024).unwrap().len(), 1024);
    }
}
