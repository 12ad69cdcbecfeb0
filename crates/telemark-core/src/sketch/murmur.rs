//! MurmurHash3, x86 32-bit variant (Austin Appleby's public-domain design), the hash SFCMon
//! uses for its Count-Min sketch, Bloom filter and IBLT. Written from the algorithm's
//! description; the tests check it against outputs of the reference implementation.

const C1: u32 = 0xcc9e_2d51;
const C2: u32 = 0x1b87_3593;

/// The 32-bit finaliser ("fmix32"): every input bit affects every output bit.
#[inline(always)]
pub fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

#[inline(always)]
fn scramble(k: u32) -> u32 {
    k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2)
}

/// MurmurHash3_x86_32 of `data` with `seed`.
#[inline]
pub fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    let mut h = seed;
    let mut blocks = data.chunks_exact(4);
    for b in &mut blocks {
        let k = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        h ^= scramble(k);
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut k = 0u32;
        for (i, b) in tail.iter().enumerate() {
            k |= u32::from(*b) << (8 * i);
        }
        h ^= scramble(k);
    }
    fmix32(h ^ data.len() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected values computed with the `mmh3` Python package (a binding of the reference C++
    /// code), covering every tail length.
    #[test]
    fn matches_the_reference() {
        let range: Vec<u8> = (0..37).collect();
        let cases: [(&[u8], u32, u32); 10] = [
            (b"", 0, 0),
            (b"", 1, 0x514e_28b7),
            (b"a", 0, 0x3c25_69b2),
            (b"ab", 7, 0xfe2a_26ff),
            (b"abc", 0, 0xb3dd_93fa),
            (b"abcd", 0, 0x43ed_676a),
            (b"hello", 0, 0x248b_fa47),
            (b"The quick brown fox jumps over the lazy dog", 0, 0x2e4f_f723),
            (&range, 0x9747_b28c, 0xdeb4_6200),
            (&range[..13], 3, 0x1bb1_03dd),
        ];
        for (data, seed, want) in cases {
            assert_eq!(murmur3_32(data, seed), want, "{data:?} seed {seed:#x}");
        }
    }
}
