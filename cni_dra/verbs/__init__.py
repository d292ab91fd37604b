"""cni_dra.verbs."""
