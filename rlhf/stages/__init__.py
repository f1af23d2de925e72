"""The commands' bodies: `rlhf sft` (sft.py), `rlhf rm` (rm.py), `rlhf dpo` (dpo.py), `rlhf train`
(train.py, with the prompt files of prompt_files.py), `rlhf eval` (eval.py) and `rlhf rm-eval`
(rm_eval.py); result_files.py keeps an earlier result from being replaced."""
