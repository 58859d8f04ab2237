//! Tests of `matmul_coop_template`: the candidates, their names, and what the renderings hold.

use super::*;

#[test]
fn candidates_are_valid_distinct_and_named_reversibly() {
    for coop in [8, 16] {
        let candidates = CoopTile::candidates(coop);
        for (i, t) in candidates.iter().enumerate() {
            t.check().unwrap_or_else(|e| panic!("{}: {e}", t.name()));
            assert_eq!(CoopTile::parse(&t.name()).unwrap(), *t);
            assert!(candidates[..i].iter().all(|u| u != t), "{} listed twice", t.name());
            assert!(t.workgroup_bytes() <= 48 * 1024 || coop == 8, "{} needs {} bytes", t.name(), t.workgroup_bytes());
        }
        assert_eq!(candidates[0], CoopTile::default_for(coop));
    }
    let count = |loads| CoopTile::candidates(16).iter().filter(|t| t.loads == loads).count();
    assert_eq!(CoopTile::candidates(16).len(), 23);
    assert_eq!((count(Loads::Precast), count(Loads::Direct), count(Loads::Wide)), (4, 5, 7));
    let with = |loads| CoopTile { loads, ..CoopTile::default_for(16) };
    assert_eq!(CoopTile::parse("c16/128x128x32/2x4/256/pc").unwrap(), with(Loads::Precast));
    assert_eq!(CoopTile::parse("c16/128x128x32/2x4/256/dg").unwrap(), with(Loads::Direct));
    assert_eq!(CoopTile::parse("c16/128x128x32/2x4/256/ws").unwrap(), with(Loads::Wide));
    // A direct variant holds only the epilogue's slots in workgroup memory, a wide one the staged tiles.
    assert_eq!(with(Loads::Direct).workgroup_bytes(), 9 * 256 * 4 + 16);
    assert_eq!(with(Loads::Wide).workgroup_bytes(), CoopTile::default_for(16).workgroup_bytes());
    // The kernel as it was before variants, byte for byte in workgroup memory.
    assert_eq!(CoopTile::default_for(16).name(), "c16/128x128x32/2x4/256");
    assert_eq!(CoopTile::default_for(16).workgroup_bytes(), 128 * 40 * 2 + 32 * 136 * 2 + 9 * 256 * 4 + 16);
    assert_eq!(CoopTile::default_for(8).name(), "c8/128x128x32/4x8/256");
}

#[test]
fn bad_variants_are_refused_by_name() {
    for (name, why) in [
        ("c16/128x128x32/2x4", "expected the form"),
        ("c12/128x128x32/2x4/256", "8 or 16"),
        ("c16/128x128x24/2x4/256", "multiple of 16"),
        ("c16/100x128x32/2x4/256", "whole number of 32x64 regions"),
        ("c8/128x128x32/8x8/256", "1 to 32"),
        ("c16/128x128x32/2x4/96", "invocations"),
        ("c8/8x8x8/1x1/256", "whole number per invocation"),
        ("c16/128x128x32/2x4/256/pd", "expected the form"),
        ("c16/128x128x32/2x4/256/pc/dg", "expected the form"),
        ("c16/4294967295x128x32/2x4/256", "out of range"),
    ] {
        let e = CoopTile::parse(name).unwrap_err();
        assert!(e.contains(why) && e.contains(name), "{name}: {e}");
    }
}

/// The default's rendering keeps the hand-written kernel's structure: 8 accumulators, 2 + 4 fragments
/// and 8 multiply-adds per block, 16 staged elements of each operand.
#[test]
fn default_rendering_has_the_expected_shape() {
    let src = CoopTile::default_for(16).source();
    assert!(!src.contains("{{"), "a hole left unfilled");
    assert_eq!(src.matches("= coop_mat16x16<f32, C>()").count(), 8);
    assert_eq!(src.matches("= coopMultiplyAdd(").count(), 8);
    assert_eq!(src.matches("coopLoadT<coop_mat16x16<f16, A>>").count(), 2);
    assert_eq!(src.matches("coopLoadT<coop_mat16x16<f16, B>>").count(), 4);
    assert_eq!(src.matches("store_half(staged_").count(), 32);
    assert!(src.contains("var staged_a15 = ") && !src.contains("staged_a16"));
    assert!(src.contains("@workgroup_size(256, 1, 1)"));
    let direct = CoopTile { loads: Loads::Direct, ..CoopTile::default_for(16) }.source();
    assert!(!direct.contains("{{"), "a hole left unfilled");
    assert!(!direct.contains("var<workgroup> tile_halves") && !direct.contains("fn f16_bits"), "the direct kernel stages nothing");
    // Per step of 32: two blocks of 2 + 4 fragments, then 2 x 8 multiply-adds; per tail block one of each.
    assert_eq!(direct.matches("coopLoadT<coop_mat16x16<f16, A>>").count(), 2 * 2 + 2);
    assert_eq!(direct.matches("coopLoadT<coop_mat16x16<f16, B>>").count(), 2 * 4 + 4);
    assert_eq!(direct.matches("= coopMultiplyAdd(").count(), 16 + 8);
    // Wide staging: 2 + 2 chunks of 8 halves per invocation and step, the staged multiply-adds.
    let wide = CoopTile { loads: Loads::Wide, ..CoopTile::default_for(16) }.source();
    assert!(!wide.contains("{{"), "a hole left unfilled");
    assert_eq!(wide.matches("var chunk_").count(), 4);
    assert_eq!(wide.matches("store_a8(").count() + wide.matches("store_b8(").count(), 4 + 2);
    assert_eq!(wide.matches("= coopMultiplyAdd(").count(), 8);
    let eight = CoopTile::default_for(8).source();
    assert_eq!(eight.matches("= coopMultiplyAdd(").count(), 32);
    assert!(eight.contains("coop_mat8x8<f16, A>"));
}
