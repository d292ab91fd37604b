"""Unit-test session settings.

``CNI_DRA_STATE_VERIFY=1``: after every commit the state store re-reads its files from
scratch and fails when they differ from the state in memory (a change the journal missed).
"""

import os

os.environ["CNI_DRA_STATE_VERIFY"] = "1"
