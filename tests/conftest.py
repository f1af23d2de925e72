"""Session-wide test settings, and the fixtures shared between test folders.

`tests/` mirrors `rlhf/`: a folder per package folder (tests/rl for rlhf/rl, ...), tests/cli for
rlhf/cli.py, tests/project for the repository-wide checks (layers, docs, dependencies), and
tests/reliability, tests/gpu and tests/tools beside them. The folders are packages (imported as
`tests.stages.test_train_sft`, ...); helpers live in `tests.support`. A fixture used by more than one
folder is a plugin listed here, so every test sees it without sys.path edits: the trainer fixtures
(`tok`, `prompts`, `models`, `make_trainer`) of tests/rl, tests/stages, tests/train, tests/runtime
and others. A folder's own fixtures stay in its conftest.py.
"""

import torch

pytest_plugins = ["tests.support.train_fixtures"]

# Tests use tiny models: one intra-op thread is fastest, and with other processes sharing the
# cores, OpenMP spin-waiting makes two threads up to 100x slower.
torch.set_num_threads(1)
