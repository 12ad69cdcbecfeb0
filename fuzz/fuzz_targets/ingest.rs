#![no_main]
//! Fuzz target: any bytes posted to the collector (registration, ingest, queries) are answered
//! with a status, never a panic; a request refused (4xx) stores nothing, and an ingest answered
//! 200 stored at most as many records as it sent. The collector runs on an in-memory database
//! with no tokens, as a loopback collector does.
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, RwLock};
use telemark_collector::api::{Api, Request};
use telemark_collector::ingest::Ingest;
use telemark_collector::store::Store;

const NOW: u64 = 1_790_000_000_000_000_000;

fuzz_target!(|data: &[u8]| {
    let Ok(store) = Store::open(std::path::Path::new(":memory:")) else { return };
    let api = Api {
        ingest: Arc::new(Ingest::new(store)),
        readers: Default::default(),
        stale_ns: 15_000_000_000,
        auth: RwLock::new(None),
        transport: Arc::new(Default::default()),
        kafka: Arc::new(Default::default()),
        flows: Arc::new(Default::default()),
        steering: None,
    };
    let reg = br#"{"agent":"sw-b","version":"1","boot":1}"#;
    let r = api.handle(&Request { method: "POST", url: "/api/v1/agents", token: None, body: reg }, NOW);
    assert_eq!(r.status, 200);
    // The first byte picks the route; the rest is the body, or the query string.
    let Some((&pick, rest)) = data.split_first() else { return };
    let before = api.store().counts().unwrap();
    let r = match pick % 3 {
        0 => api.handle(&Request { method: "POST", url: "/api/v1/ingest", token: None, body: rest }, NOW),
        1 => api.handle(&Request { method: "POST", url: "/api/v1/agents", token: None, body: rest }, NOW),
        _ => {
            let q = String::from_utf8_lossy(rest);
            let url = format!("/api/v1/{}", q);
            api.handle(&Request::get(&url), NOW)
        }
    };
    assert!((200..600).contains(&r.status));
    let after = api.store().counts().unwrap();
    if r.status != 200 {
        assert_eq!(before, after, "a refused request stored something");
    }
    if pick % 3 == 0 && r.status == 200 {
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let sent = v["accepted"].as_u64().unwrap() + v["duplicates"].as_u64().unwrap();
        assert!(after.0 + after.1 - before.0 - before.1 <= sent);
    }
});
