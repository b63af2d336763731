"""The keyword scorer's inner loops, compiled (Numba): one pass over a term's postings where NumPy takes several.

A BM25 contribution is computed in float32 in one fixed order, weight x tf x (k1 + 1) / (tf + norm), and added to
a float64 sum, exactly as `retriever.store.keywords` does it in NumPy elsewhere (`every_match`): whichever way a
document's score is found, it is the same number. Numba compiles without fast-math, so nothing is reordered.
Compiled once per machine and cached beside this file (`cache=True`); `nogil` lets searches in threads run at once.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def add_postings(sums, touched, count, held, counts, weight, k1_plus_1, norm):
    """Add a term's contribution to SUMS at each of its postings (HELD positions, COUNTS). A position whose sum
    was 0 is appended to TOUCHED after its first COUNT entries (contributions are positive, so each position once;
    a position whose sum starts at -inf, a deleted one, never); returns the new count."""
    for i in range(held.shape[0]):
        position = held[i]
        tf = np.float32(counts[i])
        if sums[position] == 0.0:
            touched[count] = position
            count += 1
        sums[position] += np.float64(weight * tf * k1_plus_1 / (tf + norm[position]))
    return count


@njit(cache=True, nogil=True)
def in_reach(positions, sums, minimum):
    """Those of POSITIONS whose SUMS reach MINIMUM, and their sums (the order kept)."""
    kept = 0
    for i in range(positions.shape[0]):
        if sums[positions[i]] >= minimum:
            kept += 1
    chosen = np.empty(kept, np.int32)
    values = np.empty(kept, np.float64)
    kept = 0
    for i in range(positions.shape[0]):
        value = sums[positions[i]]
        if value >= minimum:
            chosen[kept] = positions[i]
            values[kept] = value
            kept += 1
    return chosen, values


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
def add_counted(total, positions, dense_counts, weight, k1_plus_1, norm):
    """The same from a term's count at every position (DENSE_COUNTS, 0 where absent)."""
    for i in range(positions.shape[0]):
        position = positions[i]
        count = dense_counts[position]
        if count > 0:
            tf = np.float32(count)
            total[i] += np.float64(weight * tf * k1_plus_1 / (tf + norm[position]))
