"""The recurrent section's ``n_layer`` word by layout (issue #27, item 6): the whole block count before b9544,
the trunk (block count less the MTP/NextN blocks) from b9544; the 2026-08 layout's releases wrote either."""

from __future__ import annotations

import pytest

from kvscope.core.reader.layouts import GENERATION_BY_NAME, recurrent_n_layers


@pytest.mark.parametrize(("gen", "want"), [
    ("2025-05", (3,)), ("2025-08", (3,)), ("2026-04", (3,)),
    ("2026-08", (2, 3)),  # b9479-b9543 the block count, b9544 on (and the named build) the trunk
    ("2026-10", (2,)), ("2026-10-v4", (2,)),
])
def test_an_mtp_model_by_layout(gen: str, want: tuple[int, ...]) -> None:
    assert recurrent_n_layers(GENERATION_BY_NAME[gen], 3, 1) == want


@pytest.mark.parametrize("gen", sorted(GENERATION_BY_NAME))
def test_a_model_without_mtp_counts_every_block(gen: str) -> None:
    assert recurrent_n_layers(GENERATION_BY_NAME[gen], 48, 0) == (48,)
