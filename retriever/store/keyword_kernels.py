"""The keyword scorer's inner loops, compiled (Numba): a query's best documents found document at a time by
MaxScore, and given documents' scores looked up, each a loop over postings where NumPy would take several passes.

A BM25 contribution is computed in float32 in one fixed order, weight x tf x (k1 + 1) / (tf + norm), and added to
a float64 sum in the query's term order, exactly as `retriever.store.keywords` does it in NumPy (`every_match`):
whichever way a document's score is found, it is the same number. Numba compiles without fast-math, so nothing is
reordered.
Compiled once per machine and cached beside this file (`cache=True`); `nogil` lets searches in threads run at once.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def add_looked_up(total, positions, held, counts, weight, k1_plus_1, norm):
    """Add a term's contribution to TOTAL[i] for each POSITIONS[i] that its postings (HELD, ascending) hold. Each
    position is searched for from where the previous one was found when they ascend (galloping: sorted positions
    cost about one pass over the shorter list), from the start otherwise."""
    length = held.shape[0]
    low = 0
    previous = -1
    for i in range(positions.shape[0]):
        position = positions[i]
        if position < previous:
            low = 0
        previous = position
        if low < length and held[low] < position:  # gallop from the last find to a bound, then bisect below it
            jump = 1
            while low + jump < length and held[low + jump] < position:
                jump *= 2
            high = min(low + jump, length)
            low += jump // 2 + 1
            while low < high:
                middle = (low + high) >> 1
                if held[middle] < position:
                    low = middle + 1
                else:
                    high = middle
        if low < length and held[low] == position:
            tf = np.float32(counts[low])
            total[i] += np.float64(weight * tf * k1_plus_1 / (tf + norm[position]))


@njit(cache=True, nogil=True)
def _gallop(held, low, end, position):
    """The first index in HELD[LOW:END] (ascending) whose value is at least POSITION (END if none)."""
    if low >= end or held[low] >= position:
        return low
    jump = 1
    while low + jump < end and held[low + jump] < position:
        jump *= 2
    high = min(low + jump, end)
    low += jump // 2 + 1
    while low < high:
        middle = (low + high) >> 1
        if held[middle] < position:
            low = middle + 1
        else:
            high = middle
    return low


@njit(cache=True, nogil=True)
def max_score(positions, counts, starts, ends, weights, ceilings, canonical, k1_plus_1, norm, dead, count, floor):
    """The COUNT best documents of one segment, document at a time by MaxScore (Turtle and Flood 1995): (positions,
    exact float32 scores), the best first in no particular order.

    The query's terms are given by ascending CEILINGS (an upper bound of what each adds to a document): term i's
    postings are POSITIONS[STARTS[i]:ENDS[i]] (ascending) with COUNTS, its BM25 weight WEIGHTS[i], and its place in
    the query's term order CANONICAL[i] (a document's exact score adds the contributions in that order, float32
    each into a float64 sum, so it equals `QueryMatches.scores`). The terms whose ceilings add up to less than the
    threshold (FLOOR, or the COUNT-th best score found so far) cannot lift a document to it on their own: only the
    other terms' postings are walked, and the low-ceiling terms are looked up, highest ceiling first, while the
    document can still reach the threshold. DEAD: deleted positions, ascending. Documents are ordered by score,
    then lower position: one holding an equal score later does not displace one found before."""
    terms = len(starts)
    cumulative = np.empty(terms, np.float64)
    total = 0.0
    for i in range(terms):
        total += ceilings[i]
        cumulative[i] = total
    heads = starts.copy()
    contribution = np.zeros(terms, np.float32)
    best_positions = np.empty(count, np.int32)
    best_scores = np.empty(count, np.float32)
    held = 0
    worst = 0  # the index in best_* of the lowest score (the latest found among equals)
    threshold = floor
    margin = abs(threshold) * 2.5e-7 + 1e-30  # more than float rounding can move a sum (two float32 steps)
    essential = 0  # terms below this index are looked up only
    while essential < terms and cumulative[essential] < threshold - margin:
        essential += 1
    dead_at = 0
    past = np.iinfo(np.int32).max  # past every position
    document = past
    for i in range(essential, terms):
        if heads[i] < ends[i] and positions[heads[i]] < document:
            document = positions[heads[i]]
    while document != past:
        # The essential terms' contributions to DOCUMENT, and the next document any of them holds, in one pass.
        partial = 0.0
        following = past
        for i in range(essential, terms):
            at = heads[i]
            if at < ends[i]:
                position = positions[at]
                if position == document:
                    tf = np.float32(counts[at])
                    contribution[canonical[i]] = weights[i] * tf * k1_plus_1 / (tf + norm[document])
                    partial += contribution[canonical[i]]
                    at += 1
                    heads[i] = at
                    position = positions[at] if at < ends[i] else past
                if position < following:
                    following = position
        while dead_at < dead.shape[0] and dead[dead_at] < document:
            dead_at += 1
        reach = dead_at >= dead.shape[0] or dead[dead_at] != document
        i = essential - 1
        while reach and i >= 0:
            if partial + cumulative[i] < threshold - margin:
                reach = False
                break
            at = _gallop(positions, heads[i], ends[i], document)
            heads[i] = at
            if at < ends[i] and positions[at] == document:
                tf = np.float32(counts[at])
                contribution[canonical[i]] = weights[i] * tf * k1_plus_1 / (tf + norm[document])
                partial += contribution[canonical[i]]
            i -= 1
        if reach and partial >= threshold - margin:
            exact = 0.0
            for j in range(terms):
                exact += np.float64(contribution[j])
            score = np.float32(exact)
            if held < count:
                best_positions[held] = document
                best_scores[held] = score
                held += 1
                if held == count:
                    worst = _worst(best_scores, best_positions, held)
            elif score > best_scores[worst]:
                best_positions[worst] = document
                best_scores[worst] = score
                worst = _worst(best_scores, best_positions, held)
            if held == count and best_scores[worst] > threshold:
                threshold = np.float64(best_scores[worst])
                margin = abs(threshold) * 2.5e-7 + 1e-30
                while essential < terms and cumulative[essential] < threshold - margin:
                    essential += 1
        for j in range(terms):
            contribution[j] = 0.0
        document = following
    return best_positions[:held].copy(), best_scores[:held].copy()


@njit(cache=True, nogil=True)
def _worst(scores, positions, held):
    """The index of the lowest score among the first HELD, the highest position among equals."""
    worst = 0
    for i in range(1, held):
        if scores[i] < scores[worst] or (scores[i] == scores[worst] and positions[i] > positions[worst]):
            worst = i
    return worst
