"""Session-wide test settings."""

import torch

# Tests use tiny models: one intra-op thread is fastest, and with other processes sharing the
# cores, OpenMP spin-waiting makes two threads up to 100x slower.
torch.set_num_threads(1)
