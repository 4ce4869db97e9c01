//! The library exports exactly the symbols of Debian's librdmacm.so.1, each with its
//! version node, and carries the soname programs ask for.

#[path = "../../ibverbs/tests/common/mod.rs"]
mod common;
mod rdmacm_lib;

use std::collections::BTreeSet;
use std::process::Command;

/// `name@(NODE)` of every defined dynamic symbol (not the version nodes' own `*ABS*`
/// symbols, which GNU ld emits and lld does not).
fn dynamic_exports(lib: &std::path::Path) -> BTreeSet<String> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("objdump (binutils) runs");
    assert!(out.status.success(), "objdump failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() >= 6 && f[1] == "g" && f[3] != "*UND*" && f[3] != "*ABS*" {
                Some(format!("{}@({})", f[f.len() - 1], f[f.len() - 2]))
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn every_symbol_of_debians_librdmacm_is_exported_with_its_version_node_and_nothing_else() {
    let got = dynamic_exports(&rdmacm_lib::built());
    let want: BTreeSet<String> = include_str!("../exports.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    // rdma-core 44's librdmacm.map: 41 rdma_* calls and 27 rsockets calls.
    assert_eq!(want.len(), 68);
    let missing: Vec<_> = want.difference(&got).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}\nunexpected {extra:?}"
    );
    // Debian's own library, when installed, exports the same list.
    let debian = std::path::Path::new("/usr/lib/x86_64-linux-gnu/librdmacm.so.1");
    if debian.exists() {
        let theirs = dynamic_exports(debian);
        let uncovered: Vec<_> = theirs.difference(&want).collect();
        assert!(uncovered.is_empty(), "not in exports.txt: {uncovered:?}");
    }
}

#[test]
fn the_soname_is_librdmacm_so_1() {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(rdmacm_lib::built())
        .output()
        .expect("readelf runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Library soname: [librdmacm.so.1]"), "{text}");
}

#[test]
fn the_build_leaves_the_library_under_its_soname() {
    // build.rs (softrdma-dropin-build) links it.
    common::assert_left_under_soname("rdmacm");
}
