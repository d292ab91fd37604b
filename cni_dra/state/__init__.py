"""Node-local state: prepared ResourceClaims and attachments in a snapshot and a journal under a file lock.

Only this layer touches the state lock (``flock(2)`` on ``state.lock``, see
:mod:`cni_dra.state.lock`); :mod:`cni_dra.state.store` maps the modules. The state is
immutable: :meth:`StateStore.transaction` yields a :class:`Txn`, whose typed operations
(:mod:`cni_dra.state.ops`) are the only way it changes, in memory and in the journal alike.
"""

from cni_dra.state.schema import SCHEMA_VERSION, Attachment, ClaimRef, NodeState
from cni_dra.state.store import StateStore
from cni_dra.state.txn import Txn

__all__ = ["SCHEMA_VERSION", "Attachment", "ClaimRef", "NodeState", "StateStore", "Txn"]
