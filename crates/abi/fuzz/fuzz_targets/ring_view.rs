//! Rings over arbitrary shared bytes: whatever a peer writes into a ring's place of an arena
//! chunk — header, indices, entries — and wherever a peer says a ring is, opening a view is
//! a value or a `RingError`, and every operation on a view (and on the daemon's end of a ring
//! whose bytes were overwritten) is a value or a `RingError`: never a panic, and (with `-a`)
//! no arithmetic overflow or out-of-ring slot.
#![no_main]

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use abi::arena::{RingArena, RingPlace};
use abi::ring::{Ring, Role};
use abi::shm::SharedMemory;
use libfuzzer_sys::fuzz_target;

/// Bytes of the parameters before the shared bytes.
const PARAMS: usize = 20;

fuzz_target!(|data: &[u8]| {
    if data.len() < PARAMS {
        return;
    }
    let (p, bytes) = data.split_at(PARAMS);
    let word = |i: usize| u64::from_le_bytes(p[i..i + 8].try_into().unwrap());
    let (raw_offset, raw_len) = (word(0), word(8));
    let capacity = 1u32 << (p[16] % 8);
    let entry = 8 * (1 + usize::from(p[17] % 80));
    let exact = p[18] & 1 != 0;
    let rounds = usize::from(p[19] % 40);

    // A client's view of a place a peer named, over bytes the peer wrote.
    let len = bytes.len().max(256);
    let mut mem = SharedMemory::create("fuzz-chunk", len).unwrap();
    let file = std::fs::File::from(mem.take_fd().unwrap());
    file.write_all_at(bytes, 0).unwrap();
    let mem = Arc::new(mem);
    let (offset, ring_len) = if exact {
        (raw_offset, raw_len)
    } else {
        // Mostly places inside the bytes, so that headers get read.
        (raw_offset % (len as u64 + 64), raw_len % (len as u64 + 64))
    };
    for role in [Role::Producer, Role::Consumer] {
        if let Ok(ring) = Ring::open_at(mem.clone(), offset, ring_len, role) {
            assert!(ring.capacity().is_power_of_two());
            exercise(ring, rounds);
        }
    }

    // The daemon's end of a ring whose bytes the client overwrote.
    let arena = RingArena::new(1 << 24);
    let Ok((ring, place)) = arena.create_ring(capacity, entry, Role::Consumer) else {
        return;
    };
    let RingPlace { chunk, offset, .. } = place;
    let chunk = std::fs::File::from(arena.chunk_fd(chunk).unwrap());
    chunk
        .write_all_at(&bytes[..bytes.len().min(place.len as usize)], offset)
        .unwrap();
    exercise(ring, rounds);
    let (producer, _) = arena.create_ring(capacity, entry, Role::Producer).unwrap();
    chunk.write_all_at(bytes, offset).unwrap();
    exercise(producer, rounds);
});

/// Every operation of a ring end, `rounds` times: errors are fine, panics are not.
fn exercise(mut ring: Ring, rounds: usize) {
    let mut out = vec![0u8; ring.entry_size()];
    let entry: Vec<u8> = (0..ring.entry_size()).map(|i| i as u8).collect();
    for _ in 0..rounds {
        let _ = ring.len();
        let _ = ring.is_empty();
        let _ = ring.free();
        let _ = ring.pop(&mut out);
        let _ = ring.push(&entry);
        // Batches: entries written or read now, published together.
        let _ = ring.take(&mut out);
        let _ = ring.stage(&entry);
        let _ = ring.stage(&entry);
        ring.publish();
        ring.set_backlog(true);
        let _ = ring.take_backlog();
        ring.set_backlog(false);
        ring.arm(rounds % 2 == 0);
        let _ = ring.arm_request();
    }
}
