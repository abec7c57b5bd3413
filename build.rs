//! Writes the o200k_base vocabulary, read from tiktoken-rs, as a compact table the `bpe`
//! tokenizer loads at run time (`src/measure/o200k.rs`): building tiktoken-rs's own encoder
//! takes longer than the counting of a typical replay. Format: for each ordinary token in rank
//! order, its length as a little-endian `u16`, then its bytes.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let core = tiktoken_rs::o200k_base().expect("tiktoken-rs builds o200k_base");
    let mut table = Vec::with_capacity(2 << 20);
    let mut rank = 0u32;
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
        rank += 1;
    }
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("o200k.tokens"), &table).expect("OUT_DIR is writable");
}
