"""Make tools/ importable (tost_reference, make_parity_fixtures, make_random_models) and run torch
single-threaded: the tensors here are tiny, and on the 2-core build machines (shared with C++
builds) intra-op threads only add contention - measured 4 s vs 40+ s for this suite."""

import os
import sys

import torch

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
sys.path.insert(0, os.path.normpath(TOOLS))

torch.set_num_threads(1)
