"""The keyword scorer's inner loops, compiled (Numba): a query's best documents found by MaxScore, and given
documents' scores looked up, each a loop over postings where NumPy would take several passes over arrays.

A BM25 contribution is computed in float32 in one fixed order, weight x tf x (k1 + 1) / (tf + norm), and added to
a float64 sum in the query's term order, exactly as `retriever.store.keywords` does it in NumPy (`every_match`):
whichever way a document's score is found, it is the same number. Numba compiles without fast-math, so nothing is
reordered. Compiled once per machine and cached beside this file (or in the user's cache folder); where neither can
be written (a read-only install), compiled once per process instead. `nogil` lets searches in threads run at once.
"""

from __future__ import annotations

import numpy as np
from numba import njit


def _compiled(function):
    try:
        return njit(cache=True, nogil=True)(function)
    except RuntimeError:  # numba found no folder it may write its cache to
        return njit(nogil=True)(function)


@_compiled
def _bm25(weight, count, k1_plus_1, norm):
    """What a term of WEIGHT occurring COUNT times adds to a document of length normalisation NORM, in float32."""
    tf = np.float32(count)
    return weight * tf * k1_plus_1 / (tf + norm)


@_compiled
def scores_at(positions, counts, starts, ends, weights, k1_plus_1, norm, wanted):
    """The exact scores (float64, before the float32 rounding) of the documents at WANTED (ascending): each term's
    contribution, where its postings (POSITIONS[STARTS[i]:ENDS[i]], with COUNTS, weight WEIGHTS[i]) hold the
    document, added in the terms' order. Each term's postings are searched from its last find on (galloping: the
    wanted documents cost about one pass over the shorter list)."""
    total = np.zeros(wanted.shape[0], np.float64)
    for i in range(starts.shape[0]):
        low = starts[i]
        end = ends[i]
        weight = weights[i]
        for j in range(wanted.shape[0]):
            position = wanted[j]
            low = _gallop(positions, low, end, position)
            if low >= end:
                break
            if positions[low] == position:
                total[j] += _bm25(weight, counts[low], k1_plus_1, norm[position])
    return total


@_compiled
def best_in_runs(positions, counts, starts, ends, weights, k1_plus_1, norm, lows, highs):
    """For each run of units LOWS[r]..HIGHS[r], its best unit's exact float32 score (`scores_at`) and that unit (the
    first reaching it; 0 and -1 where no unit of the run holds a term). The runs must be disjoint and in ascending
    order (`scores_at` reads each term's postings once, forward: runs out of order would be scored wrong)."""
    units = 0
    for r in range(lows.shape[0]):
        units += highs[r] - lows[r]
    wanted = np.empty(units, np.int32)
    at = 0
    for r in range(lows.shape[0]):
        for unit in range(lows[r], highs[r]):
            wanted[at] = unit
            at += 1
    total = scores_at(positions, counts, starts, ends, weights, k1_plus_1, norm, wanted)
    best = np.zeros(lows.shape[0], np.float32)
    best_units = np.full(lows.shape[0], -1, np.int64)
    at = 0
    for r in range(lows.shape[0]):
        for unit in range(lows[r], highs[r]):
            score = np.float32(total[at])
            if score > best[r]:
                best[r] = score
                best_units[r] = unit
            at += 1
    return best, best_units


@_compiled
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


@_compiled
def _worst(scores, positions, held):
    """The index of the lowest score among the first HELD, the highest position among equals."""
    worst = 0
    for i in range(1, held):
        if scores[i] < scores[worst] or (scores[i] == scores[worst] and positions[i] > positions[worst]):
            worst = i
    return worst


WINDOW = 1 << 16  # documents summed at a time: their partial scores (512 KB) stay in the core's cache
FIRST_WINDOW = 1 << 12  # then doubling: until COUNT documents are held, every document there is scored exactly
_DE_BRUIJN_MULTIPLIER = 0x03F79D71B4CA8B09  # a de Bruijn sequence: each power of two's top 6 bits after it differ
_DE_BRUIJN = np.zeros(64, np.int64)
for _bit in range(64):
    _DE_BRUIJN[((1 << _bit) * _DE_BRUIJN_MULTIPLIER % 2**64) >> 58] = _bit


@_compiled
def _lowest_bit(word):
    """The index of WORD's lowest set bit (WORD != 0)."""
    low = word & (~word + np.uint64(1))
    return _DE_BRUIJN[(low * np.uint64(_DE_BRUIJN_MULTIPLIER)) >> np.uint64(58)]


@_compiled
def max_score(positions, counts, starts, ends, weights, ceilings, canonical, k1_plus_1, norm, dead, count, floor,
              first, last):
    """The COUNT best documents at positions FIRST to LAST (excluded) of one segment by MaxScore (Turtle and Flood
    1995), a window of documents at a time as Lucene's MaxScoreBulkScorer does: (positions, exact float32 scores),
    the best first in no particular order.

    The query's terms are given by ascending CEILINGS (an upper bound of what each adds to a document): term i's
    postings are POSITIONS[STARTS[i]:ENDS[i]] (ascending) with COUNTS, its BM25 weight WEIGHTS[i], and its place in
    the query's term order CANONICAL[i] (a document's exact score adds the contributions in that order, float32
    each into a float64 sum, so it equals `QueryMatches.scores`). The terms whose ceilings add up to less than the
    threshold (FLOOR, or the COUNT-th best score found so far) cannot lift a document to it on their own. In each
    window the other terms' postings are summed into the window's partial scores, term at a time, and the window's
    documents are then taken in order: the low-ceiling terms are looked up, highest ceiling first, while the
    document can still reach the threshold, and a document that can is scored exactly. DEAD: deleted positions,
    ascending. Documents are ordered by score, then lower position: one holding an equal score later does not
    displace one found before. Slices of a segment are searched apart (on several cores) and their bests merged."""
    terms = len(starts)
    cumulative = np.empty(terms + 1, np.float64)  # cumulative[i]: the ceilings of terms below i
    cumulative[0] = 0.0
    for i in range(terms):
        cumulative[i + 1] = cumulative[i] + ceilings[i]
    heads = starts.copy()  # the walked terms' next posting; the looked-up terms' last find
    for i in range(terms):
        heads[i] = _gallop(positions, starts[i], ends[i], first)
    exact_heads = heads.copy()  # every term's last find, for the exact scores (documents ascend)
    contribution = np.zeros(terms, np.float32)
    width = max(1, min(WINDOW, last - first))
    partial = np.zeros(width, np.float64)
    marks = np.zeros((width + 63) // 64, np.uint64)
    best_positions = np.empty(count, np.int32)
    best_scores = np.empty(count, np.float32)
    held = 0
    worst = 0  # the index in best_* of the lowest score (the latest found among equals)
    threshold = floor
    margin = abs(threshold) * 2.5e-7 + 1e-30  # more than float rounding can move a sum (two float32 steps)
    essential = 0  # terms below this index are looked up only, not walked
    while essential < terms and cumulative[essential + 1] < threshold - margin:
        essential += 1
    dead_at = np.searchsorted(dead, first)
    base = first
    while base < last:
        limit = min(last, base + min(width, max(FIRST_WINDOW, base - first)))
        walked = essential  # fixed for the window: its terms' contributions are in PARTIAL
        for i in range(walked, terms):
            at = heads[i]
            end = ends[i]
            weight = weights[i]
            while at < end:
                position = positions[at]
                if position >= limit:
                    break
                offset = position - base
                partial[offset] += _bm25(weight, counts[at], k1_plus_1, norm[position])
                marks[offset >> 6] |= np.uint64(1) << np.uint64(offset & 63)
                at += 1
            heads[i] = at
        for word_at in range(marks.shape[0]):
            word = marks[word_at]
            if word == 0:
                continue
            marks[word_at] = 0
            while word != 0:
                offset = (word_at << 6) + _lowest_bit(word)
                word &= word - np.uint64(1)
                document = base + offset
                score = partial[offset]
                partial[offset] = 0.0
                while dead_at < dead.shape[0] and dead[dead_at] < document:
                    dead_at += 1
                if dead_at < dead.shape[0] and dead[dead_at] == document:
                    continue
                reach = score + cumulative[walked] >= threshold - margin
                i = walked - 1
                while reach and i >= 0:
                    at = _gallop(positions, heads[i], ends[i], document)
                    heads[i] = at
                    if at < ends[i] and positions[at] == document:
                        score += _bm25(weights[i], counts[at], k1_plus_1, norm[document])
                    reach = score + cumulative[i] >= threshold - margin
                    i -= 1
                if not reach:
                    continue
                for i in range(terms):
                    at = _gallop(positions, exact_heads[i], ends[i], document)
                    exact_heads[i] = at
                    contribution[canonical[i]] = 0.0
                    if at < ends[i] and positions[at] == document:
                        contribution[canonical[i]] = _bm25(weights[i], counts[at], k1_plus_1, norm[document])
                exact = 0.0
                for j in range(terms):
                    exact += np.float64(contribution[j])
                found = np.float32(exact)
                if held < count:
                    best_positions[held] = document
                    best_scores[held] = found
                    held += 1
                    if held == count:
                        worst = _worst(best_scores, best_positions, held)
                elif found > best_scores[worst]:
                    best_positions[worst] = document
                    best_scores[worst] = found
                    worst = _worst(best_scores, best_positions, held)
                if held == count and best_scores[worst] > threshold:
                    threshold = np.float64(best_scores[worst])
                    margin = abs(threshold) * 2.5e-7 + 1e-30
                    while essential < terms and cumulative[essential + 1] < threshold - margin:
                        essential += 1
        base = limit
    return best_positions[:held].copy(), best_scores[:held].copy()
