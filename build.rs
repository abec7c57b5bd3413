//! Writes the o200k_base vocabulary, read from tiktoken-rs, as a compact table the `bpe`
//! tokenizer loads at run time (`src/measure/o200k.rs`): building tiktoken-rs's own encoder
//! takes longer than the counting of a typical replay. Format: for each ordinary token in rank
//! order, its length as a little-endian `u16`, then its bytes. The tokens of at most 15 bytes
//! are also written as the lookup table `o200k.short` (layout: `src/measure/o200k_short.rs`),
//! read in place from the executable: no hash table to build at run time.

#[path = "src/measure/o200k_short.rs"]
mod o200k_short;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src/measure/o200k_short.rs");
    let core = tiktoken_rs::o200k_base().expect("tiktoken-rs builds o200k_base");
    let mut table = Vec::with_capacity(2 << 20);
    let mut rank = 0u32;
    let mut short = vec![0u8; o200k_short::SLOTS * o200k_short::SLOT_BYTES];
    // The ordinary tokens are ranked densely from 0; the first rank that does not decode, or
    // decodes to a special token, ends them.
    let specials: Vec<Vec<u8>> = core.special_tokens().into_iter().map(|s| s.as_bytes().to_vec()).collect();
    while let Ok(bytes) = core.decode_bytes(&[rank]) {
        if specials.contains(&bytes) {
            break;
        }
        let len = u16::try_from(bytes.len()).expect("a token is shorter than 64 KiB");
        table.extend_from_slice(&len.to_le_bytes());
        table.extend_from_slice(&bytes);
        if bytes.len() <= 15 {
            let mut packed = [0u8; 16];
            packed[..bytes.len()].copy_from_slice(&bytes);
            packed[15] = bytes.len() as u8;
            let key = u128::from_le_bytes(packed);
            let mut at = o200k_short::slot(key);
            loop {
                let entry = &mut short[at * o200k_short::SLOT_BYTES..(at + 1) * o200k_short::SLOT_BYTES];
                if entry[..16] == [0u8; 16] {
                    entry[..16].copy_from_slice(&packed);
                    entry[16..].copy_from_slice(&rank.to_le_bytes());
                    break;
                }
                assert_ne!(entry[..16], packed, "every token's bytes are distinct");
                at = (at + 1) % o200k_short::SLOTS;
            }
        }
        rank += 1;
    }
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("o200k.tokens"), &table).expect("OUT_DIR is writable");
    std::fs::write(out.join("o200k.short"), &short).expect("OUT_DIR is writable");
}
