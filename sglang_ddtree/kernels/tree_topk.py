"""Per-depth log-softmax + top-K of drafter logits, single-GPU and vocab-sharded (TP).

Semantics (see ``sglang_ddtree.tree.tree_reference``): for each row of ``logits [bs, L, V]`` the
``K`` largest logits, ordered by logit descending, equal logits -> lower token id first, and
``logprob = logit - logsumexp(row)`` in float32. Rows need a finite logit; NaN is not handled.

How it is computed. Every candidate is an int64 *key*: the float32 logit mapped to an
order-preserving int32 in the high word, ``2**31 - 1 - token_id`` in the low word. Integer
order on keys is exactly (logit desc, token id asc), so selection only compares integers:
exact and deterministic. Work is split into *sources*; a source record is ``KP + 1`` int64 words:
``KP = next_pow2(K)`` keys sorted descending (its best keys, or group maxima in step 1;
``SENTINEL`` padded), then one word
packing the source's (max logit, sum of exp(logit - max)) as two float32 bit patterns.

Selecting the top ``K`` of every ``CHUNK``-wide slice and merging those would run the costly
selection network over the whole vocabulary. Instead rows are cut into groups of ``CHUNK / KP``
consecutive entries and only the best ``KP`` groups are opened: if an entry is among the ``K``
best keys, fewer than ``K`` keys beat it, so fewer than ``K`` other groups have a larger
maximum, and its group is among the ``K`` groups with the largest maxima.

1. ``_group_max_kernel`` turns each ``CHUNK``-wide slice of a row into one source record: its
   ``KP`` group maxima (pairwise maxima, no selection) sorted, and the slice's stats.
2. ``_merge_topk_kernel`` merges groups of source records into one (top-K of the concatenated
   keys, log-sum-exp combination of the stats), repeated until one record per row remains: the
   row's best ``KP`` groups and its stats.
3. ``_expand_groups_kernel`` loads the entries of those groups, a few groups per program, and
   selects each program's top-K keys (part 0 passes the row's stats on).
4. ``_merge_topk_kernel`` merges the parts; the final round decodes keys into (log-prob, token).

Selection is a bitonic top-K network (sort runs of ``KP`` keys, then repeatedly keep the
element-wise max of run pairs and re-merge), built from gather/maximum/minimum/where only (no
reductions: see :func:`_compare_exchange`): it needs far fewer stages than a full sort, and
``tl.sort`` is unusably slow under TRITON_INTERPRET. Merges skip the run-sorting phase because
source records are already sorted.

Tensor parallelism: each rank runs steps 1-4 on its vocab shard, stopping at one record per
row (:func:`local_topk_payload`); the ``[bs, L, KP + 1]`` int64 payload is all-gathered in
one collective, and :func:`merge_topk_payloads` merges the ``R`` rank records. Every rank
merges the same gathered bytes with the same kernel, so every rank gets bit-identical
log-probs and tokens, hence the same tree. Token selection never depends on the sharding;
log-probs differ from the unsharded path only by float rounding of the log-sum-exp.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import triton
import triton.language as tl

# Smallest int64: sorts after every real key (even one for a -inf logit).
SENTINEL = tl.constexpr(-(2**63))
# Upper bound on one row's vocabulary ids: the key keeps ``2**31 - 1 - id`` in 31 bits.
MAX_VOCAB = 2**31 - 1
# Vocab entries per first-stage program, keys per merge program, and (at least) keys per
# program of the group expansion.
_CHUNK = 4096
_MERGE_KEYS = 4096
_EXPAND_KEYS = 1024


@triton.jit
def float_to_ordered(x):
    """Map float32 to int32 so that integer order equals float order (-0.0 < +0.0)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def ordered_to_float(o):
    """Inverse of :func:`float_to_ordered` (the bit flip is an involution)."""
    bits = tl.where(o >= 0, o, o ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _pack_logit_key(x, token_id):
    return (float_to_ordered(x).to(tl.int64) << 32) | (2147483647 - token_id).to(tl.int64)


@triton.jit
def _pack_stats(row_max, sum_exp):
    hi = row_max.to(tl.int32, bitcast=True).to(tl.int64) << 32
    return hi | (sum_exp.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def _unpack_stats(word):
    row_max = (word >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    sum_exp = (word & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    return row_max, sum_exp


@triton.jit
def _compare_exchange(x, J: tl.constexpr, LOG_BLOCK: tl.constexpr, N: tl.constexpr):
    """One bitonic step on keys ``2**J`` apart; blocks of ``2**LOG_BLOCK`` keys are ordered
    descending (even blocks) or ascending (odd blocks).

    The partner key is fetched with ``tl.gather`` on purpose. Splitting a
    ``[N >> (J + 1), 2, 2**J]`` view with ``tl.sum(tl.where(side == 0, pairs, 0), 1)`` instead
    is a reduction over the size-2 axis, which Triton 3.6 miscompiles for the layout it picks in
    the 64-record merge at K = 64 (4096 keys, 8 warps; size-2 axis across warps, one lane bit
    replicated): two warps store different partials to the same shared-memory word, so the
    result depends on which store lands last, and token ids outside the vocabulary came out.
    (``tl.split``/``tl.join`` avoid the reduction too, but take minutes to compile for K <= 2.)
    """
    i = tl.arange(0, N)
    partner = tl.gather(x, i ^ (1 << J), 0)
    descending = ((i >> LOG_BLOCK) & 1) == 0
    first = ((i >> J) & 1) == 0
    return tl.where(first == descending, tl.maximum(x, partner), tl.minimum(x, partner))


@triton.jit
def _bitonic_merge(x, LOG_BLOCK: tl.constexpr, N: tl.constexpr):
    """Sort each bitonic block of ``2**LOG_BLOCK`` keys: even blocks descending, odd ascending."""
    for t in tl.static_range(LOG_BLOCK):
        x = _compare_exchange(x, LOG_BLOCK - 1 - t, LOG_BLOCK, N)
    return x


@triton.jit
def _max_of_run_pairs(x, LOG_K: tl.constexpr, SIZE: tl.constexpr):
    """Element-wise max of runs ``2i`` and ``2i + 1`` (``2**LOG_K`` keys each); ``SIZE`` keys out."""
    o = tl.arange(0, SIZE)
    first = ((o >> LOG_K) << (LOG_K + 1)) | (o & ((1 << LOG_K) - 1))
    return tl.maximum(tl.gather(x, first, 0), tl.gather(x, first + (1 << LOG_K), 0))


@triton.jit
def _top_of_sorted_runs(x, LOG_N: tl.constexpr, LOG_K: tl.constexpr):
    """Largest ``2**LOG_K`` of ``2**LOG_N`` keys laid out as runs of ``2**LOG_K`` sorted
    alternately descending / ascending; returned sorted descending.

    The element-wise max of a descending and an ascending run holds the top half of their
    union as a bitonic sequence, which one merge sorts again.
    """
    for level in tl.static_range(LOG_N - LOG_K):
        x = _max_of_run_pairs(x, LOG_K, 1 << (LOG_N - level - 1))
        x = _bitonic_merge(x, LOG_K, 1 << (LOG_N - level - 1))
    return x


@triton.jit
def _topk_desc(x, LOG_N: tl.constexpr, LOG_K: tl.constexpr):
    """Largest ``2**LOG_K`` of ``2**LOG_N`` keys, sorted descending."""
    for stage in tl.static_range(1, LOG_K + 1):
        x = _bitonic_merge(x, stage, 1 << LOG_N)
    return _top_of_sorted_runs(x, LOG_N, LOG_K)


@triton.jit
def _group_max_kernel(
    logits_ptr,
    payload_ptr,
    depth,
    vocab,
    vocab_offset,
    stride_b,
    stride_l,
    num_chunks,
    CHUNK: tl.constexpr,
    LOG_CHUNK: tl.constexpr,
    KP: tl.constexpr,
    LOG_KP: tl.constexpr,
):
    """One source record per ``CHUNK``-wide slice of a row: the maxima of its ``KP`` groups of
    ``CHUNK / KP`` consecutive entries, sorted descending, and the slice's log-sum-exp stats."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    in_vocab = cols < vocab
    row_ptr = logits_ptr + (row // depth).to(tl.int64) * stride_b + (row % depth) * stride_l
    x = tl.load(row_ptr + cols, mask=in_vocab, other=float("-inf")).to(tl.float32)
    # -0.0 and +0.0 are equal logits and must tie (lower id first), so give them one key.
    x = tl.where(x == 0.0, 0.0, x)
    keys = tl.where(in_vocab, _pack_logit_key(x, vocab_offset + cols), SENTINEL)
    for level in tl.static_range(LOG_CHUNK - LOG_KP):
        keys = _max_of_run_pairs(keys, 0, CHUNK >> (level + 1))
    keys = _topk_desc(keys, LOG_KP, LOG_KP)

    row_max = tl.max(x, 0)
    sum_exp = tl.sum(tl.where(x > float("-inf"), tl.exp(x - row_max), 0.0), 0)

    out = payload_ptr + (row.to(tl.int64) * num_chunks + chunk) * (KP + 1)
    tl.store(out + tl.arange(0, KP), keys)
    tl.store(out + KP, _pack_stats(row_max, sum_exp))


@triton.jit
def _expand_groups_kernel(
    logits_ptr,
    groups_ptr,
    payload_ptr,
    depth,
    vocab,
    vocab_offset,
    stride_b,
    stride_l,
    num_parts,
    GROUP: tl.constexpr,
    LOG_GROUP: tl.constexpr,
    KP: tl.constexpr,
    LOG_KP: tl.constexpr,
    PART: tl.constexpr,
    LOG_PART: tl.constexpr,
):
    """Top-``KP`` keys of ``PART`` of a row's best ``KP`` groups (by group maximum), one record
    per part. Part 0 carries the row's stats; the others carry an empty (-inf, 0) stats word,
    which the log-sum-exp combination of the merge adds exactly (as 0)."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    record = groups_ptr + row.to(tl.int64) * (KP + 1)
    group_keys = tl.load(record + part * PART + tl.arange(0, PART))
    live = group_keys != SENTINEL
    first_col = (2147483647 - (group_keys & 0xFFFFFFFF)).to(tl.int32) - vocab_offset
    group_start = (first_col >> LOG_GROUP) << LOG_GROUP
    cols = group_start[:, None] + tl.arange(0, GROUP)[None, :]
    valid = live[:, None] & (cols < vocab)
    row_ptr = logits_ptr + (row // depth).to(tl.int64) * stride_b + (row % depth) * stride_l
    x = tl.load(row_ptr + cols, mask=valid, other=float("-inf")).to(tl.float32)
    x = tl.where(x == 0.0, 0.0, x)
    keys = tl.where(valid, _pack_logit_key(x, vocab_offset + cols), SENTINEL)
    keys = _topk_desc(tl.reshape(keys, [PART * GROUP], can_reorder=True), LOG_PART + LOG_GROUP, LOG_KP)

    row_max, sum_exp = _unpack_stats(tl.load(record + KP))
    stats = _pack_stats(tl.where(part == 0, row_max, float("-inf")), tl.where(part == 0, sum_exp, 0.0))
    out = payload_ptr + (row.to(tl.int64) * num_parts + part) * (KP + 1)
    tl.store(out + tl.arange(0, KP), keys)
    tl.store(out + KP, stats)


@triton.jit
def _merge_topk_kernel(
    src_ptr,
    dst_ptr,
    logprob_ptr,
    token_ptr,
    num_sources,
    num_out,
    src_stride_row,
    src_stride_source,
    k,
    G: tl.constexpr,
    LOG_G: tl.constexpr,
    KP: tl.constexpr,
    LOG_KP: tl.constexpr,
    FINAL: tl.constexpr,
):
    row = tl.program_id(0)
    group = tl.program_id(1)
    sources = group * G + tl.arange(0, G)
    live = sources < num_sources
    base = src_ptr + row.to(tl.int64) * src_stride_row + sources.to(tl.int64) * src_stride_source

    # Records are sorted descending; reading odd ones backwards gives alternating runs.
    ranks = tl.arange(0, KP)[None, :]
    odd = (tl.arange(0, G) & 1)[:, None] == 1
    ranks = tl.where(odd, KP - 1 - ranks, ranks)
    keys = tl.load(base[:, None] + ranks, mask=live[:, None], other=SENTINEL)
    keys = _top_of_sorted_runs(tl.reshape(keys, [G * KP]), LOG_G + LOG_KP, LOG_KP)

    # Log-sum-exp of the group from each source's (max, sum exp(x - max)); the reduction
    # order is fixed by the kernel, so equal inputs give bit-equal outputs on every rank.
    row_max, sum_exp = _unpack_stats(tl.load(base + KP, mask=live, other=0))
    row_max = tl.where(live, row_max, float("-inf"))
    group_max = tl.max(row_max, 0)
    scaled = tl.where(row_max > float("-inf"), sum_exp * tl.exp(row_max - group_max), 0.0)
    group_sum = tl.sum(scaled, 0)

    offs = tl.arange(0, KP)
    if FINAL:
        logit = ordered_to_float((keys >> 32).to(tl.int32))
        token = 2147483647 - (keys & 0xFFFFFFFF)
        log_z = group_max + tl.log(group_sum)
        out = row.to(tl.int64) * k + offs
        tl.store(logprob_ptr + out, logit - log_z, mask=offs < k)
        tl.store(token_ptr + out, token, mask=offs < k)
    else:
        out = dst_ptr + (row.to(tl.int64) * num_out + group) * (KP + 1)
        tl.store(out + offs, keys)
        tl.store(out + KP, _pack_stats(group_max, group_sum))


def _log2(power_of_two: int) -> int:
    return power_of_two.bit_length() - 1


def _padded_k(k: int) -> int:
    return triton.next_power_of_2(k)


def _chunk_size(vocab: int, kp: int) -> int:
    return max(kp, min(_CHUNK, triton.next_power_of_2(vocab)))


def _merge_group(kp: int) -> int:
    return max(2, _MERGE_KEYS // kp)


def _merge_plan(num_sources: int, kp: int) -> List[int]:
    """Number of records per row after each merge round; the last entry is 1."""
    plan, remaining = [], num_sources
    while True:
        remaining = triton.cdiv(remaining, _merge_group(kp))
        plan.append(remaining)
        if remaining == 1:
            return plan


def _num_warps(elements: int) -> int:
    return max(1, min(8, elements // 512))


def _expand_part(chunk: int, kp: int) -> int:
    """Groups expanded per program: ``max(_EXPAND_KEYS, kp)`` keys' worth, between 1 and ``kp``."""
    return max(1, min(kp, max(_EXPAND_KEYS, kp) // (chunk // kp)))


def _scratch_counts(vocab: int, k: int, num_sources: Optional[int]) -> List[int]:
    """Records per row held in scratch. Without ``num_sources`` (a vocabulary to select from):
    the chunk records, every round merging them (the last one leaves the best groups), the
    expanded parts and every round merging those but the last, which writes the caller's
    tensors. With ``num_sources`` (gathered payloads): every merge round but the last."""
    kp = _padded_k(k)
    if num_sources is None:
        chunk = _chunk_size(vocab, kp)
        num_chunks = triton.cdiv(vocab, chunk)
        parts = kp // _expand_part(chunk, kp)
        return [num_chunks] + _merge_plan(num_chunks, kp) + [parts] + _merge_plan(parts, kp)[:-1]
    return _merge_plan(num_sources, kp)[:-1]


def topk_workspace_numel(rows: int, vocab: int, k: int, num_sources: Optional[int] = None) -> int:
    """int64 scratch words needed by one top-K call on ``rows`` rows.

    ``num_sources=None`` sizes it for :func:`topk_logprobs` / :func:`local_topk_payload` over
    ``vocab`` entries; an integer sizes it for :func:`merge_topk_payloads` over that many
    gathered payloads (``vocab`` is then ignored).
    """
    return rows * (_padded_k(k) + 1) * sum(_scratch_counts(vocab, k, num_sources))


def _scratch_regions(
    workspace: Optional[torch.Tensor], rows: int, vocab: int, k: int, num_sources: Optional[int], device
) -> List[torch.Tensor]:
    """One region of ``rows * count * (KP + 1)`` words per entry of :func:`_scratch_counts`."""
    numel = topk_workspace_numel(rows, vocab, k, num_sources)
    if workspace is None:
        workspace = torch.empty(numel, dtype=torch.int64, device=device)
    assert workspace.dtype == torch.int64 and workspace.numel() >= numel, "top-K workspace too small"
    regions, offset = [], 0
    for count in _scratch_counts(vocab, k, num_sources):
        size = rows * count * (_padded_k(k) + 1)
        regions.append(workspace[offset : offset + size])
        offset += size
    return regions


def _run_merges(
    src: torch.Tensor,
    src_stride_row: int,
    src_stride_source: int,
    num_sources: int,
    rows: int,
    k: int,
    scratch: List[torch.Tensor],
    final_payload: Optional[torch.Tensor] = None,
    final_logprobs: Optional[torch.Tensor] = None,
    final_tokens: Optional[torch.Tensor] = None,
) -> None:
    """Merge rounds until one record per row. Round ``r`` writes ``scratch[r]``; the last round
    writes ``final_payload`` if given, else decodes into ``final_logprobs``/``final_tokens``."""
    kp = _padded_k(k)
    plan = _merge_plan(num_sources, kp)
    for step, num_out in enumerate(plan):
        last = step == len(plan) - 1
        decode = last and final_payload is None
        dst = (final_payload if last else scratch[step]) if not decode else src
        group = min(_merge_group(kp), triton.next_power_of_2(num_sources))
        _merge_topk_kernel[(rows, num_out)](
            src,
            dst,
            final_logprobs if decode else src,  # unused pointers get a placeholder
            final_tokens if decode else src,
            num_sources,
            num_out,
            src_stride_row,
            src_stride_source,
            k,
            G=group,
            LOG_G=_log2(group),
            KP=kp,
            LOG_KP=_log2(kp),
            FINAL=decode,
            num_warps=_num_warps(group * kp),
        )
        src, num_sources = dst, num_out
        src_stride_row, src_stride_source = num_out * (kp + 1), kp + 1


def _select_topk(
    logits: torch.Tensor, k: int, vocab_offset: int, workspace: Optional[torch.Tensor], **final
) -> None:
    """Steps 1-4 of the module docstring on ``logits [bs, L, V]`` (ids ``vocab_offset + j``);
    the last merge writes ``final`` (the keyword arguments ``final_*`` of :func:`_run_merges`)."""
    bs, depth, vocab = logits.shape
    assert logits.stride(-1) == 1, "draft logits must be contiguous along the vocabulary"
    assert k >= 1 and vocab_offset + vocab <= MAX_VOCAB
    rows, kp = bs * depth, _padded_k(k)
    chunk = _chunk_size(vocab, kp)
    num_chunks = triton.cdiv(vocab, chunk)
    group, part = chunk // kp, _expand_part(chunk, kp)
    parts = kp // part
    regions = _scratch_regions(workspace, rows, vocab, k, None, logits.device)
    rounds = len(_merge_plan(num_chunks, kp))
    chunk_records, best_groups, expanded = regions[0], regions[rounds], regions[rounds + 1]
    strides = (logits.stride(0), logits.stride(1))
    _group_max_kernel[(rows, num_chunks)](
        logits, chunk_records, depth, vocab, vocab_offset, *strides, num_chunks,
        CHUNK=chunk, LOG_CHUNK=_log2(chunk), KP=kp, LOG_KP=_log2(kp),
        num_warps=_num_warps(chunk),
    )
    _run_merges(
        chunk_records, num_chunks * (kp + 1), kp + 1, num_chunks, rows, k, regions[1:rounds],
        final_payload=best_groups,
    )
    _expand_groups_kernel[(rows, parts)](
        logits, best_groups, expanded, depth, vocab, vocab_offset, *strides, parts,
        GROUP=group, LOG_GROUP=_log2(group), KP=kp, LOG_KP=_log2(kp), PART=part, LOG_PART=_log2(part),
        num_warps=_num_warps(part * group),
    )
    _run_merges(expanded, parts * (kp + 1), kp + 1, parts, rows, k, regions[rounds + 2 :], **final)


def topk_logprobs(
    logits: torch.Tensor,
    k: int,
    *,
    out_logprobs: Optional[torch.Tensor] = None,
    out_tokens: Optional[torch.Tensor] = None,
    workspace: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` log-probs (float32) and token ids (int64), ``[bs, L, k]``, of ``logits [bs, L, V]``.

    Pass ``out_*`` and a ``workspace`` of :func:`topk_workspace_numel` int64 words to make the
    call allocation-free (CUDA-graph capturable). No host synchronisation either way.
    """
    bs, depth, _ = logits.shape
    if out_logprobs is None:
        out_logprobs = torch.empty((bs, depth, k), dtype=torch.float32, device=logits.device)
    if out_tokens is None:
        out_tokens = torch.empty((bs, depth, k), dtype=torch.int64, device=logits.device)
    assert out_logprobs.is_contiguous() and out_tokens.is_contiguous()
    assert 1 <= k <= logits.shape[-1]
    _select_topk(logits, k, 0, workspace, final_logprobs=out_logprobs, final_tokens=out_tokens)
    return out_logprobs, out_tokens


def local_topk_payload(
    logits_shard: torch.Tensor,
    k: int,
    vocab_offset: int,
    *,
    out: Optional[torch.Tensor] = None,
    workspace: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """This rank's contribution for a vocab-sharded top-``k``: ``[bs, L, next_pow2(k) + 1]`` int64.

    ``logits_shard [bs, L, V_local]`` holds global token ids ``vocab_offset + j``. All-gather
    the payloads of the TP group in rank order into ``[R, bs, L, next_pow2(k) + 1]`` and call
    :func:`merge_topk_payloads`. A shard smaller than ``k`` is padded with ``SENTINEL`` keys.
    """
    bs, depth, _ = logits_shard.shape
    kp = _padded_k(k)
    if out is None:
        out = torch.empty((bs, depth, kp + 1), dtype=torch.int64, device=logits_shard.device)
    assert out.is_contiguous() and out.shape == (bs, depth, kp + 1)
    _select_topk(logits_shard, k, vocab_offset, workspace, final_payload=out)
    return out


def merge_topk_payloads(
    gathered: torch.Tensor,
    k: int,
    *,
    out_logprobs: Optional[torch.Tensor] = None,
    out_tokens: Optional[torch.Tensor] = None,
    workspace: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Global top-``k`` from the all-gathered rank payloads ``[R, bs, L, next_pow2(k) + 1]``.

    Returns ``(logprobs [bs, L, k] float32, tokens [bs, L, k] int64)``; bit-identical on every
    rank given the same gathered tensor. ``workspace`` (:func:`topk_workspace_numel` with
    ``num_sources=R``) is empty unless ``R`` exceeds one merge group.
    """
    world, bs, depth, width = gathered.shape
    kp = _padded_k(k)
    assert width == kp + 1 and gathered.is_contiguous()
    if out_logprobs is None:
        out_logprobs = torch.empty((bs, depth, k), dtype=torch.float32, device=gathered.device)
    if out_tokens is None:
        out_tokens = torch.empty((bs, depth, k), dtype=torch.int64, device=gathered.device)
    rows = bs * depth
    scratch = _scratch_regions(workspace, rows, 0, k, world, gathered.device)
    _run_merges(
        gathered, kp + 1, rows * (kp + 1), world, rows, k, scratch,
        final_logprobs=out_logprobs, final_tokens=out_tokens,
    )
    return out_logprobs, out_tokens
