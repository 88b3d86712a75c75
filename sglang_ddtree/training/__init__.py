"""The drafter trainer (``python -m sglang_ddtree.training.train_drafter``): the DFlash drafter model, self-distilled
prompts and answers, and the acceptance the trained drafter would give (replayed tau)."""
