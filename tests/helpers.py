"""Transitional: the old home of the test helpers, kept only as a re-export of
``tests.support`` while tests written against it are still landing (issue 23 part 6).

Import from the ``tests.support`` modules instead; this file goes once nothing imports it.
"""

from __future__ import annotations

from tests.support.api import api_call as api_call
from tests.support.api import output_chunks as output_chunks
from tests.support.api import raw_http as raw_http
from tests.support.api import scheduler_starts as scheduler_starts
from tests.support.api import socket_answers as socket_answers
from tests.support.api import wait_pending_question as wait_pending_question
from tests.support.api import wait_task_status as wait_task_status
from tests.support.cli import GRIDCTL as GRIDCTL
from tests.support.cli import GRIDCTL_ENV as GRIDCTL_ENV
from tests.support.cli import GRIDD as GRIDD
from tests.support.cli import gridctl as gridctl
from tests.support.cli import run_gridd as run_gridd
from tests.support.daemons import DaemonProc as DaemonProc
from tests.support.daemons import InProcessDaemon as InProcessDaemon
from tests.support.daemons import Restartable as Restartable
from tests.support.daemons import core_daemon as core_daemon
from tests.support.daemons import inprocess_daemon as inprocess_daemon
from tests.support.daemons import kill9_between_exit_and_commit as kill9_between_exit_and_commit
from tests.support.daemons import restartable_daemon as restartable_daemon
from tests.support.daemons import running_daemon as running_daemon
from tests.support.daemons import start_daemon as start_daemon
from tests.support.daemons import stop_workspace as stop_workspace
from tests.support.git import git_show as git_show
from tests.support.processes import daemons_serving as daemons_serving
from tests.support.processes import kill_workspace_agents as kill_workspace_agents
from tests.support.processes import open_fds as open_fds
from tests.support.processes import process_gone as process_gone
from tests.support.processes import zombie_children as zombie_children
from tests.support.repos import AGENTS_DIR as AGENTS_DIR
from tests.support.repos import FAKE_CLAUDE as FAKE_CLAUDE
from tests.support.repos import FAST_SCHEDULER as FAST_SCHEDULER
from tests.support.repos import agent_command as agent_command
from tests.support.repos import fake_claude_profile as fake_claude_profile
from tests.support.repos import make_repo as make_repo
from tests.support.repos import read_json_file as read_json_file
from tests.support.repos import read_text_file as read_text_file
from tests.support.repos import remove_repo as remove_repo
from tests.support.repos import touch as touch
from tests.support.repos import write_config as write_config
from tests.support.repos import write_core_config as write_core_config
from tests.support.sse import EventFollower as EventFollower
from tests.support.sse import SSERead as SSERead
from tests.support.sse import event_log as event_log
from tests.support.sse import read_sse as read_sse
from tests.support.sse import wait_for_events as wait_for_events
from tests.support.waits import wait_for as wait_for
