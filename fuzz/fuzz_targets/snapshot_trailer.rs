#![no_main]
//! The snapshot trailer check over any bytes, fed in any chunking: its verdict is the one computed on the
//! whole stream at once, and a stream made valid from the bytes passes while any one flipped bit fails.

use std::path::Path;

use hostlet_controllers::snapshots::file::{TrailerCheck, TRAILER_LEN};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

fn checked(stream: &[u8], chunking: &[u8]) -> Option<u64> {
    let mut check = TrailerCheck::default();
    let mut rest = stream;
    let mut sizes = chunking.iter().cycle();
    while !rest.is_empty() {
        let n = (*sizes.next().unwrap_or(&255) as usize + 1).min(rest.len());
        check.update(&rest[..n]);
        rest = &rest[n..];
    }
    check.check(Path::new("fuzz")).ok()
}

fn whole(stream: &[u8]) -> Option<u64> {
    let n = stream.len();
    (n % 512 == TRAILER_LEN && Sha256::digest(&stream[..n - TRAILER_LEN]).as_slice() == &stream[n - TRAILER_LEN..])
        .then_some(n as u64)
}

fuzz_target!(|data: &[u8]| {
    let (chunking, body) = data.split_at(data.len().min(8));
    let chunking = if chunking.is_empty() { &[255u8][..] } else { chunking };
    assert_eq!(checked(body, chunking), whole(body));

    let mut good = body.to_vec();
    good.resize(body.len().div_ceil(512) * 512, 0);
    let hash = Sha256::digest(&good);
    good.extend_from_slice(&hash);
    assert_eq!(checked(&good, chunking), Some(good.len() as u64));
    let at = chunking[0] as usize * 131 % good.len();
    good[at] ^= 1 << (chunking[0] % 8);
    assert_eq!(checked(&good, chunking), None);
});
