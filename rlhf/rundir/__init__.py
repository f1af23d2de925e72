"""What a run does to its directory: opening it, fresh or resumed, for every stage (open_run.py: the
config of run_config.py, the checks of preflight.py, --out, the data-parallel group, the lock), the
metrics logger of a fresh or resumed run (directory.py), the one-writer lock (lock.py), verified
checkpoints (checkpoint.py, sharded_checkpoint.py for DCP), the trained weights of each role
(weights.py), what may change on resume (resume.py, supervised_resume.py) and the inputs recorded
(run_inputs.py), the exported Hugging Face models (export.py), a SIGTERM that lets a due write finish
(termination.py), the directory's size (footprint.py) and the report written at the end
(final_report.py)."""
