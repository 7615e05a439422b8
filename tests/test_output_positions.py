"""Agents' output positions are written to their rows every few seconds, not per line: the
``agent.output`` events after the positions mark say the rest, so a daemon killed between
two saves loads exactly what it had published, and pruning never drops what they say."""

from __future__ import annotations

from pathlib import Path

from gridd.events import EventBus
from gridd.model import Agent
from gridd.state import GridState
from gridd.store import Store


def _state(path: Path) -> GridState:
    store = Store.open(path)
    return GridState(store, EventBus(store, queue_size=100))


def _publish(state: GridState, agent_id: str, seq: int, chunk: str) -> None:
    with state.store.transaction():
        state.bus.publish_many("agent.output", [{"agentId": agent_id, "chunk": chunk, "seq": seq}])
        state.note_output([(agent_id, seq, chunk.strip() or "")])


def _agent(n: int) -> Agent:
    return Agent(id=f"a{n}", task_id=f"t{n}", profile="p", worktree_path=f"/w/{n}")


def test_positions_between_two_saves_are_recovered_from_the_log_after_a_crash(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gridd.db"
    state = _state(path)
    for n in (1, 2):
        state.put_agent(_agent(n))
    _publish(state, "a1", 1, "one\n")  # the first batch saves every position, and the mark
    rows = {a.id: a.output_seq for a in state.store._load("agents", Agent)}
    assert rows == {"a1": 1, "a2": 0}
    for seq in range(2, 6):
        _publish(state, "a1", seq, f"line {seq}\n")
    _publish(state, "a2", 1, "two\n\n")
    # Not saved yet: the rows still say what the first batch wrote...
    rows = {a.id: a.output_seq for a in state.store._load("agents", Agent)}
    assert rows == {"a1": 1, "a2": 0}
    # ... and a daemon killed now (no close, no save) loads what the events say.
    again = _state(path)
    loaded = {a.id: (a.output_seq, a.last_output) for a in again.agents.values()}
    assert loaded == {"a1": (5, "line 5"), "a2": (1, "two")}
    # The next batch of the new daemon saves every live agent's position, with a new mark.
    _publish(again, "a2", 2, "three\n")
    rows = {a.id: a.output_seq for a in again.store._load("agents", Agent)}
    assert rows == {"a1": 5, "a2": 2}
    assert again.store.positions_mark() == again.store.last_appended_id
    again.store.close()
    state.store.close()


def test_a_rolled_back_batch_moves_no_position_in_memory_or_on_reload(tmp_path: Path) -> None:
    path = tmp_path / "gridd.db"
    state = _state(path)
    state.put_agent(_agent(1))
    _publish(state, "a1", 1, "one\n")
    try:
        with state.store.transaction():
            state.bus.publish_many("agent.output", [{"agentId": "a1", "chunk": "x\n", "seq": 2}])
            state._positions_due = 0.0
            state.note_output([("a1", 2, "x")])
            raise RuntimeError("the batch fails")
    except RuntimeError:
        pass
    assert state.agents["a1"].output_seq == 1
    assert {a.id: a.output_seq for a in _state(path).agents.values()} == {"a1": 1}
    state.store.close()


def test_pruning_keeps_the_events_after_the_positions_mark(tmp_path: Path) -> None:
    path = tmp_path / "gridd.db"
    state = _state(path)
    state.put_agent(_agent(1))
    _publish(state, "a1", 1, "one\n")  # saved, mark set
    mark = state.store.positions_mark()
    assert mark is not None
    for seq in range(2, 40):
        _publish(state, "a1", seq, f"line {seq}\n")
    state.store.prune_events(5)  # would keep only 5; the events after the mark stay
    assert state.store.first_event_id() == mark + 1
    assert {a.id: a.output_seq for a in _state(path).agents.values()} == {"a1": 39}
    state.store.close()


def test_events_after_a_quiet_agents_last_save_are_pruned_once_positions_are_saved(
    tmp_path: Path,
) -> None:
    # An agent printed, then went quiet while other events went on: the mark must not hold
    # every later event back from pruning. Saving the positions first (as the prune loop
    # does) moves the mark, and the position survives on the row.
    path = tmp_path / "gridd.db"
    state = _state(path)
    state.put_agent(_agent(1))
    _publish(state, "a1", 1, "one\n")  # saved, mark set
    for seq in range(2, 6):
        _publish(state, "a1", seq, f"line {seq}\n")  # not saved: within the save interval
    for n in range(50):
        state.bus.publish("task.updated", {"taskId": f"t{n}"})
    state.save_positions_now()
    assert state.store.positions_mark() == state.store.last_appended_id
    state.store.prune_events(5)
    assert state.store.first_event_id() == state.store.last_appended_id - 4
    loaded = {a.id: (a.output_seq, a.last_output) for a in _state(path).agents.values()}
    assert loaded == {"a1": (5, "line 5")}
    state.store.close()
