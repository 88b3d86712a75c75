"""Cost-only acceptance simulation for DDTREE: SGLang's ``SGLANG_SIMULATE_ACC_LEN`` benchmark knob, for trees.

SGLang 0.5.17 forces the acceptance length of EAGLE/NEXTN and DFLASH verifies with ``SGLANG_SIMULATE_ACC_LEN``
(a mean; ``SGLANG_SIMULATE_ACC_METHOD`` draws each verify's length around it) so that a model with random
weights runs the whole serving loop at a chosen acceptance. Its helper accepts nodes ``0 .. L-1``, a path only
in a chain's layout (and commits token 100, past a small vocabulary). On a DDTREE server this module replaces
that helper (AROUND ``spec_utils.generate_simulated_accept_index``, which the verify imports at each call): each
verify commits the first ``L`` nodes of the tree's most probable branch (root, then each node's first child: the
best-ranked one in pop order), shorter where that branch ends, with the branch's drafted tokens and the root's
token as the bonus. The draft head scores each depth's top candidate as certain while simulating
(``DDTreeDraftHead(certain_top1=True)``): a random-weight drafter's flat distributions would build star trees whose
best branch ends at depth 1, capping every simulated length at 2. The target still verifies the whole
tree, and the KV, GDN-state and draft-context commits run on the path as they would on an accepted one: the step
costs what a real one does. The committed tokens are not the target's: the server logs that it is simulating,
``/server_info`` reports ``ddtree_simulated_acceptance``, and nothing of it is lossless.

``SGLANG_DDTREE_SIMULATE_ACC_HISTOGRAM=FILE`` draws each request's length from a measured distribution instead
(a JSON list: entry ``L - 1`` is the weight of committing ``L`` tokens, e.g. a verify's acceptance histogram),
one draw per request per verify. ``SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH=W:MEAN,...`` makes the mean depend on the
verify's width (nodes, root included; linear between the given widths, from 1 token at width 1, the last mean
past the widest), so that ``--budget auto`` meets a wider tree that commits more at a higher cost and its choice
can be measured on random weights; its policy then learns each width from that width's own verifies only (a
length drawn for one width says nothing of a narrower prefix, which a real accepted path does). SGLang calls the
helper only while ``SGLANG_SIMULATE_ACC_LEN`` is positive, so that stays set (to the histogram's mean, for the
other algorithms of a comparison).
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import os
from typing import Any, Callable, Optional, Union

import torch

logger = logging.getLogger(__name__)

SIMULATE_TARGET = "sglang.srt.speculative.spec_utils.generate_simulated_accept_index"
HISTOGRAM_ENV = "SGLANG_DDTREE_SIMULATE_ACC_HISTOGRAM"
BY_WIDTH_ENV = "SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH"


class _CurrentTree:
    """The tree being verified (its first-child links and its width), set by the worker just before SGLang's
    verify, which does not pass the tree to the simulation helper."""

    next_token: Optional[torch.Tensor] = None
    width: int = 0


CURRENT_TREE = _CurrentTree()


def simulated_acceptance_mean() -> float:
    """SGLang's knob, as SGLang reads it (negative: off)."""
    from sglang.srt.speculative.spec_utils import SIMULATE_ACC_LEN

    return float(SIMULATE_ACC_LEN)


@functools.lru_cache(maxsize=1)
def _histogram_from(path: str) -> torch.Tensor:
    try:
        with open(path) as f:
            weights = json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(f"{HISTOGRAM_ENV}={path}: cannot read a JSON list of weights ({error})") from None
    if (not isinstance(weights, list) or not weights
            or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0 for w in weights)
            or sum(weights) <= 0):  # fmt: skip
        raise ValueError(f"{HISTOGRAM_ENV}={path}: expected a JSON list of non-negative weights with a positive sum "
                         "(entry L-1 = weight of committing L tokens)")  # fmt: skip
    probs = torch.tensor(weights, dtype=torch.float64)
    return probs / probs.sum()


def simulated_length_histogram() -> Optional[torch.Tensor]:
    """The length distribution of ``SGLANG_DDTREE_SIMULATE_ACC_HISTOGRAM`` (probabilities of 1, 2, ... tokens), or
    None; a bad file is a ``ValueError`` naming the variable."""
    path = os.environ.get(HISTOGRAM_ENV, "")
    return _histogram_from(path) if path else None


def parse_width_means(text: str) -> list[tuple[int, float]]:
    """``"9:3.2,2:1.5"`` -> ``[(2, 1.5), (9, 3.2)]``: each width (verify nodes, >= 2) with the mean length a verify of
    that width commits (1 to the width); ``ValueError`` naming the variable otherwise."""
    points = []
    for item in (item.strip() for item in text.split(",") if item.strip()):
        width, colon, mean = item.partition(":")
        try:
            point = (int(width), float(mean))
        except ValueError:
            point = None
        if not colon or point is None or point[0] < 2 or not 1 <= point[1] <= point[0]:
            raise ValueError(f"{BY_WIDTH_ENV}={text!r}: expected WIDTH:MEAN,... with each width >= 2 and its mean "
                             f"between 1 and the width, got {item!r}")  # fmt: skip
        points.append(point)
    if not points or len({w for w, _ in points}) < len(points):
        raise ValueError(f"{BY_WIDTH_ENV}={text!r}: expected WIDTH:MEAN,... with each width once")
    return sorted(points)


def mean_for_width(points: list[tuple[int, float]], width: int) -> float:
    """The mean committed length at ``width``: linear between the given widths (and from ``(1, 1.0)``, a verify of
    the bonus token alone), the widest's mean past it; never more than ``width``."""
    widths = [1] + [w for w, _ in points]
    means = [1.0] + [m for _, m in points]
    width = max(width, 1)
    at = min(bisect.bisect_left(widths, width), len(widths) - 1)
    if widths[at] <= width:
        return min(means[at], float(width))
    low, high = widths[at - 1], widths[at]
    return means[at - 1] + (means[at] - means[at - 1]) * (width - low) / (high - low)


@functools.lru_cache(maxsize=1)
def _width_means_from(text: str) -> tuple[tuple[int, float], ...]:
    return tuple(parse_width_means(text))


def simulated_width_means() -> Optional[list[tuple[int, float]]]:
    """``SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH``'s points, or None; a bad value is a ``ValueError`` naming it. Read
    on every simulated verify: parsed once per value."""
    text = os.environ.get(BY_WIDTH_ENV, "")
    return list(_width_means_from(text)) if text else None


def check_simulation_settings(mean: float) -> None:
    """``ValueError`` (naming the variable) for a histogram file that does not read or a width table that does not
    parse, for both at once, or for either without SGLang's own knob (``mean`` = ``SGLANG_SIMULATE_ACC_LEN``), which
    is what makes SGLang call the simulation."""
    histogram, by_width = simulated_length_histogram(), simulated_width_means()
    if histogram is not None and by_width is not None:
        raise ValueError(f"{HISTOGRAM_ENV} and {BY_WIDTH_ENV} are two ways to draw the lengths: set one")
    for name, value in ((HISTOGRAM_ENV, histogram), (BY_WIDTH_ENV, by_width)):
        if value is not None and not mean > 0:
            raise ValueError(f"{name} needs SGLANG_SIMULATE_ACC_LEN > 0 too (SGLang runs the simulation only "
                             "then): set it to a mean of the lengths")  # fmt: skip


def draw_lengths(histogram: torch.Tensor, batch_size: int, width: int, generator: Optional[torch.Generator] = None
                 ) -> torch.Tensor:  # fmt: skip
    """``[batch_size]`` committed lengths drawn from ``histogram`` on the host (as SGLang draws its own), at most
    ``width``."""
    lengths = torch.multinomial(histogram.float(), batch_size, replacement=True, generator=generator) + 1
    return lengths.clamp(max=width)


def simulation_report() -> Optional[dict[str, Any]]:
    """For ``/server_info`` on a DDTREE server that simulates; None otherwise."""
    import sglang_ddtree
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.spec_utils import SIMULATE_ACC_METHOD

    mean = simulated_acceptance_mean()
    if mean <= 0 or get_spec().speculative_algorithm != sglang_ddtree.DDTREE_ALGORITHM_NAME:
        return None
    note = "cost-only simulation: committed tokens are not the target's"
    histogram = simulated_length_histogram()
    if histogram is not None:
        return {"length_histogram": [round(float(p), 6) for p in histogram], "method": "per-request draw",
                "note": note}  # fmt: skip
    by_width = simulated_width_means()
    if by_width is not None:
        return {"mean_accept_length_by_width": {str(w): m for w, m in by_width}, "method": SIMULATE_ACC_METHOD,
                "note": note}  # fmt: skip
    return {"mean_accept_length": mean, "method": SIMULATE_ACC_METHOD, "note": note}


def best_branch_accept_index(next_token: torch.Tensor, length: Union[int, torch.Tensor], width: int) -> torch.Tensor:
    """``[bs, width]`` flat node indices (``b * N + node``) of each tree's first ``length`` nodes (one length, or
    ``[bs]`` on the device) along its first-child chain from the root, ``-1`` past the end of the chain or of the
    length: one kernel launch (``kernels/tree_branch.py``), so a simulated step spends no host time a real one
    does not."""
    from sglang_ddtree.kernels.tree_branch import first_child_branch

    return first_child_branch(next_token, length, width)


def simulated_lengths(batch_size: int, width: int, device: torch.device, verify_width: int = 0
                      ) -> Union[int, torch.Tensor]:  # fmt: skip
    """This verify's committed lengths, at most ``width`` (the longest path): one per request from the histogram
    file (``[bs]`` on ``device``), else one for the batch drawn as SGLang draws it around SGLang's mean, or around
    the width table's mean at ``verify_width`` (the tree's nodes) when that is set."""
    from sglang.srt.speculative.spec_utils import SIMULATE_ACC_LEN, SIMULATE_ACC_METHOD, _sample_simulated_acc_len

    histogram = simulated_length_histogram()
    if histogram is not None:
        return draw_lengths(histogram, batch_size, width).to(device, non_blocking=True)
    by_width = simulated_width_means()
    mean = mean_for_width(by_width, verify_width) if by_width is not None else float(SIMULATE_ACC_LEN)
    return _sample_simulated_acc_len(mean, SIMULATE_ACC_METHOD, width)


def simulate_acceptance_along_the_best_branch(original: Callable[..., torch.Tensor], **kwargs: Any) -> torch.Tensor:
    """AROUND SGLang's ``generate_simulated_accept_index`` (called with keywords only) on a DDTREE server."""
    next_token = CURRENT_TREE.next_token
    if next_token is None:
        return original(**kwargs)
    width = kwargs["spec_steps"] + 1
    length = simulated_lengths(next_token.shape[0], width, next_token.device, CURRENT_TREE.width)
    index = best_branch_accept_index(next_token, length, width)
    accepted = index >= 0
    kwargs["num_correct_drafts"].copy_(accepted.sum(1) - 1)
    candidates = kwargs["candidates"]
    tokens = candidates.reshape(-1)
    following = torch.cat([index[:, 1:], torch.full_like(index[:, :1], -1)], dim=1)
    committed = torch.where(following >= 0, tokens[following.clamp(min=0).long()], candidates[:, :1])
    # Without boolean indexing (a device-to-host read of the count, run 37's sync debug log): entries past the
    # chain rewrite the root's slot with the root's own value.
    predict = kwargs["predict"]
    slots = torch.where(accepted, index, index[:, :1]).long().reshape(-1)
    predict[slots] = torch.where(accepted, committed, committed[:, :1]).reshape(-1).to(predict.dtype)
    return index


def register(registry: Any, hook_type: Any) -> None:
    registry.register(SIMULATE_TARGET, simulate_acceptance_along_the_best_branch, hook_type.AROUND)
