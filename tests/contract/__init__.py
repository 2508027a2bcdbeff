"""The store's contract, written once and run on both engines.

Each module here holds test cases that build their stores through
`worlds.World`, which makes one for the engine in effect in the process
(graph mode, or eager execution) and makes the calls the way that engine
takes them. A thin test file in each suite runs a module's cases: one in
`tests/` (the graph run) and one in `tests/eager/` (the eager run), since the
two engines run as separate pytest processes (`tests/conftest.py`).

    state_machine.py  random call sequences against a numpy model
    threads.py        several threads on one store
    soak.py           many cycles: memory, traces and ops stay flat
    kill.py           SIGKILL while a disk-mode store writes
    full_disk.py      ENOSPC and EFBIG while a disk-mode store writes
"""
