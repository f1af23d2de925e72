"""A reward-function module no test names: importing it is a bug (tests/rl/test_reward_functions.py)."""

raise AssertionError("tests.support.reward_fns_unnamed was imported, but no config names it")
