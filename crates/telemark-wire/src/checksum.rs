//! Internet checksum (RFC 1071) and its incremental update (RFC 1624).

/// Ones'-complement sum of `data` folded into 16 bits (not inverted).
pub fn sum(data: &[u8]) -> u16 {
    let mut acc: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    fold(acc)
}

/// Folds a 32-bit accumulator into a 16-bit ones'-complement sum.
pub fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The checksum field value for `data` (the inverted sum).
pub fn checksum(data: &[u8]) -> u16 {
    !sum(data)
}

/// Incremental update of checksum `hc` when one 16-bit word changes from `old` to `new`.
///
/// RFC 1624, eqn. 3: `HC' = ~(~HC + ~m + m')`, which unlike eqn. 2 never yields 0xFFFF → 0x0000
/// errors for a header whose sum is zero.
pub fn update(hc: u16, old: u16, new: u16) -> u16 {
    let acc = u32::from(!hc) + u32::from(!old) + u32::from(new);
    !fold(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3 example bytes: sum 0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(sum(&data), 0xddf2);
    }

    #[test]
    fn incremental_matches_full() {
        let mut data = [0x45u8, 0x00, 0x00, 0x54, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11];
        let before = checksum(&data);
        let old = u16::from_be_bytes([data[0], data[1]]);
        data[1] = 0x04;
        let new = u16::from_be_bytes([data[0], data[1]]);
        assert_eq!(update(before, old, new), checksum(&data));
    }
}
