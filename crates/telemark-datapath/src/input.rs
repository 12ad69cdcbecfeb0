//! A capture as the replay commands read it: streamed one packet at a time, the packets of its
//! (first readable) link type, and an account of everything else.

use crate::capture::CaptureReader;
use crate::Pkt;
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::path::Path;
use telemark_core::records::CaptureRecord;
use telemark_wire::link::{linktype_name, LinkType, READABLE};

/// The input stopped at a damaged record: what was read was reported, but not the whole file.
/// `main` exits with status 3 on it.
#[derive(Debug, thiserror::Error)]
#[error("{0}: reading stopped at a damaged record ({1}); the results above cover what came before")]
pub struct Incomplete(pub String, pub String);

/// One capture, streamed.
pub struct Input {
    r: CaptureReader,
    /// The link type replayed: the first readable one in the file.
    pub link: LinkType,
    linktype: u32,
    first: Option<Pkt>,
    skipped: BTreeMap<String, u64>,
}

impl Input {
    /// Opens `path` and reads up to its first packet Telemark can replay. A capture with
    /// packets but none of a link type Telemark reads is an error naming the types it holds.
    pub fn open(path: &Path) -> Result<Input> {
        let mut r = CaptureReader::open(path)?;
        let mut unread: BTreeMap<u32, u64> = BTreeMap::new();
        let first = loop {
            match r.next_packet() {
                Some(p) => match p.link {
                    Some(link) => break Some((link, p.linktype, p.into_pkt())),
                    None => *unread.entry(p.linktype).or_default() += 1,
                },
                None => break None,
            }
        };
        let Some((link, linktype, first)) = first else {
            if !unread.is_empty() {
                let types: Vec<String> = unread
                    .iter()
                    .map(|(t, n)| format!("{} packets of {}", n, linktype_name(*t)))
                    .collect();
                bail!(
                    "{}: no packet of a link type Telemark reads ({}); it reads {READABLE}",
                    path.display(),
                    types.join(", ")
                );
            }
            if let Some(d) = &r.damage {
                bail!("{}: no packet could be read: {d}", path.display());
            }
            return Ok(Input {
                r,
                link: LinkType::Ethernet,
                linktype: 1,
                first: None,
                skipped: BTreeMap::new(),
            });
        };
        let n: u64 = unread.values().sum();
        let mut skipped = BTreeMap::new();
        if n > 0 {
            skipped.insert("unsupported_link".to_string(), n);
        }
        Ok(Input { r, link, linktype, first: Some(first), skipped })
    }

    /// The next packet of the replayed link type; packets of other link types are counted.
    pub fn next_packet(&mut self) -> Option<Pkt> {
        if let Some(p) = self.first.take() {
            return Some(p);
        }
        loop {
            let p = self.r.next_packet()?;
            match p.link {
                Some(l) if l == self.link => {
                    return Some(p.into_pkt());
                }
                Some(_) => self.skip("other_link", 1),
                None => self.skip("unsupported_link", 1),
            }
        }
    }

    /// Counts `n` packets not replayed for `reason`.
    pub fn skip(&mut self, reason: &str, n: u64) {
        match self.skipped.get_mut(reason) {
            Some(c) => *c += n,
            None if n > 0 => {
                self.skipped.insert(reason.to_string(), n);
            }
            None => {}
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        self.r.path()
    }

    /// What was read, as a record.
    pub fn record(&self) -> CaptureRecord {
        CaptureRecord {
            file: self.r.path().display().to_string(),
            link: linktype_name(self.linktype),
            packets: self.r.packets,
            cut: self.r.cut,
            skipped: self.skipped.clone(),
            complete: self.r.damage.is_none(),
            damaged: self.r.damage.as_ref().map(|d| d.to_string()),
        }
    }

    /// The skip reasons and counts, for text output.
    pub fn skipped(&self) -> &BTreeMap<String, u64> {
        &self.skipped
    }

    /// `Err(Incomplete)` when reading stopped at a damaged record.
    pub fn check_complete(&self) -> Result<()> {
        match &self.r.damage {
            Some(d) => Err(Incomplete(self.r.path().display().to_string(), d.to_string()).into()),
            None => Ok(()),
        }
    }

    /// Records read so far.
    pub fn packets(&self) -> u64 {
        self.r.packets
    }
}
