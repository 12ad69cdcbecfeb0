#![no_main]
//! Fuzz target: any text as an agent configuration file (TOML, watch rules, durations, port
//! pairs) is accepted or refused with an error, never a panic; what is accepted has a name the
//! collector accepts and a buffer of at least one record.
use libfuzzer_sys::fuzz_target;
use telemark_agent::FileConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(f) = FileConfig::parse(text) else { return };
    if let Ok(c) = f.validate() {
        assert!(!c.agent.is_empty() && c.agent.len() <= 64);
        assert!(c.buffer >= 1);
    }
});
