"""Git beyond one task's worktree: the session's feature branch, the merge queue that
brings approved work into it, task diffs, and the conflict radar.

Every git call goes through the one runner, ``gridd.git.worktrees.git`` (an argv list, ``--``
before anything that could look like an option).
"""

from __future__ import annotations
