"""The output pass publishes many agents' output in one store transaction: all of it or none
of it, and a daemon killed in the middle of such a batch publishes exactly the rest after a
restart. Monitors read ``exit.json`` only when something says the run may have ended."""

from __future__ import annotations

from pathlib import Path

from gridd.errors import StoreError
from gridd.store import Store
from tests.support.api import wait_task_status
from tests.support.daemons import restartable_daemon
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for
from tests.test_wakeups import assert_complete, lines_agents, output_by_agent, until


async def test_a_pass_the_store_refuses_publishes_nothing_of_any_agent_then_all_of_it_once(
    repo: Path,
) -> None:
    agents, count = 3, 40
    async with lines_agents(repo, agents=agents, count=count) as (grid, control):
        output = grid.pool.monitor.output
        ids = sorted(a.id for a in grid.state.live_agents())
        # Nothing is read while the agents write: the whole burst waits for one pass.
        real_wake = output.wake
        output.wake = lambda agent_id: None  # type: ignore[method-assign]
        try:
            (control / "go").touch()
            await until(lambda: all((control / f"t{i}.done").exists() for i in range(agents)))
            before = output_by_agent(grid)
            positions = {a: grid.state.agents[a].output_seq for a in ids}
            # Every agent's events are in the transaction when the positions fail.
            real_save = Store.save_output_positions

            def save_output_positions(self: Store, rows: object) -> None:
                assert grid.store.in_transaction
                raise StoreError("the disk holding the state database is full", code="disk_full")

            Store.save_output_positions = save_output_positions  # type: ignore[assignment,method-assign]
            grid.state._positions_due = 0.0  # this pass saves the agents' positions too
            try:
                output.due = dict.fromkeys(ids)
                published, _ = output.run_pass()
            finally:
                Store.save_output_positions = real_save  # type: ignore[method-assign]
            assert published == 0
            assert output_by_agent(grid) == before  # no agent's chunk got out
            assert {a: grid.state.agents[a].output_seq for a in ids} == positions
            stored = {a.id: a.output_seq for a in grid.store.load_agents() if a.id in ids}
            assert stored == positions
            assert set(output.paused) == set(ids)
            # Writes work again: the held looks go out, each chunk once, in order.
            output.due = dict.fromkeys(ids)
            while output.due:
                output.run_pass()
        finally:
            output.wake = real_wake  # type: ignore[method-assign]
        await until(lambda: all(not r.unread() for r in grid.pool.runs.values()), what="read")
        assert_complete(grid, count)
        assert not output.paused
        stored = {a.id: a.output_seq for a in grid.store.load_agents() if a.id in ids}
        assert stored == {a: grid.state.agents[a].output_seq for a in ids}


async def test_lines_from_many_agents_share_transactions(repo: Path) -> None:
    agents, count = 8, 300
    async with lines_agents(repo, agents=agents, count=count) as (grid, control):
        output = grid.pool.monitor.output
        before = output.transactions
        (control / "go").touch()
        await until(lambda: all((control / f"t{i}.done").exists() for i in range(agents)))
        await until(lambda: all(not r.unread() for r in grid.pool.runs.values()), what="read")
        assert_complete(grid, count)
        # Every chunk went out, in far fewer transactions than there were chunks.
        chunks = sum(len(v) for v in output_by_agent(grid).values())
        assert 0 < output.transactions - before < chunks


async def test_an_exit_is_noticed_without_reading_exit_json_on_every_wake(repo: Path) -> None:
    agents, count = 4, 500
    async with lines_agents(repo, agents=agents, count=count) as (grid, control):
        wakeups = grid.pool.wakeups
        (control / "go").touch()
        await until(lambda: all((control / f"t{i}.done").exists() for i in range(agents)))
        await until(lambda: all(not r.unread() for r in grid.pool.runs.values()), what="read")
        assert_complete(grid, count)
        totals = wakeups.totals()
        assert totals.reads > agents  # the runs were read many times...
        assert totals.exit_checks == agents  # ...exit.json once each, when watching began
        (control / "end").touch()
        await until(lambda: not grid.pool.handles, timeout=30, what="agents finished")
        totals = wakeups.totals()
        # The exit record's arrival (or the shim's exit) is what made each monitor read it.
        assert agents < totals.exit_checks <= 3 * agents


def test_a_daemon_killed_mid_batch_publishes_exactly_the_rest_of_every_agent(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo, agents={"flood": {"command": agent_command("flood.py", "6", str(tmp_path))}}
    )
    names = ["f1", "f2", "f3"]
    with restartable_daemon(repo) as grid:
        c = grid.client()
        for name in names:
            c.post("/tasks", {"id": name, "title": f"floods {name}", "agent": "flood"})
        c.post("/session/start", {"maxAgents": len(names)})
        runs = repo / ".grid" / "runs"

        def indexed() -> int:
            indexes = runs.glob("*/chunks.idx") if runs.exists() else []
            return sum(1 for i in indexes if i.stat().st_size > 16 * 8)

        # Killed while at least two agents' output is being indexed and published together.
        wait_for(lambda: indexed() >= 2, timeout=30, interval=0.001)
        grid.kill9()
        grid.start()
        for name in names:
            wait_task_status(c, name, "review", timeout=90)
        events = [e.data for e in event_log(c, types={"agent.output"})]
    by_agent: dict[str, list[dict[str, object]]] = {}
    for data in events:
        by_agent.setdefault(str(data["agentId"]), []).append(data)
    assert len(by_agent) == len(names)
    for agent_id, chunks in by_agent.items():
        run_dir = runs / agent_id
        assert [ch["seq"] for ch in chunks] == list(range(1, len(chunks) + 1))
        text = "".join(str(ch["chunk"]) for ch in chunks)
        assert text.encode() == (run_dir / "output.log").read_bytes()


async def test_a_lone_write_is_read_at_once_and_writes_within_the_window_as_one_batch(
    tmp_path: Path,
) -> None:
    from gridd.runs.wakeups import Wakeups

    wakeups = Wakeups(coalesce_seconds=1.0)
    wakeups.start()
    try:
        runs = []
        for i in range(3):
            run = tmp_path / f"run{i}"
            run.mkdir()
            runs.append(run)
            wakeups.watch(run, unread=lambda: False, key=f"a{i}")
        seen: list[str] = []
        wakeups.on_data = lambda wake: seen.append(wake.key)
        (runs[0] / "output.log").write_text("first\n")
        await until(lambda: seen == ["a0"], what="the lone write")
        assert wakeups._window is None  # read as it came: no window was opened
        drains = wakeups.drains
        # Within the window of that read: both wait for its end, then go as one batch.
        (runs[1] / "output.log").write_text("second\n")
        (runs[2] / "heartbeat.ndjson").write_text('{"status": "working"}\n')
        (runs[0] / "chunks.idx").write_bytes(b"\0" * 16)  # the daemon's own: never counts
        await until(lambda: wakeups._window is not None, what="a window")
        assert seen == ["a0"]
        await until(lambda: len(seen) == 3, what="the batch")
        assert sorted(seen[1:]) == ["a1", "a2"] and wakeups.drains == drains + 1
    finally:
        wakeups.close()


async def test_a_settled_output_pass_keeps_the_watchers_own_pause_warning_and_back(
    repo: Path,
) -> None:
    async with lines_agents(repo, agents=1, count=20) as (grid, control):
        monitor = grid.pool.monitor
        output = monitor.output
        (agent_id,) = [a.id for a in grid.state.live_agents()]
        # The monitor's watch is paused (a store error) while the output pass has its own
        # pause for the same run: /health names both.
        monitor.paused[agent_id] = "watching: the disk is full"
        output.paused[agent_id] = "publishing: the disk is full"
        assert (
            monitor.paused[agent_id] == "watching: the disk is full; publishing: the disk is full"
        )
        # The output pass reads and settles the run: its own reason goes, the monitor's stays.
        (control / "go").touch()
        await until(lambda: (control / "t0.done").exists())
        await until(lambda: all(not r.unread() for r in grid.pool.runs.values()), what="read")
        assert_complete(grid, 20)
        assert agent_id not in output.paused
        assert dict(monitor.paused) == {agent_id: "watching: the disk is full"}
        assert any("watching: the disk is full" in w for w in grid.health().warnings)
        # And the monitor resuming clears only its own reason, never the output pass's.
        output.paused[agent_id] = "publishing: the disk is full"
        monitor.paused.pop(agent_id, None)
        assert dict(monitor.paused) == {agent_id: "publishing: the disk is full"}
        assert any("publishing: the disk is full" in w for w in grid.health().warnings)
        output.paused.pop(agent_id)
        assert not monitor.paused


async def test_a_look_after_an_output_only_notice_skips_the_heartbeat_file_never_its_beats(
    tmp_path: Path,
) -> None:
    from gridd.adapters.heartbeat import HeartbeatAdapter
    from gridd.runs.wakeups import Wakeups
    from gridd.runs.watch import RunWatch

    wakeups = Wakeups(sweep_seconds=60)
    wakeups.start()
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        run = RunWatch(run_dir, HeartbeatAdapter())
        noticed: list[str] = []
        wakeups.on_data = lambda wake: noticed.append(wake.key)
        wake = wakeups.watch(run_dir, unread=run.unread_data, key="a1")
        assert wake.beats_due  # a new watch looks at everything
        wake.beats_due = False  # as the output pass does when it looks
        (run_dir / "output.log").write_text("hello\n")
        await until(lambda: len(noticed) >= 2, what="the output notice")
        assert not wake.beats_due  # output.log alone: the heartbeat file is not looked at
        polled = run.poll(beats=wake.beats_due)
        assert [c.text for c in polled.chunks] == ["hello\n"] and polled.beats == []
        (run_dir / "heartbeat.ndjson").write_text('{"status": "working", "label": "busy"}\n')
        await until(lambda: wake.beats_due, what="the heartbeat notice")
        polled = run.poll(beats=True)
        assert [b.label for b in polled.beats] == ["busy"]
        # A beat whose notice was lost is found by the sweep, which always looks at both.
        wake.beats_due = False
        wakeups.forget_notifications(wake)
        with (run_dir / "heartbeat.ndjson").open("a") as fh:
            fh.write('{"status": "working", "label": "still"}\n')
        assert wakeups.sweep() == 1 and wake.beats_due
        assert [b.label for b in run.poll(beats=wake.beats_due).beats] == ["still"]
    finally:
        wakeups.close()
