//! Links `librdmacm.so.1`: its soname, and every export bound to the version node the
//! Debian programs import it with (`exports.txt`: what Debian's librdmacm.so.1 exports,
//! `objdump -T`). The work is `softrdma-dropin-build`'s, shared with the drop-in libibverbs.

fn main() {
    softrdma_dropin_build::drop_in("rdmacm");
}
