//! Where the tests find the built `librdmacm.so`, and the folder that holds both drop-ins
//! under their sonames.

#![allow(dead_code)]

use std::path::PathBuf;

/// The built `librdmacm.so`: the newest of target/<profile>/librdmacm.so (`cargo build`)
/// and target/<profile>/deps/librdmacm.so (what `cargo test` builds).
pub fn built() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let profile_dir = deps.parent().expect("target/<profile>");
    [profile_dir.join("librdmacm.so"), deps.join("librdmacm.so")]
        .into_iter()
        .filter_map(|p| {
            let t = std::fs::metadata(&p).and_then(|m| m.modified()).ok()?;
            Some((t, p))
        })
        .max()
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("librdmacm.so not built under {}", profile_dir.display()))
}

/// Put `librdmacm.so.1` beside the test's `libibverbs.so.1` (the folder the verbs test
/// helpers point `LD_LIBRARY_PATH` at).
pub fn install_beside(verbs_dir: &std::path::Path) {
    // Tests run in parallel: make the link under a name of this thread, then rename it
    // into place (atomic), never remove-then-create.
    let link = verbs_dir.join("librdmacm.so.1");
    let tmp = verbs_dir.join(format!("librdmacm.so.1.{:?}", std::thread::current().id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(built(), &tmp).expect("symlink librdmacm.so.1");
    std::fs::rename(&tmp, &link).expect("rename librdmacm.so.1 into place");
}
