#![no_main]
//! Any bytes as the value of a snapshot policy key or a snapshot request key, as the scheduler reads them:
//! decoding never panics, a decoded value written back as JSON decodes to itself, and a policy's schedule
//! (checked on decode) gives a next time after any instant.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hostlet_controllers::snapshots::policy::decode_policy;
use hostlet_controllers::snapshots::request::decode_request;
use hostlet_controllers::snapshots::schedule::Schedule;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = decode_policy("fuzz", data) {
        let json = serde_json::to_vec(&p).expect("a policy serialises");
        assert_eq!(decode_policy("fuzz", &json).ok().as_ref(), Some(&p));
        if let Some(s) = &p.schedule {
            let schedule = Schedule::parse(s).expect("decode checked the schedule");
            let at = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
            if let Some(next) = schedule.next_after(at) {
                assert!(next > at);
            }
            let _ = schedule.next_after(SystemTime::now());
        }
    }
    if let Ok(r) = decode_request("fuzz", data) {
        let json = serde_json::to_vec(&r).expect("a request serialises");
        assert_eq!(decode_request("fuzz", &json).ok().as_ref(), Some(&r));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Schedule::parse(text);
    }
});
