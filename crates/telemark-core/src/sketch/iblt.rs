//! Invertible Bloom Lookup Table (Goodrich & Mitzenmacher, "Invertible Bloom lookup tables",
//! Allerton 2011): a Bloom-filter-like table of key-value pairs that can list its contents.
//!
//! Every key lives in k cells, one in each of k equal sub-tables. A cell keeps how many keys it
//! holds, the XOR of their keys, the XOR of a check hash of their keys, and the sums of their
//! values (here packets and bytes, as SFCMon). A cell holding exactly one key ("pure": count ±1
//! and the check hash matches the key) gives that key and its values away; removing the key from
//! its other cells may make more cells pure ("peeling"). Listing succeeds with high probability
//! while the number of keys n stays below about m / c_k (c_3 ≈ 1.222, c_4 ≈ 1.295); past that,
//! peeling gets stuck and [`Listing::complete`] is false: the listed entries are correct but
//! others were not recovered, and the listing says so. It never returns a silently partial
//! answer.
//!
//! Keys are flow encodings ([`KeyBytes::flow_of`], [`KeyBytes::source_of`]): listing decodes a
//! pure cell's key sum back into one, which is also what rejects cells that only look pure.

use super::{Hasher, KeyBytes, MergeError, KEY_MAX};
use serde::{Deserialize, Serialize};

/// One cell's keys: written when a key is inserted or deleted, read when listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    count: i32,
    #[serde(with = "key_array")]
    key_sum: [u8; KEY_MAX],
    hash_sum: u32,
    base: u64,
}

/// One cell's values: written for every packet of a heavy flow. They are kept apart from the
/// 64-byte key cells so that the fast path's working set is 16 bytes a cell (6.7 KB for 420
/// cells, within L1) rather than 80.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Values {
    packets: u64,
    bytes: u64,
}

mod key_array {
    use super::KEY_MAX;
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(k: &[u8; KEY_MAX], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(k)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; KEY_MAX], D::Error> {
        let v: Vec<u8> = Deserialize::deserialize(d)?;
        v.try_into().map_err(|_| serde::de::Error::custom("IBLT key sum of the wrong length"))
    }
}

const EMPTY: Cell = Cell { count: 0, key_sum: [0; KEY_MAX], hash_sum: 0, base: 0 };

/// One listed key with its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: KeyBytes,
    /// Sum of packets added for it.
    pub packets: u64,
    /// Sum of bytes added for it.
    pub bytes: u64,
    /// The value given at insertion ([`Iblt::insert_with_base`]; 0 otherwise).
    pub base: u64,
}

/// The result of listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Keys recovered, with their values.
    pub entries: Vec<Entry>,
    /// Keys found deleted more often than inserted (a caller's inconsistency).
    pub negative: Vec<KeyBytes>,
    /// Whether everything in the table was recovered.
    pub complete: bool,
    /// Cells left non-empty when peeling stopped (0 when complete).
    pub stuck_cells: usize,
}

/// An IBLT with packet and byte values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Shape")]
pub struct Iblt {
    cells: Vec<Cell>,
    values: Vec<Values>,
    k: usize,
    sub: usize,
    hasher: Hasher,
}

/// An [`Iblt`] as read from outside, checked before use: a table whose arrays disagree with its
/// shape would index out of bounds.
#[derive(Deserialize)]
struct Shape {
    cells: Vec<Cell>,
    values: Vec<Values>,
    k: usize,
    sub: usize,
    hasher: Hasher,
}

impl TryFrom<Shape> for Iblt {
    type Error = String;
    fn try_from(s: Shape) -> Result<Iblt, String> {
        let n = s.sub.checked_mul(s.k);
        if !(2..=8).contains(&s.k) || s.sub == 0 {
            return Err(format!("IBLT with k = {} and {} cells per sub-table", s.k, s.sub));
        }
        if n != Some(s.cells.len()) || n != Some(s.values.len()) {
            return Err(format!(
                "IBLT of {} × {} cells holds {} key cells and {} value cells",
                s.k,
                s.sub,
                s.cells.len(),
                s.values.len()
            ));
        }
        Ok(Iblt { cells: s.cells, values: s.values, k: s.k, sub: s.sub, hasher: s.hasher })
    }
}

impl Iblt {
    /// About `m` cells (rounded up to a multiple of `k`), `k` (2..=8) cells per key.
    pub fn new(m: usize, k: usize, hasher: Hasher) -> Iblt {
        let k = k.clamp(2, 8);
        let sub = m.div_ceil(k).max(1);
        Iblt {
            cells: vec![EMPTY; sub * k],
            values: vec![Values::default(); sub * k],
            k,
            sub,
            hasher,
        }
    }

    /// Cells.
    pub fn cells(&self) -> usize {
        self.cells.len()
    }

    /// Bytes of state.
    pub fn memory(&self) -> usize {
        self.cells.len() * (core::mem::size_of::<Cell>() + core::mem::size_of::<Values>())
    }

    /// Keys it can list with high probability: m / c_k.
    pub fn capacity(&self) -> usize {
        let c = match self.k {
            2 => 2.0,
            3 => 1.222,
            4 => 1.295,
            5 => 1.425,
            6 => 1.570,
            7 => 1.721,
            _ => 1.87,
        };
        (self.cells.len() as f64 / c) as usize
    }

    /// Cells per key.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The hasher.
    pub fn hasher(&self) -> &Hasher {
        &self.hasher
    }

    fn is_empty(&self, i: usize) -> bool {
        self.cells[i] == EMPTY && self.values[i] == Values::default()
    }

    #[inline]
    fn slots(&self, key: &[u8]) -> [usize; 8] {
        let mut h = [0u32; 8];
        self.hasher.rows(key, &mut h[..self.k]);
        self.slots_hashed(&h)
    }

    #[inline]
    fn slots_hashed(&self, rows: &[u32]) -> [usize; 8] {
        let mut out = [0usize; 8];
        for (i, (o, h)) in out.iter_mut().zip(&rows[..self.k]).enumerate() {
            *o = i * self.sub + super::column(*h, self.sub);
        }
        out
    }

    fn check(&self, key: &[u8]) -> u32 {
        super::murmur3_32(key, self.hasher.seed ^ 0xc4ec_4a51)
    }

    fn toggle(&mut self, key: &KeyBytes, dc: i32) {
        let check = self.check(key.as_bytes());
        for s in &self.slots(key.as_bytes())[..self.k] {
            let c = &mut self.cells[*s];
            c.count = c.count.wrapping_add(dc);
            for (a, b) in c.key_sum.iter_mut().zip(key.padded()) {
                *a ^= b;
            }
            c.hash_sum ^= check;
        }
    }

    /// Adds `key` (with no values yet).
    pub fn insert(&mut self, key: &KeyBytes) {
        self.toggle(key, 1);
    }

    /// Adds `key` with a value fixed at insertion (SFCMon: the source's count before the flow
    /// was admitted), listed back as [`Entry::base`].
    pub fn insert_with_base(&mut self, key: &KeyBytes, base: u64) {
        self.toggle(key, 1);
        self.add_values(key, 0, 0, base);
    }

    /// Removes `key` and the values given (which must be all its values for it to disappear).
    pub fn delete(&mut self, key: &KeyBytes, packets: u64, bytes: u64) {
        self.delete_with_base(key, packets, bytes, 0);
    }

    /// Removes `key` inserted with `base`, and its values.
    pub fn delete_with_base(&mut self, key: &KeyBytes, packets: u64, bytes: u64, base: u64) {
        self.toggle(key, -1);
        self.add_values(key, packets.wrapping_neg(), bytes.wrapping_neg(), base.wrapping_neg());
    }

    /// Adds values to an inserted `key` (SFCMon's UpdateIBLT).
    #[inline]
    pub fn update(&mut self, key: &KeyBytes, packets: u64, bytes: u64) {
        let mut h = [0u32; 8];
        self.hasher.rows(key.as_bytes(), &mut h[..self.k]);
        self.update_hashed(&h, packets, bytes);
    }

    /// [`Iblt::update`] of a key whose row hashes (`self.hasher().rows`, at least `k` of them)
    /// the caller already has.
    #[inline]
    pub fn update_hashed(&mut self, rows: &[u32], packets: u64, bytes: u64) {
        for s in &self.slots_hashed(rows)[..self.k] {
            let v = &mut self.values[*s];
            v.packets = v.packets.wrapping_add(packets);
            v.bytes = v.bytes.wrapping_add(bytes);
        }
    }

    fn add_values(&mut self, key: &KeyBytes, packets: u64, bytes: u64, base: u64) {
        for s in &self.slots(key.as_bytes())[..self.k] {
            let v = &mut self.values[*s];
            v.packets = v.packets.wrapping_add(packets);
            v.bytes = v.bytes.wrapping_add(bytes);
            let c = &mut self.cells[*s];
            c.base = c.base.wrapping_add(base);
        }
    }

    /// The values of `key` if one of its cells is pure (None: absent or cannot tell).
    pub fn get(&self, key: &KeyBytes) -> Option<(u64, u64)> {
        let check = self.check(key.as_bytes());
        for s in &self.slots(key.as_bytes())[..self.k] {
            if self.is_empty(*s) {
                return None;
            }
            let (c, v) = (&self.cells[*s], &self.values[*s]);
            if c.count == 1 && c.hash_sum == check && &c.key_sum == key.padded() {
                return Some((v.packets, v.bytes));
            }
        }
        None
    }

    /// Lists every key with its values by peeling (on a copy; the table is unchanged).
    pub fn list(&self) -> Listing {
        let mut t = self.clone();
        let mut entries = Vec::new();
        let mut negative = Vec::new();
        let mut queue: Vec<usize> = (0..t.cells.len()).collect();
        while let Some(i) = queue.pop() {
            let (c, v) = (t.cells[i], t.values[i]);
            if c.count != 1 && c.count != -1 {
                continue;
            }
            let Some(key) = KeyBytes::from_padded(&c.key_sum) else { continue };
            if t.check(key.as_bytes()) != c.hash_sum {
                continue;
            }
            let slots = t.slots(key.as_bytes());
            if !slots[..t.k].contains(&i) {
                continue; // a coincidence, not this key's cell
            }
            if c.count == 1 {
                entries.push(Entry { key, packets: v.packets, bytes: v.bytes, base: c.base });
                t.delete_with_base(&key, v.packets, v.bytes, c.base);
            } else {
                negative.push(key);
                t.toggle(&key, 1);
                t.add_values(
                    &key,
                    v.packets.wrapping_neg(),
                    v.bytes.wrapping_neg(),
                    c.base.wrapping_neg(),
                );
            }
            queue.extend_from_slice(&slots[..t.k]);
        }
        let stuck_cells = (0..t.cells.len()).filter(|i| !t.is_empty(*i)).count();
        entries.sort_by(|a, b| b.packets.cmp(&a.packets).then(a.key.cmp(&b.key)));
        Listing { entries, negative, complete: stuck_cells == 0, stuck_cells }
    }

    /// Adds `other` cell by cell: the table of the union of two disjoint key sets (a key in both
    /// cancels out of the keys but not out of the values, so merge tables of disjoint keys, e.g.
    /// different agents' flows, or subtract with [`Iblt::subtract`]).
    pub fn merge(&mut self, other: &Iblt) -> Result<(), MergeError> {
        self.combine(other, 1)
    }

    /// Subtracts `other` cell by cell: listing the result gives keys only in `self` (count 1) and
    /// only in `other` (listed as negative).
    pub fn subtract(&mut self, other: &Iblt) -> Result<(), MergeError> {
        self.combine(other, -1)
    }

    fn combine(&mut self, other: &Iblt, sign: i32) -> Result<(), MergeError> {
        if (self.cells.len(), self.k, self.hasher) != (other.cells.len(), other.k, other.hasher) {
            return Err(MergeError::Shape("IBLT size, k or hasher differ"));
        }
        // Values add or subtract as two's complement: sign is ±1.
        let mul = |x: u64| if sign > 0 { x } else { x.wrapping_neg() };
        for (a, b) in self.cells.iter_mut().zip(&other.cells) {
            a.count = a.count.wrapping_add(sign.wrapping_mul(b.count));
            for (x, y) in a.key_sum.iter_mut().zip(&b.key_sum) {
                *x ^= y;
            }
            a.hash_sum ^= b.hash_sum;
            a.base = a.base.wrapping_add(mul(b.base));
        }
        for (a, b) in self.values.iter_mut().zip(&other.values) {
            a.packets = a.packets.wrapping_add(mul(b.packets));
            a.bytes = a.bytes.wrapping_add(mul(b.bytes));
        }
        Ok(())
    }

    /// Empties the table.
    pub fn clear(&mut self) {
        self.cells.fill(EMPTY);
        self.values.fill(Values::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::{IpAddr, Ipv4Addr};
    use std::collections::BTreeMap;
    use telemark_wire::FlowKey;

    fn flow(i: u32) -> KeyBytes {
        KeyBytes::flow_of(&FlowKey {
            src: IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9)),
            sport: (i % 60_000) as u16,
            dport: 443,
            proto: 6,
            spi: None,
            si: None,
        })
    }

    fn fill(t: &mut Iblt, keys: std::ops::Range<u32>) -> BTreeMap<KeyBytes, (u64, u64)> {
        let mut truth = BTreeMap::new();
        for i in keys {
            let k = flow(i);
            t.insert(&k);
            for p in 0..=(i % 7) {
                t.update(&k, 1, 100 + u64::from(p));
                let e = truth.entry(k).or_insert((0, 0));
                e.0 += 1;
                e.1 += 100 + u64::from(p);
            }
        }
        truth
    }

    fn listed(l: &Listing) -> BTreeMap<KeyBytes, (u64, u64)> {
        l.entries.iter().map(|e| (e.key, (e.packets, e.bytes))).collect()
    }

    #[test]
    fn lists_everything_below_capacity() {
        for seed in 0..20 {
            let mut t = Iblt::new(245, 3, Hasher::new(crate::sketch::Hashing::Murmur3, seed));
            let truth = fill(&mut t, seed * 1000..seed * 1000 + 150);
            let l = t.list();
            assert!(l.complete, "seed {seed}: {} stuck", l.stuck_cells);
            assert_eq!(listed(&l), truth);
            for (k, v) in truth.iter().take(10) {
                assert!(t.get(k).is_none_or(|got| got == *v));
            }
        }
    }

    #[test]
    fn overload_is_reported_never_silently_partial() {
        let mut t = Iblt::new(245, 3, Hasher::default());
        let truth = fill(&mut t, 0..400);
        let l = t.list();
        assert!(!l.complete);
        assert!(l.stuck_cells > 0);
        // What was listed is right.
        for e in &l.entries {
            assert_eq!(truth.get(&e.key), Some(&(e.packets, e.bytes)));
        }
        assert!(l.entries.len() < truth.len());
    }

    #[test]
    fn delete_and_subtract() {
        let h = Hasher::default();
        let mut a = Iblt::new(300, 4, h);
        let truth = fill(&mut a, 0..100);
        for (k, (p, b)) in truth.iter().take(40) {
            a.delete(k, *p, *b);
        }
        let l = a.list();
        assert!(l.complete);
        assert_eq!(listed(&l), truth.iter().skip(40).map(|(k, v)| (*k, *v)).collect());

        let (mut x, mut y) = (Iblt::new(300, 3, h), Iblt::new(300, 3, h));
        fill(&mut x, 0..60);
        fill(&mut y, 50..70);
        x.subtract(&y).unwrap();
        let l = x.list();
        assert!(l.complete);
        assert_eq!(l.entries.len(), 50); // 0..50 only in x
        assert_eq!(l.negative.len(), 10); // 60..70 only in y
    }

    #[test]
    fn merge_of_disjoint_tables_lists_the_union_and_survives_serde() {
        let h = Hasher::default();
        let (mut a, mut b) = (Iblt::new(400, 3, h), Iblt::new(400, 3, h));
        let mut truth = fill(&mut a, 0..100);
        truth.extend(fill(&mut b, 100..200));
        a.merge(&b).unwrap();
        let a: Iblt = serde_json::from_slice(&serde_json::to_vec(&a).unwrap()).unwrap();
        let l = a.list();
        assert!(l.complete);
        assert_eq!(listed(&l), truth);
    }

    #[test]
    fn a_serialised_table_of_the_wrong_shape_is_refused() {
        let t = Iblt::new(30, 3, Hasher::default());
        let mut v = serde_json::to_value(&t).unwrap();
        v["values"].as_array_mut().unwrap().pop();
        let e = serde_json::from_value::<Iblt>(v).unwrap_err().to_string();
        assert!(e.contains("30 key cells and 29 value cells"), "{e}");
        let mut v = serde_json::to_value(&t).unwrap();
        v["k"] = 9.into();
        assert!(serde_json::from_value::<Iblt>(v).is_err());
    }
}
