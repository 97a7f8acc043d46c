//! With the feature `clap` the CLI's value enums are these types, spelled as the geometry file,
//! `describe --json` and Python spell them (`layer_first`), with the dashed names the CLI
//! documented before (`layer-first`) accepted as aliases.
#![cfg(feature = "clap")]

use clap::ValueEnum;
use kvlayout_core::{Level, MemoryLayout};

#[test]
fn memory_layouts_take_the_file_names_and_the_old_dashed_ones() {
    for (file_name, dashed, want) in [
        ("layer_first", "layer-first", MemoryLayout::LayerFirst),
        ("page_first", "page-first", MemoryLayout::PageFirst),
        (
            "page_first_direct",
            "page-first-direct",
            MemoryLayout::PageFirstDirect,
        ),
        ("page_head", "page-head", MemoryLayout::PageHead),
        ("layer_head", "layer-head", MemoryLayout::LayerHead),
        (
            "page_head_token",
            "page-head-token",
            MemoryLayout::PageHeadToken,
        ),
    ] {
        assert_eq!(MemoryLayout::from_name(file_name), Some(want));
        assert_eq!(
            <MemoryLayout as ValueEnum>::from_str(file_name, false),
            Ok(want)
        );
        assert_eq!(
            <MemoryLayout as ValueEnum>::from_str(dashed, false),
            Ok(want)
        );
        // The name clap shows (in --help and its errors) is the file's.
        let shown = want.to_possible_value().expect("not hidden");
        assert_eq!(shown.get_name(), file_name);
    }
    assert!(<MemoryLayout as ValueEnum>::from_str("head_first", false).is_err());
    // page_unified takes heads_per_group, which a bare value cannot give: a geometry file does.
    assert!(<MemoryLayout as ValueEnum>::from_str("page_unified", false).is_err());
    assert_eq!(MemoryLayout::from_name("page_unified"), None);
    let unified = MemoryLayout::PageUnified { heads_per_group: 2 };
    assert_eq!(unified.to_possible_value(), None);
    assert_eq!(unified.name(), "page_unified");
}

#[test]
fn levels_take_their_names() {
    for (name, want) in [
        ("pool", Level::Pool),
        ("storage", Level::Storage),
        ("token", Level::Token),
    ] {
        assert_eq!(name.parse::<Level>(), Ok(want));
        assert_eq!(<Level as ValueEnum>::from_str(name, false), Ok(want));
    }
    assert!(<Level as ValueEnum>::from_str("page", false).is_err());
}
