"""Adapters turn an agent's output into gridd's view of it (status, activity, questions,
cost, session id, result) and turn a human's answer into what the agent expects on stdin.

Each adapter is a plugin behind the small interface in ``base.py``; ``get_adapter(name)``
returns a fresh instance per agent run.
"""
