"""Session-wide test settings, and the fixtures shared between test folders.

`tests/` mirrors `rlhf/`: a folder per package folder (tests/rl for rlhf/rl, ...), tests/cli for
rlhf/cli/, tests/project for the repository-wide checks (layers, docs, dependencies), and
tests/reliability, tests/gpu and tests/tools beside them. The folders are packages (imported as
`tests.stages.test_train_sft`, ...); helpers live in `tests.support`. A fixture used by more than one
folder is a plugin listed here, so every test sees it without sys.path edits: the trainer fixtures
(`tok`, `prompts`, `models`, `make_trainer`) of tests/rl, tests/stages, tests/train, tests/runtime
and others; the misuse corpus's (`misuse_corpus`, `misuse_inputs`) of tests/reliability and
tests/tools; the CLI-trained tiny models and the one-process run on them (`cli_models`,
`one_process_run`) of tests/runtime and tests/ray_runtime. A folder's own fixtures stay in its
conftest.py.
"""

import torch

pytest_plugins = ["tests.support.train_fixtures", "tests.support.misuse", "tests.support.cli_runs"]

# Tests use tiny models: one intra-op thread is fastest, and with other processes sharing the
# cores, OpenMP spin-waiting makes two threads up to 100x slower.
torch.set_num_threads(1)

# `make test` runs two pytest-xdist workers (worksteal): each starts on one half of the collected
# order, and a worker that runs out takes the tail of the other's queue. The longest files run first,
# so that short tests fill in behind them instead of one worker ending the suite alone on a Ray or
# torchrun job (`pytest --durations 20`: these files hold the slowest tests). test_distributed.py
# leads: its module fixtures (each a two-rank job) are built by every worker that runs one of their
# tests, so its tests should all be done before the other worker starts taking work over; a Ray test
# builds its own actors, and the Ray tests split between the workers cost one more cluster (and one
# more build of the session's `cli_models` and `one_process_run`).
LONGEST_FIRST = (
    "tests/runtime/test_distributed.py",
    "tests/ray_runtime/",
    "tests/runtime/test_distributed_cli.py",
    "tests/stages/test_reward_server_example.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        return next(
            (i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)),
            len(LONGEST_FIRST),
        )

    items.sort(key=rank)  # stable: every other test keeps its collected order
