//! TFRecord framing, the container of TensorBoard event files: each record is its length (u64, little
//! endian), a masked CRC32C of those 8 bytes, the payload, and a masked CRC32C of the payload. Also the
//! reader of such frames, for tests and for checking a file.

use anyhow::{Result, bail};

/// CRC-32C (Castagnoli), the checksum TFRecord uses.
const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// Added after rotating, so that a CRC of data that itself holds CRCs does not come out degenerate.
const MASK_DELTA: u32 = 0xa282_ead8;

pub fn crc32c(bytes: &[u8]) -> u32 {
    CRC32C.checksum(bytes)
}

/// The masked CRC32C TFRecord stores: rotated right by 15 bits, plus [`MASK_DELTA`].
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    crc32c(bytes).rotate_right(15).wrapping_add(MASK_DELTA)
}

/// One record holding `payload`.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let length = (payload.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(payload.len() + 16);
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&masked_crc32c(payload).to_le_bytes());
    out
}

/// The payloads of the records in `bytes`, every checksum verified. A truncated last record (a writer
/// that died mid-write) or a wrong checksum is an error naming the record's offset.
pub fn unframe(bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut payloads = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let Some(header) = bytes.get(at..at + 12) else { bail!("record at byte {at}: truncated header") };
        let (length, length_crc) = header.split_at(8);
        if masked_crc32c(length) != u32::from_le_bytes(length_crc.try_into()?) {
            bail!("record at byte {at}: the length's checksum does not match");
        }
        let length_bytes = usize::try_from(u64::from_le_bytes(length.try_into()?))?;
        let start = at + 12;
        let end = start.checked_add(length_bytes).filter(|e| e.checked_add(4).is_some_and(|f| f <= bytes.len()));
        let Some(end) = end else { bail!("record at byte {at}: truncated payload ({length_bytes} bytes announced)") };
        let payload = &bytes[start..end];
        if masked_crc32c(payload) != u32::from_le_bytes(bytes[end..end + 4].try_into()?) {
            bail!("record at byte {at}: the payload's checksum does not match");
        }
        payloads.push(payload.to_vec());
        at = end + 4;
    }
    Ok(payloads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_of_the_standard_check_string() {
        // The catalogue's check value for CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    // The formula spelled out as TFRecord's description gives it, to check `rotate_right` against.
    #[allow(clippy::manual_rotate)]
    fn masking_rotates_and_adds_the_delta() {
        let crc = crc32c(b"123456789");
        assert_eq!(masked_crc32c(b"123456789"), ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8));
    }

    #[test]
    fn frames_round_trip_and_damage_is_caught() {
        let payloads: Vec<Vec<u8>> = vec![b"brain.Event:2".to_vec(), Vec::new(), (0..=255u8).collect()];
        let bytes: Vec<u8> = payloads.iter().flat_map(|p| frame(p)).collect();
        assert_eq!(bytes.len(), payloads.iter().map(|p| p.len() + 16).sum::<usize>());
        assert_eq!(unframe(&bytes).unwrap(), payloads);
        // A record cut short, and one bit flipped in a payload.
        assert!(unframe(&bytes[..bytes.len() - 1]).unwrap_err().to_string().contains("truncated"));
        let mut flipped = bytes.clone();
        flipped[14] ^= 1;
        assert!(unframe(&flipped).unwrap_err().to_string().contains("checksum"));
    }
}
