"""Node-local state: prepared ResourceClaims and attachments in one JSON file under a file lock.

Only this layer touches the state lock (``flock(2)`` on ``state.lock``, see store).
"""

from cni_dra.state.models import SCHEMA_VERSION, Attachment, ClaimRef, NodeState
from cni_dra.state.store import StateStore

__all__ = ["SCHEMA_VERSION", "Attachment", "ClaimRef", "NodeState", "StateStore"]
