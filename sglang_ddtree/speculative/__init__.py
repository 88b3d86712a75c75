"""The SGLang glue, laid out as SGLang's own ``srt/speculative`` package: the DDTREE algorithm as SGLang sees it
(``ddtree_spec``), its step data (``ddtree_info``) and decode step (``ddtree_worker``), the draft head folded into the
draft graph, the verify graphs and their checks, ``--budget auto``'s step glue, FlashInfer plans, hybrid GDN targets
and the snapshot-free GDN tree verify's hooks, and the cost-only acceptance simulation."""
