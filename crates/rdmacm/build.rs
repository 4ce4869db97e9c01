//! Links `librdmacm.so.1`: its soname, and every export bound to the version node the
//! Debian programs import it with (`exports.txt`: what Debian's librdmacm.so.1 exports,
//! `objdump -T`).
//!
//! As for libibverbs (see crates/ibverbs/build.rs): rustc's lld ignores symbol patterns of
//! an extra `--version-script`, so each symbol is bound with `.symver name, name@@@NODE` in
//! a `global_asm!` the module defining it expands (`symver!(name, ...)`), and the map file
//! only declares the nodes, chained in version order as rdma-core's librdmacm.map does.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    let list = dir.join("exports.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    println!("cargo:rerun-if-changed=build.rs");
    let text = std::fs::read_to_string(&list).expect("exports.txt is part of the crate");

    let mut nodes: Vec<String> = Vec::new();
    let mut asm = String::from("macro_rules! symver {\n");
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (name, node) = line
            .split_once("@(")
            .and_then(|(n, v)| Some((n, v.strip_suffix(')')?)))
            .unwrap_or_else(|| panic!("bad line in exports.txt: {line}"));
        writeln!(
            asm,
            "    ({name}) => {{ core::arch::global_asm!(\".symver {name}, {name}@@@{node}\"); }};"
        )
        .expect("write to String");
        if !nodes.iter().any(|n| n == node) {
            nodes.push(node.to_string());
        }
    }
    asm.push_str("    ($($n:ident),+ $(,)?) => { $(symver!($n);)+ };\n}\n");
    std::fs::write(out.join("symver.rs"), asm).expect("write symver.rs");

    nodes.sort();
    let mut map = String::new();
    let mut prev: Option<&str> = None;
    for n in &nodes {
        match prev {
            Some(p) => writeln!(map, "{n} {{ }} {p};").expect("write to String"),
            None => writeln!(map, "{n} {{ }};").expect("write to String"),
        }
        prev = Some(n);
    }
    let map_path = out.join("librdmacm.map");
    std::fs::write(&map_path, map).expect("write librdmacm.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map_path.display()
    );
}
