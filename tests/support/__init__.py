"""What tests (and benchmarks) share, one concept a module:

- ``repos``: a workspace repository at a short path, its config, the scripted agents;
- ``daemons``: starting gridd (one way, with options; restartable; in-process);
- ``api``: asking a daemon over its socket; ``sse``: reading its event stream;
- ``cli``: running ``gridd`` and ``gridctl`` as a user would;
- ``processes``: agents, daemons and zombies seen from outside;
- ``waits``: one ``wait_for`` (blocking) and one ``until`` (async);
- ``git``: one ``git()`` runner.
- ``boxes``: removing the boxes a test's engine made.
"""
