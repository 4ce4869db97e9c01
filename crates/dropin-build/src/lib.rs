//! What the build scripts of the drop-in libraries (`libibverbs.so.1`, `librdmacm.so.1`)
//! share: binding every export to the version node Debian's programs import it with, the
//! soname, and the library left under that soname beside the file cargo links.
//!
//! rustc's lld ignores symbol patterns of an extra `--version-script` (rustc passes its own),
//! so each symbol is bound to its node with `.symver name, name@@@NODE` in `global_asm!`,
//! and the map file only declares the nodes. A `.symver` only acts on a symbol defined in the
//! same object file, i.e. the same codegen unit, so the generated `symver.rs` defines a
//! macro, `symver!(name, ...)`, that each module invokes for the symbols it defines (rustc
//! keeps a module's items and its `global_asm!` in one codegen unit). A name missing from
//! `exports.txt` does not compile.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Run from a drop-in's build script: reads the crate's `exports.txt` (`name@(NODE)` per
/// line), writes `$OUT_DIR/symver.rs` and the version map, and links the cdylib as
/// `lib{name}.so.1` (`name`: `ibverbs`, `rdmacm`). Public nodes chain in version order, as
/// rdma-core's map files do; private nodes (`*_PRIVATE_*`) stand alone.
pub fn drop_in(name: &str) {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    let list = dir.join("exports.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    println!("cargo:rerun-if-changed=build.rs");
    let text = std::fs::read_to_string(&list).expect("exports.txt is part of the crate");

    let mut nodes: Vec<String> = Vec::new();
    let mut asm = String::from("macro_rules! symver {\n");
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (sym, node) = line
            .split_once("@(")
            .and_then(|(n, v)| Some((n, v.strip_suffix(')')?)))
            .unwrap_or_else(|| panic!("bad line in exports.txt: {line}"));
        writeln!(
            asm,
            "    ({sym}) => {{ core::arch::global_asm!(\".symver {sym}, {sym}@@@{node}\"); }};"
        )
        .expect("write to String");
        if !nodes.iter().any(|n| n == node) {
            nodes.push(node.to_string());
        }
    }
    asm.push_str("    ($($n:ident),+ $(,)?) => { $(symver!($n);)+ };\n}\n");
    std::fs::write(out.join("symver.rs"), asm).expect("write symver.rs");

    nodes.sort_by_key(|n| version_key(n));
    let mut map = String::new();
    let mut prev: Option<&str> = None;
    for n in &nodes {
        if n.contains("_PRIVATE_") {
            writeln!(map, "{n} {{ }};").expect("write to String");
            continue;
        }
        match prev {
            Some(p) => writeln!(map, "{n} {{ }} {p};").expect("write to String"),
            None => writeln!(map, "{n} {{ }};").expect("write to String"),
        }
        prev = Some(n);
    }
    let (file, soname) = (format!("lib{name}.so"), format!("lib{name}.so.1"));
    let map_path = out.join(format!("lib{name}.map"));
    std::fs::write(&map_path, map).expect("write the version map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map_path.display()
    );
    link_soname(&out, &file, &soname);
}

/// `IBVERBS_1.10` -> (1, 10), after `IBVERBS_1.9`; a node without a version sorts last.
fn version_key(node: &str) -> (u32, u32) {
    let v = node.rsplit_once('_').map_or(node, |(_, v)| v);
    match v.split_once('.') {
        Some((a, b)) => (a.parse().unwrap_or(0), b.parse().unwrap_or(0)),
        None => (u32::MAX, 0),
    }
}

/// Leaves the library under its soname (`libibverbs.so.1` -> `libibverbs.so`) in the two folders
/// cargo puts it: the profile's (`target/<profile>`, where `cargo build -p` copies it) and
/// its `deps` (where it is linked, and the only fresh copy when it was built as a
/// dependency, e.g. for another crate's tests). Programs load the soname; cargo cannot name a
/// cdylib so, and without the link every user would make it by hand.
///
/// The link is relative, so it follows the target folder when that moves, and it is made
/// before the library is linked (a build script runs first): until then it dangles. Cargo
/// has no hook after linking, and the folders above OUT_DIR are the only ones a build script
/// knows; a layout other than `<profile>/build/<pkg>-<hash>/out` gets a warning, no link.
fn link_soname(out: &Path, file: &str, soname: &str) {
    let profile = out
        .parent()
        .and_then(Path::parent)
        .filter(|b| b.file_name().is_some_and(|n| n == "build"))
        .and_then(Path::parent);
    let Some(profile) = profile else {
        println!(
            "cargo:warning=OUT_DIR {} is not under <profile>/build: {soname} not linked",
            out.display()
        );
        return;
    };
    for dir in [profile.to_path_buf(), profile.join("deps")] {
        let link = dir.join(soname);
        if std::fs::read_link(&link).is_ok_and(|t| t == Path::new(file)) {
            continue;
        }
        // A new link under a name of this process, renamed over the old one: builds running
        // side by side, and programs loading the library meanwhile, never find it missing.
        let tmp = dir.join(format!(".{soname}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let made = std::fs::create_dir_all(&dir)
            .and_then(|()| std::os::unix::fs::symlink(file, &tmp))
            .and_then(|()| std::fs::rename(&tmp, &link));
        if let Err(e) = made {
            let _ = std::fs::remove_file(&tmp);
            println!(
                "cargo:warning=cannot link {} -> {file}: {e}",
                link.display()
            );
        }
    }
}
