"""cni_dra.state."""
