//! The k keys with the largest estimates seen so far: the heavy-hitter heap that sits beside a
//! sketch (UnivMon, NitroSketch). An offered key already held has its estimate raised; a new key
//! replaces the smallest held one if its estimate is larger.

use super::KeyBytes;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Top-k keys by estimate.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TopK {
    cap: usize,
    items: Vec<(KeyBytes, i64)>,
    #[serde(skip)]
    index: HashMap<KeyBytes, usize>,
    /// Position of the smallest held estimate, when known.
    #[serde(skip)]
    min_at: Option<usize>,
}

impl PartialEq for TopK {
    fn eq(&self, o: &TopK) -> bool {
        self.cap == o.cap && self.sorted() == o.sorted()
    }
}

impl TopK {
    /// Holds at most `cap` keys.
    pub fn new(cap: usize) -> TopK {
        TopK { cap, items: Vec::with_capacity(cap), ..TopK::default() }
    }

    /// How many keys it holds at most.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    fn reindex(&mut self) {
        if self.index.len() != self.items.len() {
            self.index = self.items.iter().enumerate().map(|(i, (k, _))| (*k, i)).collect();
        }
    }

    /// Offers `key` with estimate `est`.
    pub fn offer(&mut self, key: &KeyBytes, est: i64) {
        if self.cap == 0 {
            return;
        }
        self.reindex();
        if let Some(&i) = self.index.get(key) {
            self.items[i].1 = est;
            if self.min_at == Some(i) {
                self.min_at = None;
            }
            return;
        }
        if self.items.len() < self.cap {
            self.index.insert(*key, self.items.len());
            self.items.push((*key, est));
            self.min_at = None;
            return;
        }
        let m = match self.min_at {
            Some(m) => m,
            None => {
                let m = (0..self.items.len()).min_by_key(|i| self.items[*i].1).unwrap_or(0);
                self.min_at = Some(m);
                m
            }
        };
        if est > self.items[m].1 {
            self.index.remove(&self.items[m].0);
            self.items[m] = (*key, est);
            self.index.insert(*key, m);
            self.min_at = None;
        }
    }

    /// The held keys, largest estimate first.
    pub fn sorted(&self) -> Vec<(KeyBytes, i64)> {
        let mut v = self.items.clone();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// The held keys in no order.
    pub fn keys(&self) -> impl Iterator<Item = &KeyBytes> {
        self.items.iter().map(|(k, _)| k)
    }

    /// Forgets every key.
    pub fn clear(&mut self) {
        self.items.clear();
        self.index.clear();
        self.min_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_largest() {
        let mut t = TopK::new(3);
        for (i, e) in [5, 1, 9, 3, 7, 2, 8].iter().enumerate() {
            t.offer(&KeyBytes::from_slice(&[i as u8]).unwrap(), *e);
        }
        let got: Vec<i64> = t.sorted().iter().map(|(_, e)| *e).collect();
        assert_eq!(got, vec![9, 8, 7]);
        t.offer(&KeyBytes::from_slice(&[4]).unwrap(), 10); // key 4 (estimate 7) grows
        let got: Vec<i64> = t.sorted().iter().map(|(_, e)| *e).collect();
        assert_eq!(got, vec![10, 9, 8]);
    }
}
