//! Where the aggregation's records go: the collector (acknowledged HTTP export), Kafka,
//! standard output as JSON lines, or nowhere.

use crate::kafka_out::KafkaOut;
use std::io::Write;
use telemark_core::records::Record;
use telemark_transport::exporter::Exporter;

/// Where records go.
pub(crate) enum Out {
    Collector(Box<Exporter>),
    Kafka(Box<KafkaOut>),
    Stdout,
    Discard,
}

impl Out {
    /// Records lost on the way out so far: no room to hold them, or (Kafka) failed.
    pub(crate) fn dropped(&self) -> u64 {
        match self {
            Out::Collector(e) => e.dropped,
            Out::Kafka(k) => k.lost(),
            Out::Stdout | Out::Discard => 0,
        }
    }
}

/// Hands `r` on; false when it was dropped (no room).
pub(crate) fn emit(out: &mut Out, r: Record) -> bool {
    match out {
        Out::Collector(e) => e.push(r),
        Out::Kafka(k) => k.push(&r),
        Out::Discard => true,
        Out::Stdout => {
            if let Ok(s) = serde_json::to_string(&r) {
                let mut o = std::io::stdout().lock();
                let _ = writeln!(o, "{s}");
            }
            true
        }
    }
}
