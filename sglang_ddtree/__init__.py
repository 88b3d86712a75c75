"""DDTree speculative decoding for SGLang 0.5.17, shipped as a plugin (no fork)."""

__version__ = "0.1.0"

# Shared by the launcher (which must not import SGLang) and the SGLang-side spec class.
DDTREE_ALGORITHM_NAME = "DDTREE"
DDTREE_DEFAULT_BUDGET = 32
# The tree that --budget auto drafts every step; each step verifies the prefix of it that pays most.
AUTO_BUDGET_TREE = 32
