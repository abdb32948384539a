"""The shape policy's ladder of sizes, shared by the grid and the batched stitcher fits (no imports)."""


def bucket(k: int) -> int:
    """The smallest size of the ladder 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (``2^m`` and ``3 * 2^m``) >= ``k``.

    Widths and counts are padded up to it (at most 1.5x), so that calls whose sizes fall
    in the same buckets share their compiled programs.

    Examples:
      >>> [bucket(k) for k in (1, 4, 5, 7, 9, 13, 200)]
      [1, 4, 6, 8, 12, 16, 256]
    """
    if k <= 4:
        return k
    p = 1 << (k - 1).bit_length()
    return p * 3 // 4 if p * 3 // 4 >= k else p
