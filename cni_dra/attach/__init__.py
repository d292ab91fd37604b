"""The life of one attachment, below the verbs: placement, intents, release, recovery, the
device profile an ADD applies, the shaping plan, and the rebuild behind `cni-dra state repair`."""
