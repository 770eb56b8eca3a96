//! The product binary carries no test kit: the synthetic traffic generator and its hidden
//! `merge --bench-generate` flag live in meshlab-testkit (a dev-dependency only).

use object::{Object, ObjectSymbol};

#[test]
fn the_meshlab_binary_contains_no_generator() {
    let path = env!("CARGO_BIN_EXE_meshlab");
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let file = object::File::parse(bytes.as_slice()).expect("an ELF binary");
    let symbols: Vec<&str> = file.symbols().filter_map(|s| s.name().ok()).collect();
    // Positive control: the scan sees the merge's own code, so an absence below means something.
    assert!(
        symbols
            .iter()
            .any(|s| s.contains("meshlab_user") && s.contains("pipeline")),
        "no merge symbols found in {path}: the binary is stripped and this check is blind"
    );
    let generator: Vec<&&str> = symbols
        .iter()
        .filter(|s| s.contains("synth") || s.contains("bench_generate") || s.contains("testkit"))
        .collect();
    assert!(
        generator.is_empty(),
        "generator symbols in {path}: {generator:?}"
    );
    let flag = b"bench-generate";
    assert!(
        !bytes.windows(flag.len()).any(|w| w == flag),
        "{path} still knows the --bench-generate flag"
    );
}
