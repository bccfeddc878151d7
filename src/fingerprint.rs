//! FNV-1a, 64 bits: a stable hash (the same on every build and machine) for the fingerprints the
//! ranks compare (AUTO's tables, a tuning file, the host name) and that tuning files record.

/// FNV-1a of `bytes`.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3))
}

#[cfg(test)]
mod tests {
    #[test]
    fn it_is_fnv_1a() {
        assert_eq!(super::fnv1a(b""), 0xcbf2_9ce4_8422_2325, "FNV-1a's offset basis");
        assert_eq!(super::fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c, "FNV-1a of 'a'");
    }
}
