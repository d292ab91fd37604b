"""cni_dra.netlink."""
