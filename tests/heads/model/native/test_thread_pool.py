"""Releasing a thread's OpenMP workers (heads/model/native/thread_pool.cpp): it succeeds on a
thread outside any parallel region, and parallel products after it start their workers again
and give the same bits, on the releasing thread and on another."""

from __future__ import annotations

import threading

import torch

from kernels.int_groups import GROUP, IntGroups


def test_products_after_a_release_are_unchanged(ops) -> None:
    q = torch.randint(-16, 16, (4099, 640), dtype=torch.int8, generator=torch.Generator()
                      .manual_seed(0))
    g = IntGroups.pack(q, torch.rand(4099, 640 // GROUP).half(), bits=5)
    x = torch.randn(2, 640)
    product = g.product()
    before = product(x)
    assert ops.release_thread_pool() == 0
    torch.testing.assert_close(product(x), before, rtol=0, atol=0)
    seen: list[torch.Tensor] = []

    def other() -> None:
        seen.append(product(x))
        seen.append(torch.tensor(ops.release_thread_pool()))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    torch.testing.assert_close(seen[0], before, rtol=0, atol=0)
    assert int(seen[1]) == 0
