"""cni_dra.allocator."""
