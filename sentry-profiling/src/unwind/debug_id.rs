//! Sentry's debug identifier for ELF files.

/// Derives Sentry's `debug_id` from a GNU build-id, as Sentry does for ELF:
/// the first 16 bytes (zero-padded) read as a GUID, so the first three fields
/// are byte-swapped on little-endian targets; printed as a lowercase UUID.
pub(crate) fn debug_id_from_build_id(build_id: &[u8]) -> String {
    let mut b = [0u8; 16];
    let n = build_id.len().min(16);
    b[..n].copy_from_slice(&build_id[..n]);
    if cfg!(target_endian = "little") {
        b[0..4].reverse();
        b[4..6].reverse();
        b[6..8].reverse();
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swaps_the_guid_fields() {
        let id: Vec<u8> = (0u8..20).collect();
        assert_eq!(
            debug_id_from_build_id(&id),
            "03020100-0504-0706-0809-0a0b0c0d0e0f"
        );
        assert_eq!(
            debug_id_from_build_id(&[0xab, 0xcd]),
            "0000cdab-0000-0000-0000-000000000000"
        );
    }
}
