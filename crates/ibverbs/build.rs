//! Links `libibverbs.so.1`: its soname, and every export bound to the version node the
//! Debian programs import it with (`exports.txt`, a copy of shared/abi/libibverbs-imports.txt).
//! The work is `softrdma-dropin-build`'s, shared with the drop-in librdmacm.

fn main() {
    softrdma_dropin_build::drop_in("ibverbs");
}
