"""Session-wide test settings, and the fixtures shared between test folders.

`tests/` and its folders are packages (imported as `tests.train.test_train_sft`, ...); helpers live
in `tests.support`. A fixture used by more than one folder is a plugin listed here, so every test
sees it without sys.path edits: the trainer fixtures (`tok`, `prompts`, `models`, `make_trainer`)
of tests/train and tests/runtime. A folder's own fixtures stay in its conftest.py.
"""

import torch

pytest_plugins = ["tests.support.train_fixtures"]

# Tests use tiny models: one intra-op thread is fastest, and with other processes sharing the
# cores, OpenMP spin-waiting makes two threads up to 100x slower.
torch.set_num_threads(1)
