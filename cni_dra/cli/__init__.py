"""cni_dra.cli."""
