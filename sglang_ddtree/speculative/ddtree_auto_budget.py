"""``--budget auto`` in the DDTree step: the verify width of each step, and what each verify teaches the policy.

The drafter always builds the widest tree (the server's ``--speculative-num-draft-tokens``); a step of width ``w``
verifies its first ``w - 1`` popped nodes, which form the best tree of that width (``budget_policy``), and a step of
width 1 skips the drafter and verifies the bonus token alone (the committed token's target features still go into
the draft KV cache, so the drafter can resume at any later step). The policy learns from the accepted nodes of each
verify, which SGLang's ``eagle_sample`` returns but ``run_eagle_verify`` does not pass on: an AFTER hook keeps them.

The step times come from the server's own first decode steps at each batch size (``measured_step_times``,
``SGLANG_DDTREE_BUDGET_AUTO=1``: the launcher's ``--budget auto``), or from a table file
(``SGLANG_DDTREE_STEP_TIME_TABLE``: ``--budget auto --step-time-table FILE``, fixed times for reproducible runs).

A width narrower than the captured one runs the target's verify eagerly (SGLang's graph runner replays only its
capture width), so every width of the policy gets target-verify graphs of its own (``ddtree_verify_graphs``;
``SGLANG_DDTREE_AUTO_VERIFY_GRAPHS=0``: the narrower widths verify eagerly).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Optional

import torch

from sglang_ddtree.tree.budget_policy import (
    DEFAULT_WIDTHS,
    STEP_TIME_TABLE_ENV,
    BudgetPolicy,
    requested_step_time_table,
)
from sglang_ddtree.speculative.ddtree_simulation import simulated_width_means
from sglang_ddtree.speculative.ddtree_verify_graphs import (
    VerifyGraphsPerWidth,
    verify_graphs_bytes,
    verify_graphs_per_width_requested,
)
from sglang_ddtree.env_flags import env_flag
from sglang_ddtree.tree.measured_step_times import MeasuredStepTimes, unmeasured_table

BUDGET_AUTO_ENV = "SGLANG_DDTREE_BUDGET_AUTO"  # measured step times

EAGLE_SAMPLE = "sglang.srt.speculative.eagle_worker_common.eagle_sample"
KV_CACHE_BUDGET = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._profile_available_bytes"

logger = logging.getLogger(__name__)


class _LastVerify:
    """``[bs, depth]`` flat node indices (``b * N + node``, -1 padding) that the last verify accepted: SGLang's
    ``eagle_sample`` (kept by the hook below) or the package's greedy verify (``ddtree_greedy_verify``)."""

    accept_index: Optional[torch.Tensor] = None


LAST_VERIFY = _LastVerify()


def keep_accept_index(result: tuple, *args: Any, **kwargs: Any) -> tuple:
    """AFTER SGLang's ``eagle_sample`` (returns ``predict, accept_lens, accept_index``): keep the accepted nodes."""
    LAST_VERIFY.accept_index = result[2]
    return result


def auto_budget_requested() -> bool:
    return env_flag(BUDGET_AUTO_ENV) or bool(os.environ.get(STEP_TIME_TABLE_ENV, ""))


def measured_widths(tree_width: int) -> list[int]:
    """The widths a measuring auto budget chooses from: the defaults up to about half the tree, and the tree
    (a width near the tree's would cost about as much and add another set of verify graphs)."""
    return [w for w in DEFAULT_WIDTHS if w < tree_width and 2 * w <= tree_width + 1] + [tree_width]


def policy_widths(tree_width: int) -> list[int]:
    """The widths the auto budget of a server with ``tree_width``-node trees chooses from."""
    table = requested_step_time_table()
    return list(table.widths) if table is not None else measured_widths(tree_width)


def keep_kv_budget_for_verify_graphs(original: Callable[..., int], configurator: Any, *args: Any, **kwargs: Any) -> int:
    """AROUND SGLang's ``KVCacheConfigurator._profile_available_bytes`` (the target's KV cache budget): take out
    what the auto budget's verify graphs of the narrower widths will hold (``ddtree_verify_graphs``), which are
    captured after the pools are sized and would otherwise eat the activations' slack."""
    from sglang.srt.model_executor.cuda_graph_config import Backend

    from sglang_ddtree import DDTREE_ALGORITHM_NAME

    available = original(configurator, *args, **kwargs)
    server_args = configurator.server_args
    decode_graphs = server_args.cuda_graph_config.decode
    if (
        configurator.is_draft_worker
        or server_args.speculative_algorithm != DDTREE_ALGORITHM_NAME
        or decode_graphs.backend == Backend.DISABLED
        or not decode_graphs.bs
    ):
        return available
    tree_width = int(server_args.speculative_num_draft_tokens)
    widths = [w for w in policy_widths(tree_width) if w != tree_width]
    kept = verify_graphs_bytes(widths, max(decode_graphs.bs), configurator.model_config.vocab_size,
                               configurator.model_config.hidden_size)  # fmt: skip
    logger.info("DDTREE --budget auto: %.2f GB of the KV cache budget kept for the verify graphs of widths %s "
                "(up to %d requests)", kept / (1 << 30), widths, max(decode_graphs.bs))  # fmt: skip
    return available - kept


def check_auto_budget_settings(tree_width: int) -> None:
    """``ValueError`` for a table that does not read or whose widest width is not the server's tree width."""
    table = requested_step_time_table()
    if table is not None and table.widths[-1] != tree_width:
        raise ValueError(f"{STEP_TIME_TABLE_ENV}: the table's widest width {table.widths[-1]} must be the server's "
                         f"--speculative-num-draft-tokens {tree_width} (the tree the drafter builds)")  # fmt: skip


class AutoBudget:
    """One worker's per-step widths: the policy's choice, the accepted nodes it is told, the widths' tally."""

    def __init__(self, policy: BudgetPolicy, agree: Optional[Callable[[list[float]], list[float]]] = None,
                 measure: bool = False) -> None:  # fmt: skip
        """``measure``: the step times are measured (``policy`` starts from an unmeasured table); ``agree`` turns
        one tensor-parallel rank's measured row into the row all ranks use."""
        self.policy = policy
        self.steps_per_width = {width: 0 for width in policy.widths}
        self.verify_graphs: Optional[VerifyGraphsPerWidth] = None  # set by a worker that captured them
        self.measured = MeasuredStepTimes(policy.widths, policy.set_step_times, agree) if measure else None
        AUTO_BUDGET_STATS.append(self)

    @classmethod
    def from_environment(
        cls, tree_width: int, device: torch.device | str, agree: Optional[Callable[[list[float]], list[float]]] = None
    ) -> Optional["AutoBudget"]:
        """The auto budget of a server started with a step time table or ``SGLANG_DDTREE_BUDGET_AUTO=1``, else None
        (a fixed budget)."""
        check_auto_budget_settings(tree_width)
        # Under a per-width simulation a verify's committed length is drawn for its width: it says nothing of
        # what a narrower prefix would have committed.
        prefixes = simulated_width_means() is None
        table = requested_step_time_table()
        if table is not None:
            return cls(BudgetPolicy(table, table.widths, device=device, price_narrower_widths=prefixes))
        if not env_flag(BUDGET_AUTO_ENV):
            return None
        widths = measured_widths(tree_width)
        return cls(BudgetPolicy(unmeasured_table(widths), widths, device=device, price_narrower_widths=prefixes),
                   agree, measure=True)  # fmt: skip

    def next_width(self, batch_size: int) -> int:
        """The width of a decode step of ``batch_size`` requests; called once at the start of each."""
        width = self.policy.width()  # taken every step, so that decisions are consumed in order on every rank
        if self.measured is not None:
            width = self.measured.width_to_measure(batch_size) or width
        self.steps_per_width[width] += 1
        return width

    def interrupt(self) -> None:
        """A prefill or idle forward ran between decode steps."""
        if self.measured is not None:
            self.measured.interrupt()

    def observe(self, path_logprob: Optional[torch.Tensor], width: int) -> None:
        """After a verify of ``width`` nodes per request; ``path_logprob`` of the widest tree, None without one."""
        accept_index = LAST_VERIFY.accept_index
        LAST_VERIFY.accept_index = None
        if path_logprob is None or accept_index is None:
            return
        drafts = accept_index[:, 1:].long()
        nodes = torch.where(drafts >= 0, drafts % width, -1)  # node ids in pop order, root 0
        self.policy.observe(path_logprob, width, nodes)

    def report(self) -> dict[str, Any]:
        report = {"widths": self.policy.widths, "steps": [self.steps_per_width[w] for w in self.policy.widths],
                  "table": os.environ.get(STEP_TIME_TABLE_ENV, "")}  # fmt: skip
        if self.measured is not None:
            report.update(self.measured.report())
        if self.verify_graphs is not None:
            report.update(self.verify_graphs.report())
        return report


AUTO_BUDGET_STATS: list[AutoBudget] = []


def auto_budget_report() -> Optional[dict[str, Any]]:
    """For ``/server_info``: the widths a ``--budget auto`` worker of this process verified, step counts per width."""
    return AUTO_BUDGET_STATS[0].report() if AUTO_BUDGET_STATS else None


def register(registry: Any, hook_type: Any) -> None:
    registry.register(EAGLE_SAMPLE, keep_accept_index, hook_type.AFTER)
    if verify_graphs_per_width_requested():
        registry.register(KV_CACHE_BUDGET, keep_kv_budget_for_verify_graphs, hook_type.AROUND)
