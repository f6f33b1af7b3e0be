#![no_main]
//! Any text as a cluster token (`--token`, `<data-dir>/token`, the join endpoint's header): parsing never
//! panics, a parsed token prints back to itself and accepts itself, and a token never accepts a different
//! secret.

use hostlet_controllers::pki::ClusterToken;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The first line is a token, the rest what a client presents.
    let (mine, presented) = text.split_once('\n').unwrap_or((text, ""));
    let Ok(t) = ClusterToken::parse(mine) else {
        let _ = ClusterToken::parse(presented);
        return;
    };
    let printed = t.to_string();
    assert_eq!(ClusterToken::parse(&printed).as_ref(), Ok(&t));
    assert!(t.accepts(&printed));
    assert!(t.accepts(&t.secret));
    if let Ok(p) = ClusterToken::parse(presented) {
        if t.accepts(presented) {
            assert_eq!(p.secret, t.secret);
        }
    }
});
