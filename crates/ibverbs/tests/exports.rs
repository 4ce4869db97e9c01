//! The library exports exactly the symbols the Debian programs import, each with its version
//! node, and carries the soname they ask for.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

/// `objdump -T lib`: the dynamic symbol table.
fn symbol_table(lib: &std::path::Path) -> String {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("objdump (binutils) runs");
    assert!(out.status.success(), "objdump failed on {}", lib.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn dynamic_exports(lib: &std::path::Path) -> BTreeSet<String> {
    symbol_table(lib)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // "<addr> g DF .text <size> <VERSION> <name>": defined globals only.
            if f.len() >= 6 && f[1] == "g" && f[3] != "*UND*" {
                let (ver, name) = (f[f.len() - 2], f[f.len() - 1]);
                Some(format!("{name}@({ver})"))
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn every_imported_symbol_is_exported_with_its_version_node_and_nothing_else() {
    let lib = common::built_library();
    let got = dynamic_exports(&lib);
    let crate_list = include_str!("../exports.txt");
    let want: BTreeSet<String> = crate_list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    // The 109 symbols of shared/abi plus the 18 more rdma-core's pyverbs imports,
    // ibv_init_ah_from_wc (Debian's libibverbs exports it beside ibv_create_ah_from_wc), and
    // the 13 of the private CM interface the drop-in librdmacm calls (SOFTRDMA_PRIVATE_1), and
    // the 3 `ibv_*_str` calls UCX's libuct_ib imports.
    assert_eq!(want.len(), 144);
    let missing: Vec<_> = want.difference(&got).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}\nunexpected {extra:?}"
    );
    // The shared measurement, when present, is covered.
    if let Ok(shared) = std::fs::read_to_string("/work/shared/abi/libibverbs-imports.txt") {
        let shared: BTreeSet<String> = shared
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
        let uncovered: Vec<_> = shared.difference(&want).collect();
        assert!(uncovered.is_empty(), "not in exports.txt: {uncovered:?}");
    }
}

/// `name@(NODE)` of each libibverbs symbol `lib` imports.
fn verbs_imports(lib: &std::path::Path) -> BTreeSet<String> {
    symbol_table(lib)
        .lines()
        .filter_map(|l| {
            // "<addr> DF *UND* <size> (<VERSION>) <name>".
            let f: Vec<&str> = l.split_whitespace().collect();
            let (ver, name) = (f.get(f.len().wrapping_sub(2))?, f.last()?);
            let ver = ver.trim_start_matches('(').trim_end_matches(')');
            (l.contains("*UND*") && ver.starts_with("IBVERBS_")).then(|| format!("{name}@({ver})"))
        })
        .collect()
}

#[test]
fn ucx_finds_every_verbs_call_it_imports() {
    // Debian's UCX binds its imports at load time: one missing symbol and `libuct_ib` fails
    // to load, or (lazily bound) the program dies on its first debug log line.
    let want: BTreeSet<String> = include_str!("../exports.txt")
        .lines()
        .map(str::trim)
        .map(String::from)
        .collect();
    let libs = ["libuct_ib.so.0", "libuct_rdmacm.so.0"]
        .map(|l| std::path::Path::new("/usr/lib/x86_64-linux-gnu/ucx").join(l));
    if !libs[0].exists() {
        eprintln!("skipped: UCX is not installed (apt-get install libucx0)");
        return;
    }
    for lib in libs.iter().filter(|l| l.exists()) {
        let imports = verbs_imports(lib);
        assert!(!imports.is_empty(), "{} imports no verbs", lib.display());
        let missing: Vec<_> = imports.difference(&want).collect();
        assert!(missing.is_empty(), "{} imports {missing:?}", lib.display());
    }
}

#[test]
fn the_soname_is_libibverbs_so_1() {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(common::built_library())
        .output()
        .expect("readelf runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Library soname: [libibverbs.so.1]"), "{text}");
}

#[test]
fn the_build_leaves_the_library_under_its_soname() {
    // build.rs (softrdma-dropin-build) links it.
    common::assert_left_under_soname("ibverbs");
}
