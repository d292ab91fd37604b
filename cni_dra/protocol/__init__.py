"""cni_dra.protocol."""
