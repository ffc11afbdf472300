//! Layout cases from the MIG issue, on the product table the simulator also answers from.

use super::*;
use crate::inventory::GpuInstance;
use crate::inventory::test_support::profiles;

fn wants(text: &str) -> Vec<Want> {
    // "3g.71gb x3 1g.18gb@6": a token "xN" repeats the one before it N times in all.
    let mut out: Vec<Want> = Vec::new();
    for token in text.split_whitespace() {
        match token.strip_prefix('x').and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => {
                let last = out.last().cloned().unwrap();
                out.extend(std::iter::repeat_n(last, n - 1));
            }
            None => {
                let parsed = crate::plan::parse::parse_mig_item(token).unwrap();
                out.push(Want { profile: parsed.profile, start: parsed.start });
            }
        }
    }
    out
}

fn layout_text(layout: &[Planned]) -> String {
    layout.iter().map(|p| format!("{}@{}", p.profile, p.start)).collect::<Vec<_>>().join(" ")
}

fn existing(product: &str, text: &str) -> Vec<GpuInstance> {
    let profiles = profiles(product);
    plan_layout("GPU", &profiles, &[], &wants(text))
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(i, p)| GpuInstance {
            id: i as u32 + 1,
            profile_id: p.profile_id,
            profile: p.profile,
            start: p.start,
            size: p.size,
            memory_mib: p.memory_mib,
            uuid: None,
        })
        .collect()
}

#[test]
fn invalid_layouts_name_the_profile_and_suggest_one_that_fits() {
    let cases = [
        (
            "h200",
            "3g.71gb x3",
            "3 x 3g.71gb requested, but NVIDIA H200 takes at most 2; a layout that fits: 3g.71gb 3g.71gb",
        ),
        (
            "h200",
            "4g.71gb 4g.71gb",
            "2 x 4g.71gb requested, but NVIDIA H200 takes at most 1; a layout that fits: 4g.71gb",
        ),
        (
            "h200",
            "1g.18gb x8",
            "8 x 1g.18gb requested, but NVIDIA H200 takes at most 7; a layout that fits: 1g.18gb 1g.18gb 1g.18gb 1g.18gb 1g.18gb 1g.18gb 1g.18gb",
        ),
        (
            "h200",
            "7g.141gb 1g.18gb",
            "the layout needs 8 compute slices and NVIDIA H200 has 7; a layout that fits: 7g.141gb",
        ),
        ("h200", "2g.35gb@1", "2g.35gb@1 is not a valid placement: 2g.35gb starts at 0, 2, 4"),
        (
            "h200",
            "1g.18gb+me x2",
            "1g.18gb+me asks for 2 media-extension (+me) instances, but a GPU has one media extension; a layout that fits: 1g.18gb+me",
        ),
        (
            "a30",
            "4g.24gb 1g.6gb",
            "the layout needs 5 compute slices and NVIDIA A30 has 4; a layout that fits: 4g.24gb",
        ),
        (
            "h200",
            "3g.40gb",
            "profile \"3g.40gb\" does not exist on NVIDIA H200; its profiles: 1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb",
        ),
        ("h200", "3g.71gb@0 2g.35gb@2", "2g.35gb@2 overlaps 3g.71gb@0"),
        (
            "h200",
            "4g.71gb 1g.35gb x3",
            "4g.71gb 1g.35gb 1g.35gb 1g.35gb cannot be placed together on NVIDIA H200; a layout that fits: 4g.71gb 1g.35gb 1g.35gb",
        ),
    ];
    for (product, text, want) in cases {
        let errors = plan_layout(&format!("NVIDIA {}", product.to_uppercase()), &profiles(product), &[], &wants(text))
            .unwrap_err();
        let messages: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
        assert!(messages.contains(&want), "{product} {text}: {messages:#?}");
    }
}

#[test]
fn placement_keeps_large_profiles_placeable() {
    // (wanted, layout chosen from an empty GPU)
    let cases = [
        // A lone 1g goes where it leaves both a 4g and a 3g possible? Only one of them can stay:
        // slot 6 leaves the 4g (slots 0-3), the larger profile.
        ("1g.18gb", "1g.18gb@6"),
        ("3g.71gb", "3g.71gb@4"),
        ("2g.35gb", "2g.35gb@4"),
        ("3g.71gb 1g.18gb", "1g.18gb@0 3g.71gb@4"),
        ("3g.71gb 3g.71gb", "3g.71gb@0 3g.71gb@4"),
        ("4g.71gb 3g.71gb", "4g.71gb@0 3g.71gb@4"),
        ("2g.35gb x3 1g.18gb", "2g.35gb@0 2g.35gb@2 2g.35gb@4 1g.18gb@6"),
        ("1g.18gb x7", "1g.18gb@0 1g.18gb@1 1g.18gb@2 1g.18gb@3 1g.18gb@4 1g.18gb@5 1g.18gb@6"),
        ("1g.35gb x4", "1g.35gb@0 1g.35gb@2 1g.35gb@4 1g.35gb@6"),
        ("7g.141gb", "7g.141gb@0"),
        ("1g.18gb@2", "1g.18gb@2"),
    ];
    for (text, want) in cases {
        let layout = plan_layout("H200", &profiles("h200"), &[], &wants(text)).unwrap();
        assert_eq!(layout_text(&layout), want, "{text}");
    }
    // Deterministic: the same answer every time.
    let a = plan_layout("H200", &profiles("h200"), &[], &wants("2g.35gb 1g.18gb 1g.18gb 3g.71gb")).unwrap();
    let b = plan_layout("H200", &profiles("h200"), &[], &wants("2g.35gb 1g.18gb 1g.18gb 3g.71gb")).unwrap();
    assert_eq!(a, b);
}

#[test]
fn existing_instances_stay_where_they_are() {
    // (existing layout, wanted, layout, instances kept)
    let cases = [
        // A 1g at slot 0 stays there even though a fresh placement would choose slot 6.
        ("1g.18gb@0", "1g.18gb 3g.71gb", "1g.18gb@0 3g.71gb@4", 1),
        ("3g.71gb@0", "3g.71gb", "3g.71gb@0", 1),
        // One changed instance on a GPU holding 7: six kept.
        (
            "1g.18gb x7",
            "1g.18gb x6 1g.18gb+me",
            "1g.18gb@0 1g.18gb@1 1g.18gb@2 1g.18gb@3 1g.18gb@4 1g.18gb@5 1g.18gb+me@6",
            6,
        ),
        // Growing 2g x2 to 2g x3 keeps both.
        ("2g.35gb@0 2g.35gb@2", "2g.35gb x3", "2g.35gb@0 2g.35gb@2 2g.35gb@4", 2),
        // A layout that cannot keep the old instance where it is moves it.
        ("1g.18gb@4", "4g.71gb 3g.71gb", "4g.71gb@0 3g.71gb@4", 0),
    ];
    for (before, text, want, kept) in cases {
        let existing = existing("h200", before);
        let layout = plan_layout("H200", &profiles("h200"), &existing, &wants(text)).unwrap();
        assert_eq!(layout_text(&layout), want, "{before} -> {text}");
        assert_eq!(layout.iter().filter(|p| p.existing.is_some()).count(), kept, "{before} -> {text}");
    }
}
