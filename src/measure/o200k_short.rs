//! The layout of the short tokens' table build.rs writes (`o200k.short`) and
//! `measure/o200k.rs` reads in place from the executable, shared by both (build.rs includes
//! this file): an open-addressed table of [`SLOTS`] slots of [`SLOT_BYTES`] bytes, each a
//! token of at most 15 bytes packed as a little-endian `u128` (its bytes, zero-padded, its
//! length in the last byte; all zero for an empty slot, which no token packs to) followed by its
//! rank as a little-endian `u32`. A token sits in the first free slot from [`slot`] of its
//! packed value on (linear probing); about 37% of the slots are full, so a lookup, found or not,
//! reads one or two slots, mostly in one cache line.

/// log2 of [`SLOTS`].
pub const SLOT_BITS: u32 = 19;
/// Slots of the table.
pub const SLOTS: usize = 1 << SLOT_BITS;
/// Bytes of a slot: the packed token, then its rank.
pub const SLOT_BYTES: usize = 20;

/// The first slot probed for the packed token `packed`.
#[inline]
pub fn slot(packed: u128) -> usize {
    let lo = packed as u64;
    let hi = (packed >> 64) as u64;
    let mixed = (lo.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ hi).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (mixed >> (64 - SLOT_BITS)) as usize
}
