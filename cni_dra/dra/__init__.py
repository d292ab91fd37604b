"""cni_dra.dra."""
