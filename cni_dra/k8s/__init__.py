"""cni_dra.k8s."""
